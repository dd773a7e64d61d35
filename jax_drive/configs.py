"""Frozen-dataclass configurations as data: dotted overrides and a dict round trip.

Presets are frozen dataclasses nested in each other (a preset holds an ``SFTConfig`` that
holds an ``OptimConfig``...). Any field can be changed from the command line by its dotted
path, ``--set rl.optim.learning_rate=5e-5``, or from a preset file (a JSON object of such
paths, or nested objects), instead of one flag per field:

    override(preset, {"rl.optim.learning_rate": "5e-5", "sft.max_steps": "96"})

Values given as text are read by the type of the field they replace (int, float, bool,
str, None, tuples of those); each changed dataclass is rebuilt with ``dataclasses.replace``,
so its own ``__post_init__`` checks the new value. :func:`from_dict` rebuilds a config from
``dataclasses.asdict`` output (e.g. a run's recorded preset). :func:`at_least` and
:func:`above` are the bound checks configs' ``__post_init__`` share, :func:`one_of` the
choice check (one message format each).

Only the standard library is imported, so any layer may use this module.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any


class OverrideError(ValueError):
    """An override names no field, or its value does not fit the field."""


def at_least(config: Any, bound: float, *names: str, error: type[Exception] = ValueError) -> None:
    """Raises ``error("a, b and c must be >= bound")`` unless every named field of ``config``
    is >= ``bound`` (NaN fails)."""
    _check_bound(config, names, ">=", bound, error)


def above(config: Any, bound: float, *names: str, error: type[Exception] = ValueError) -> None:
    """Raises ``error("a and b must be > bound")`` unless every named field of ``config`` is
    > ``bound`` (NaN fails)."""
    _check_bound(config, names, ">", bound, error)


def one_of(name: str, value: Any, allowed: Any, error: type[Exception] = ValueError) -> None:
    """Raises ``error("name must be one of allowed, got 'value'")`` unless ``value in allowed``
    (``allowed`` is shown as given: pass it sorted where order should not matter)."""
    if value not in allowed:
        raise error(f"{name} must be one of {allowed}, got {value!r}")


def _check_bound(config: Any, names: tuple[str, ...], op: str, bound: float, error: type[Exception]) -> None:
    holds = (lambda v: v >= bound) if op == ">=" else (lambda v: v > bound)
    if not all(holds(getattr(config, name)) for name in names):
        listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        raise error(f"{listed} must be {op} {bound}")


def parse_assignments(items: Iterable[str]) -> dict[str, str]:
    """``["a.b=1", "c=x"]`` -> ``{"a.b": "1", "c": "x"}`` (OverrideError for an item without '=')."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise OverrideError(f"{item!r} is not KEY=VALUE (e.g. rl.optim.learning_rate=5e-5)")
        out[key.strip()] = value.strip()
    return out


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> dotted keys: ``{"rl": {"steps": 3}}`` -> ``{"rl.steps": 3}``."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def load_overrides(path: str) -> dict[str, Any]:
    """A preset file: a JSON object of dotted paths or nested objects -> dotted overrides."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise OverrideError(f"{path}: a preset file holds a JSON object of field paths, got {type(data).__name__}")
    return flatten(data)


def field_paths(config: Any, prefix: str = "") -> list[str]:
    """Every dotted path an override can name in ``config`` (dataclass fields, recursively)."""
    paths = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        paths.append(prefix + f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            paths += field_paths(value, f"{prefix}{f.name}.")
    return paths


def override(config: Any, changes: Mapping[str, Any]) -> Any:
    """``config`` with every dotted path in ``changes`` set (text values parsed by field type).

    Raises:
      OverrideError naming the path for an unknown field, a value that does not parse, or a
      value the config's own checks refuse.
    """
    for path, value in changes.items():
        try:
            config = _set(config, path.split("."), value)
        except OverrideError as error:
            raise OverrideError(f"{path}={_show(value)}: {error}") from None
        except (TypeError, ValueError) as error:  # the dataclass's own checks
            raise OverrideError(f"{path}={_show(value)}: {error}") from None
    return config


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _set(config: Any, path: list[str], value: Any) -> Any:
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise OverrideError(f"{type(config).__name__} has no fields")
    fields = {f.name: f for f in dataclasses.fields(config)}
    name = path[0]
    if name not in fields:
        raise OverrideError(f"unknown field {name!r} of {type(config).__name__}; fields: {', '.join(fields)}")
    current = getattr(config, name)
    if len(path) > 1:
        return dataclasses.replace(config, **{name: _set(current, path[1:], value)})
    hint = _field_type(type(config), name)
    clears = value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null"))
    if dataclasses.is_dataclass(current) and not isinstance(value, Mapping) and not (
            clears and type(None) in _options(hint)):
        raise OverrideError(f"{name} is a group of settings; set one of its fields ({name}.<field>=...)")
    return dataclasses.replace(config, **{name: _coerce(value, current, hint)})


def _field_type(cls: type, name: str) -> Any:
    try:
        return typing.get_type_hints(cls)[name]
    except Exception:  # unresolvable annotation: fall back to the current value's type
        return None


def _options(hint: Any) -> tuple[Any, ...]:
    """The alternatives of a union annotation (``int | None`` -> (int, NoneType))."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return typing.get_args(hint)
    return (hint,)


