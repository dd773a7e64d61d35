"""What an answer must look like: a :class:`Grammar` (a regex, a JSON schema, a list of
choices, or anything).

Every grammar becomes one regex in the supported subset (:mod:`.regex`), normalised once at
construction, so the local compiler and every server dialect see the same language:

* ``Grammar.regex(pattern)``: the answer matches ``pattern`` as a whole;
* ``Grammar.json_schema(schema, separators=(",", ":"))``: a JSON value valid under
  ``schema``, written with fixed separators (``json.dumps(..., separators=...)`` style: no
  optional whitespace anywhere), via outlines-core's ``build_regex_from_schema``. Strings
  and arrays are bounded where the schema says so (``maxLength``, ``maxItems``); unbounded
  ones are allowed (the decoder's finish-in-budget mask still ends them in time);
* ``Grammar.choice(options)``: exactly one of the strings;
* ``Grammar.anything()``: no constraint (unconstrained rows of a batch).

``canonical_literals`` (``grammar.canonical()``) changes the local token automaton, not the
language: inside fixed text only the tokenizer's own spelling is allowed (:mod:`.canonical`),
so jump-forward finds the literal parts forced. Servers get the same language either way.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from jax_drive.configs import one_of
from jax_drive.sampling.grammar.regex import GrammarError, normalize

GrammarKind = Literal["regex", "json_schema", "choice", "anything"]
KINDS = ("regex", "json_schema", "choice", "anything")
# Stands for "whitespace" while outlines-core writes a schema's regex; replaced by the
# fixed separators afterwards (a private-use character: no schema may contain it).
_WS = "\ue000"


def _literal(text: str) -> str:
    """A regex matching exactly ``text``."""
    return "".join("\\" + ch if ch in "\\.+*?()|[]{}^$" else ch for ch in text)


# JSON-schema keywords outlines-core's regex builder ignores (the answer would not honour them):
# refused rather than silently dropped.
UNSUPPORTED_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "uniqueItems",
                        "maxProperties", "patternProperties", "dependentRequired", "dependentSchemas", "if", "then",
                        "else", "not", "contains", "minContains", "maxContains", "propertyNames",
                        "unevaluatedProperties", "unevaluatedItems")


def check_schema_keywords(schema: Any, path: str = "$") -> None:
    """Raises GrammarError naming the first keyword of :data:`UNSUPPORTED_KEYWORDS` used by a
    (sub)schema of ``schema`` (property names and enum / const values are data, not schemas)."""
    if isinstance(schema, list):
        for i, item in enumerate(schema):
            check_schema_keywords(item, f"{path}[{i}]")
        return
    if not isinstance(schema, Mapping):
        return
    for key, value in schema.items():
        if key in UNSUPPORTED_KEYWORDS:
            raise GrammarError(f"JSON schema keyword {key!r} at {path} is not supported (the answer could not "
                               f"honour it); supported: type, properties, required, additionalProperties, enum, "
                               f"const, items, prefixItems, minItems, maxItems, minLength, maxLength, pattern, "
                               f"format, anyOf, oneOf, allOf, $ref / $defs")
        if key in ("enum", "const", "default", "examples", "description", "title"):
            continue
        if key in ("properties", "$defs", "definitions"):
            for name, sub in (value.items() if isinstance(value, Mapping) else ()):
                check_schema_keywords(sub, f"{path}.{key}.{name}")
        else:
            check_schema_keywords(value, f"{path}.{key}")


def schema_regex(schema: Mapping[str, Any] | str, separators: tuple[str, str] = (",", ":")) -> str:
    """The regex of JSON values valid under ``schema``, written with ``separators`` exactly.

    Raises GrammarError for a schema outlines-core cannot turn into a regex, or separators
    that are not ``,`` / ``:`` with optional spaces.
    """
    text = schema if isinstance(schema, str) else json.dumps(schema)
    item_sep, key_sep = separators
    if item_sep.strip(" ") != "," or key_sep.strip(" ") != ":":
        raise GrammarError(f"separators must be (',' or ', ', ':' or ': '), got {separators!r}")
    if _WS in text:
        raise GrammarError("the schema contains the private-use character U+E000")
    from outlines_core.json_schema import build_regex_from_schema

    try:
        regex = build_regex_from_schema(text, _WS)
    except Exception as error:  # noqa: BLE001 - outlines-core raises several types
        raise GrammarError(f"cannot build a regex from the JSON schema: {error}") from None
    # object members "a" WS : WS v WS , WS "b"; array items v , WS w; WS after { [ and before } ]
    regex = regex.replace(f"{_WS}:{_WS}", _literal(key_sep)).replace(f"{_WS},{_WS}", _literal(item_sep))
    return regex.replace(f",{_WS}", _literal(item_sep)).replace(_WS, "")


@dataclasses.dataclass(frozen=True)
class Grammar:
    """A constraint on an answer's text. Build it with the class methods.

    Fields:
      kind: "regex", "json_schema", "choice" or "anything".
      source: what the user gave (the regex; the schema as canonical JSON; the choices as a
        JSON list; "" for anything).
      pattern: the normalised regex of the language (see :mod:`.regex`; "" for anything).
      separators: the (item, key) separators of a JSON schema's values.
      canonical_literals: the local automaton spells fixed text only as the tokenizer does
        (see the module docstring; default False: every spelling).
    """

    kind: GrammarKind
    source: str
    pattern: str
    separators: tuple[str, str] = (",", ":")
    canonical_literals: bool = False

    def __post_init__(self):
        one_of("grammar kind", self.kind, KINDS, error=GrammarError)

    @classmethod
    def regex(cls, pattern: str) -> "Grammar":
        return cls("regex", pattern, normalize(pattern))

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | str, separators: tuple[str, str] = (",", ":")) -> "Grammar":
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as error:
                raise GrammarError(f"the JSON schema is not valid JSON: {error}") from None
        if not isinstance(schema, Mapping):
            raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}")
        check_schema_keywords(schema)
        separators = (str(separators[0]), str(separators[1]))
        text = json.dumps(schema)  # key order kept: it is the order of the answer's members
        return cls("json_schema", text, normalize(schema_regex(text, separators)), separators)

    @classmethod
    def choice(cls, options: Sequence[str]) -> "Grammar":
        options = list(options) if not isinstance(options, str) else None
        if not options or not all(isinstance(o, str) for o in options):
            raise GrammarError("choices must be a non-empty list of strings")
        return cls("choice", json.dumps(options), normalize("|".join(_literal(o) for o in options)))

    @classmethod
    def anything(cls) -> "Grammar":
        return cls("anything", "", "")

    @property
    def schema(self) -> dict:
        """The JSON schema (json_schema grammars only)."""
        if self.kind != "json_schema":
            raise GrammarError(f"a {self.kind} grammar has no JSON schema")
        return json.loads(self.source)

    @property
    def choices(self) -> list[str]:
        """The options (choice grammars only)."""
        if self.kind != "choice":
            raise GrammarError(f"a {self.kind} grammar has no choices")
        return json.loads(self.source)

    def canonical(self, on: bool = True) -> "Grammar":
        """This grammar with ``canonical_literals`` set to ``on``."""
        return dataclasses.replace(self, canonical_literals=bool(on))

    @property
    def key(self) -> str:
        """A text that identifies the token automaton (the compiled-grammar cache key): the
        language and the spelling rule."""
        return f"{self.kind}\x00{self.pattern}\x00{int(self.canonical_literals)}"
