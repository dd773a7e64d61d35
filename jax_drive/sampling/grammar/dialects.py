"""The same grammar in each server's dialect (pure functions: a :class:`Grammar` in, request
fields out).

* llama.cpp (llama-cpp-python's server): a GBNF ``grammar`` field, translated from the
  grammar's regex by :func:`to_gbnf` (exact: the same language as the local automaton);
  on chat requests a JSON schema may instead go as ``response_format: {"type":
  "json_object", "schema": ...}`` (``exact=False``: llama.cpp then chooses the whitespace).
* vLLM (and ``jax-drive serve``): ``structured_outputs`` with ``regex`` (exact), or natively
  ``choice`` / ``json`` (``exact=False``: vLLM's backend chooses the JSON whitespace);
  :func:`openai_response_format` gives OpenAI's ``response_format`` ``json_schema`` form.

"Exact" requests make the server's answers sentences of the local automaton, so the trainer
can recompute their log-probs under the same mask. What a dialect cannot express raises a
:class:`GrammarError`.
"""

from __future__ import annotations

from typing import Any, Literal

from jax_drive.sampling.grammar.regex import Alt, Chars, Concat, GrammarError, Repeat, parse, quantifier
from jax_drive.sampling.grammar.spec import Grammar

Endpoint = Literal["completions", "chat"]
# llama.cpp refuses repetition counts above this (llama-grammar.cpp's MAX_REPETITION_THRESHOLD).
GBNF_MAX_REPETITION = 2000
_GBNF_ESCAPES = {ord('"'): '\\"', ord("\\"): "\\\\", ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}
# Inside [...] GBNF escapes only \\ " [ ] x u U t r n; '-' and '^' are written as hex escapes.
_GBNF_CLASS_ESCAPES = {ord("]"): "\\]", ord("["): "\\[", ord("\\"): "\\\\", ord("-"): "\\x2D",
                       ord("^"): "\\x5E", ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}


def _gbnf_char(code: int, in_class: bool) -> str:
    escapes = _GBNF_CLASS_ESCAPES if in_class else _GBNF_ESCAPES
    if code in escapes:
        return escapes[code]
    if 0x20 <= code < 0x7F:
        return chr(code)
    if code < 0x100:
        return f"\\x{code:02X}"
    return f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}"


def _gbnf(node) -> str:
    """One GBNF expression for a regex tree node (code points, like the regex)."""
    if isinstance(node, Chars):
        single = node.literal
        if single is not None:
            return '"' + _gbnf_char(ord(single), in_class=False) + '"'
        body = "".join(_gbnf_char(lo, True) if lo == hi else f"{_gbnf_char(lo, True)}-{_gbnf_char(hi, True)}"
                       for lo, hi in node.ranges)
        return f"[{'^' if node.negated else ''}{body}]" if body else "[^\\x00-\\U0010FFFF]"
    if isinstance(node, Concat):
        parts, run = [], []
        for item in node.items:  # consecutive literal characters become one string literal
            single = item.literal if isinstance(item, Chars) else None
            if single is not None:
                run.append(_gbnf_char(ord(single), in_class=False))
                continue
            if run:
                parts.append('"' + "".join(run) + '"')
                run = []
            parts.append(_gbnf(item))
        if run:
            parts.append('"' + "".join(run) + '"')
        return " ".join(parts) if parts else '""'
    if isinstance(node, Alt):
        return "(" + " | ".join(_gbnf(option) for option in node.options) + ")"
    if isinstance(node, Repeat):
        if max(node.lo, node.hi or 0) > GBNF_MAX_REPETITION:
            raise GrammarError(f"llama.cpp's GBNF refuses repetition counts above {GBNF_MAX_REPETITION} "
                               f"(got {quantifier(node.lo, node.hi)})")
        inner = _gbnf(node.item)
        if not isinstance(node.item, Chars):
            inner = f"({inner})"
        return inner + quantifier(node.lo, node.hi)
    raise TypeError(f"not a regex tree node: {node!r}")


def to_gbnf(pattern: str) -> str:
    """A llama.cpp GBNF grammar (rule ``root``) of the same language as the regex ``pattern``.

    Raises GrammarError (RegexError) for syntax outside the supported subset, and for
    repetition counts GBNF refuses.
    """
    return f"root ::= {_gbnf(parse(pattern))}\n"


def openai_response_format(grammar: Grammar, name: str = "answer") -> dict[str, Any]:
    """OpenAI's ``response_format`` for a JSON-schema grammar (strict json_schema)."""
    if grammar.kind != "json_schema":
        raise GrammarError(f"response_format json_schema needs a json_schema grammar, got {grammar.kind}")
    return {"type": "json_schema", "json_schema": {"name": name, "schema": grammar.schema, "strict": True}}


def vllm_structured_outputs(grammar: Grammar, exact: bool = True) -> dict[str, Any]:
    """vLLM's ``structured_outputs`` value: ``{"regex": ...}`` (exact), or natively
    ``{"choice": [...]}`` / ``{"json": schema}`` when not ``exact``; {} for anything."""
    if grammar.kind == "anything":
        return {}
    if not exact and grammar.kind == "choice":
        return {"choice": grammar.choices}
    if not exact and grammar.kind == "json_schema":
        return {"json": grammar.schema}
    return {"regex": grammar.pattern}


def request_fields(grammar: Grammar, server: str, endpoint: Endpoint = "completions",
                   exact: bool = True) -> dict[str, Any]:
    """Fields to add to a completions / chat request body so ``server`` constrains its answer.

    Args:
      grammar: the :class:`Grammar` ({} for anything).
      server: the dialect name: 'vllm' / 'jax-drive' (``structured_outputs``), 'llama.cpp'
        (GBNF ``grammar``; chat + json_schema + not exact: ``response_format`` json_object)
        or 'openai' (json_schema grammars with ``exact=False`` only: ``response_format``).
      endpoint: 'completions' or 'chat'.
      exact: the server must produce exactly the local automaton's language (see the module docstring).
    Raises GrammarError for what the dialect cannot express.
    """
    if endpoint not in ("completions", "chat"):
        raise GrammarError(f"endpoint must be 'completions' or 'chat', got {endpoint!r}")
    if grammar.kind == "anything":
        return {}
    if server in ("vllm", "jax-drive"):
        return {"structured_outputs": vllm_structured_outputs(grammar, exact)}
    if server == "llama.cpp":
        if endpoint == "chat" and not exact and grammar.kind == "json_schema":
            return {"response_format": {"type": "json_object", "schema": grammar.schema}}
        return {"grammar": to_gbnf(grammar.pattern)}
    if server == "openai":
        if exact or grammar.kind != "json_schema":
            raise GrammarError("the openai dialect can only constrain answers to a JSON schema, and not to "
                               "exact separators: use a json_schema grammar with exact=False")
        return {"response_format": openai_response_format(grammar)}
    raise GrammarError(f"no grammar dialect for server {server!r} (vllm, jax-drive, llama.cpp, openai)")