def _coerce(value: Any, current: Any, hint: Any) -> Any:
    """``value`` (text or JSON-typed) as the field's type."""
    options = [o for o in _options(hint) if o is not None] if hint is not None else []
    allows_none = current is None or type(None) in options
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("none", "null") and allows_none:
            return None
        kind = type(current) if current is not None else next(
            (o for o in options if o is not type(None)), str)
        return _parse_text(text, kind, current, options)
    if value is None:
        if not allows_none:
            raise OverrideError("None is not allowed here")
        return None
    if isinstance(current, tuple) and isinstance(value, list):
        return tuple(value)
    if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if dataclasses.is_dataclass(current) and isinstance(value, Mapping):
        return from_dict(type(current), value)
    return value


def _parse_text(text: str, kind: type, current: Any, options: list) -> Any:
    origin = typing.get_origin(kind) or kind
    if origin is bool:
        if text.lower() in ("true", "1", "yes", "on"):
            return True
        if text.lower() in ("false", "0", "no", "off"):
            return False
        raise OverrideError(f"expected true or false, got {text!r}")
    if origin is int:
        try:
            return int(text)
        except ValueError:
            raise OverrideError(f"expected an integer, got {text!r}") from None
    if origin is float:
        try:
            return float(text)
        except ValueError:
            raise OverrideError(f"expected a number, got {text!r}") from None
    if origin is tuple:
        items = json.loads(text) if text.startswith("[") else [t for t in text.split(",") if t.strip()]
        item_kind = type(current[0]) if current else str
        return tuple(_parse_text(str(t).strip(), item_kind, None, []) if isinstance(t, str) else t for t in items)
    if origin is str:
        return text
    raise OverrideError(f"a {getattr(kind, '__name__', kind)} cannot be set from text; use a preset file")


def from_dict(cls: type, data: Mapping[str, Any]) -> Any:
    """Rebuilds a (nested) frozen dataclass from ``dataclasses.asdict`` output (JSON types:
    lists become tuples where the field holds a tuple; unknown keys raise OverrideError)."""
    defaults = cls() if _has_defaults(cls) else None
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields)
    if unknown:
        raise OverrideError(f"unknown fields {sorted(unknown)} of {cls.__name__}")
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # unresolvable annotations: nested configs come from the defaults only
        hints = {}
    kwargs = {}
    for name, value in data.items():
        current = getattr(defaults, name, None) if defaults is not None else None
        kwargs[name] = _from_value(value, current, hints.get(name))
    return cls(**kwargs)


def _has_defaults(cls: type) -> bool:
    return all(f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
               for f in dataclasses.fields(cls))


def _from_value(value: Any, current: Any, hint: Any) -> Any:
    if isinstance(value, Mapping):
        kinds = [o for o in _options(hint) if dataclasses.is_dataclass(o)] if hint is not None else []
        kind = type(current) if dataclasses.is_dataclass(current) else (kinds[0] if kinds else None)
        if kind is not None:
            return from_dict(kind, value)
        return dict(value)
    if isinstance(value, list):
        return tuple(_from_value(v, None, None) for v in value)
    if isinstance(value, float) and math.isnan(value):
        return value
    return value
