"""JSON objects in model output: find one, never raise.

Language agents answer with a JSON object (a driving decision ``{"command", "message"}``, a
sum-actions map ``{"<id>": {"speed": ...}}``), but small models wrap it in prose or code
fences, add trailing commas, cut it off, or emit several. :func:`extract_json_object`
returns the first top-level JSON object that parses, or a typed failure.

Acceptance rules (in order):
1. ``text`` is a ``str`` of at most ``MAX_TEXT_CHARS`` characters (``"not a string"``,
   ``"text too long"``);
2. candidates are the balanced ``{...}`` spans of the text, found by a scan that respects
   JSON strings and their escapes, tried left to right (``"no JSON object"``);
3. a candidate is accepted when ``json.loads`` gives a dict; failing that, once more after
   removing trailing commas before ``}`` / ``]`` (a frequent small-model slip);
4. if no candidate parses: ``"malformed JSON object"``; an opened but never closed object:
   ``"unclosed JSON object"``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

MAX_TEXT_CHARS = 20_000
_TRAILING_COMMA = re.compile(r",\s*([}\]])")


@dataclasses.dataclass(frozen=True)
class JSONAnswer:
    """A parsed JSON object, or why there is none (``value`` is None iff ``error`` is set)."""

    value: dict[str, Any] | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.value is not None


def _balanced_spans(text: str) -> tuple[list[tuple[int, int]], bool]:
    """Top-level ``{...}`` spans (start, end exclusive) and whether an object was left open."""
    spans, depth, start, in_string, escaped = [], 0, -1, False, False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"' and depth > 0:
            in_string = True
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                spans.append((start, i + 1))
    return spans, depth > 0


def _loads_dict(candidate: str) -> dict[str, Any] | None:
    for attempt in (candidate, _TRAILING_COMMA.sub(r"\1", candidate)):
        try:
            value = json.loads(attempt)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict):
            return value
    return None


def extract_json_object(text: Any) -> JSONAnswer:
    """The first JSON object in ``text`` that parses (see the module's rules); never raises."""
    if not isinstance(text, str):
        return JSONAnswer(None, "not a string")
    if len(text) > MAX_TEXT_CHARS:
        return JSONAnswer(None, "text too long")
    spans, left_open = _balanced_spans(text)
    for start, end in spans:
        value = _loads_dict(text[start:end])
        if value is not None:
            return JSONAnswer(value)
    if spans:
        return JSONAnswer(None, "malformed JSON object")
    return JSONAnswer(None, "unclosed JSON object" if left_open else "no JSON object")
