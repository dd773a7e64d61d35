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
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from jax_drive.sampling.grammar.regex import GrammarError, normalize

GrammarKind = Literal["regex", "json_schema", "choice", "anything"]
KINDS = ("regex", "json_schema", "choice", "anything")
# Stands for "whitespace" while outlines-core writes a schema's regex; replaced by the
# fixed separators afterwards (a private-use character: no schema may contain it).
_WS = "\ue000"


def _literal(text: str) -> str:
    """A regex matching exactly ``text``."""
    return "".join("\\" + ch if ch in "\\.+*?()|[]{}^$" else ch for ch in text)


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
    """

    kind: GrammarKind
    source: str
    pattern: str
    separators: tuple[str, str] = (",", ":")

    def __post_init__(self):
        if self.kind not in KINDS:
            raise GrammarError(f"grammar kind must be one of {KINDS}, got {self.kind!r}")

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

    @property
    def key(self) -> str:
        """A text that identifies the language (part of the compiled-grammar cache key)."""
        return f"{self.kind}\x00{self.pattern}"
