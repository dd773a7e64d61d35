"""The project's answer formats as grammars (one constructor per format).

* :func:`trajectory_grammar`: MTDrive's answer, exactly what ``text.codec.format_trajectory``
  writes (``Here is the planning trajectory [PT, (+x, +y, +h), ...].``, each number ``{:+.2f}``
  or ``0.0``), with every value inside the plausible ranges of ``text.format_score``.
* :func:`action_grammar`: the TalkingVehicles driving decision ``{"command": ..., "message": ...}``
  (the commands given by the caller, a message of at most ``max_message_chars`` characters).
* :func:`memory_grammar`, :func:`prose_grammar`: a TalkingVehicles reflection
  ``{"knowledge": ..., "strategy": ...}`` and a debrief turn, both as plain word prose.
* :func:`actor_reply_grammar`, :func:`sum_actions_grammar`, :func:`consensus_grammar`:
  CoLMDriver's negotiation message (one line, ``I will ...``, at most ``max_words`` words),
  the critic's speed classes per member and its consensus score.

A grammar's fewest and most tokens over a tokenizer are ``CompiledGrammar.min_tokens`` and
``.max_tokens`` (answer budgets are set from them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from jax_drive.sampling.grammar.regex import GrammarError
from jax_drive.sampling.grammar.spec import Grammar
from jax_drive.sim.actions import SpeedIntent
from jax_drive.text.codec import ANSWER_PREFIX, NUM_POINTS
from jax_drive.text.format_score import FormatConfig

JSON_SEPARATORS = (", ", ": ")  # json.dumps' defaults: what the prompts show


def _same_length_range(lo: str, hi: str) -> list[str]:
    """Regex alternatives (no top-level ``|``) for the digit strings of one length in [lo, hi]."""
    if not lo:
        return [""]
    if lo[0] == hi[0]:
        return [lo[0] + rest for rest in _same_length_range(lo[1:], hi[1:])]
    n = len(lo) - 1
    tail = "[0-9]" * n
    out, first, last = [], int(lo[0]), int(hi[0])
    if lo[1:] != "0" * n:
        out += [lo[0] + rest for rest in _same_length_range(lo[1:], "9" * n)]
        first += 1
    if hi[1:] != "9" * n:
        last -= 1
    if first <= last:
        out.append((str(first) if first == last else f"[{first}-{last}]") + tail)
    if hi[1:] != "9" * n:
        out += [hi[0] + rest for rest in _same_length_range("0" * n, hi[1:])]
    return out


def int_range_regex(lo: int, hi: int) -> str:
    """A regex (one group) matching the decimal integers in [lo, hi] written without leading zeros."""
    if not 0 <= lo <= hi:
        raise GrammarError(f"need 0 <= lo <= hi, got {lo}, {hi}")
    parts = []
    for digits in range(len(str(lo)), len(str(hi)) + 1):
        a, b = max(lo, 10 ** (digits - 1) if digits > 1 else 0), min(hi, 10**digits - 1)
        if a <= b:
            parts += _same_length_range(str(a), str(b))
    return "(?:" + "|".join(parts) + ")"


def codec_number_regex(max_abs: float) -> str:
    """The numbers ``text.codec.format_number`` writes for values with |v| <= ``max_abs``:
    ``0.0`` or a sign, the integer part and two decimals, with |value| >= 0.02."""
    cents = int(math.floor(round(max_abs * 100, 6)))
    if cents < 2:
        return r"0\.0"
    whole, frac = divmod(cents, 100)
    options = [r"0\." + "(?:" + "|".join(_same_length_range("02", f"{min(cents, 99):02d}")) + ")"]
    if whole >= 2:
        options.append(int_range_regex(1, whole - 1) + r"\.[0-9]{2}")
    if whole >= 1:
        options.append(f"{whole}\\." + "(?:" + "|".join(_same_length_range("00", f"{frac:02d}")) + ")")
    return r"(?:0\.0|[+-](?:" + "|".join(options) + "))"


def trajectory_grammar(num_points: int = NUM_POINTS, ranges: FormatConfig = FormatConfig(),
                       prefix: bool = True) -> Grammar:
    """MTDrive's trajectory answer (see the module docstring); ``prefix``: the leading sentence."""
    if num_points < 1:
        raise GrammarError(f"num_points must be >= 1, got {num_points}")
    x, y, h = (codec_number_regex(b) for b in (ranges.max_abs_x, ranges.max_abs_y, ranges.max_abs_heading))
    point = rf"\({x}, {y}, {h}\)"
    block = rf"\[PT, {point}" + (rf"(?:, {point}){{{num_points - 1}}}" if num_points > 1 else "") + r"\]"
    return Grammar.regex(rf"{ANSWER_PREFIX} {block}\." if prefix else block)


def action_grammar(commands: Sequence[str], max_message_chars: int | None = 80,
                   separators: tuple[str, str] = JSON_SEPARATORS) -> Grammar:
    """The TalkingVehicles decision ``{"command": <one of commands>, "message": <string>}``.

    commands: the command names (``tuple(jax_drive.coop.agent.COMMANDS)``); max_message_chars:
    the message's length cap in JSON string characters (an escape counts as one); None: the
    silent answer ``{"command": ...}`` with no message key (what the silent prompt asks for).
    """
    commands = list(commands)
    if not commands or (max_message_chars is not None and max_message_chars < 0):
        raise GrammarError("action_grammar needs commands and max_message_chars >= 0 (or None)")
    properties = {"command": {"type": "string", "enum": commands}}
    if max_message_chars is not None:
        properties["message"] = {"type": "string", "maxLength": int(max_message_chars)}
    schema = {"type": "object", "properties": properties, "required": list(properties),
              "additionalProperties": False}
    return Grammar.json_schema(schema, separators)


WORD = r"[A-Za-z0-9'\-]+"


def words_regex(max_words: int, min_words: int = 1) -> str:
    """Plain prose of ``min_words`` to ``max_words`` words (letters, digits, ``'`` and ``-``),
    each word optionally followed by one of ``, ; : .``, one space between words, ending with a
    full stop: no quotes, braces or newlines (safe inside a JSON string). Word length is left
    to the token budget (a per-word cap multiplies the states)."""
    if not 1 <= min_words <= max_words:
        raise GrammarError(f"need 1 <= min_words <= max_words, got {min_words}, {max_words}")
    return f"{WORD}(?:[,;:.]? {WORD}){{{min_words - 1},{max_words - 1}}}\\."


def prose_grammar(max_words: int) -> Grammar:
    """One turn of a discussion (a TalkingVehicles debrief): :func:`words_regex` prose."""
    return Grammar.regex(words_regex(max_words))


def memory_grammar(max_words: int, min_words: int = 3) -> Grammar:
    """A TalkingVehicles reflection: ``{"knowledge": "<prose>", "strategy": "<prose>"}``, each
    field :func:`words_regex` prose of ``min_words`` to ``max_words`` words, so the memory
    holds sentences, never an empty, cut-off or symbol-only entry."""
    field = words_regex(max_words, min_words)
    return Grammar.regex(f'\\{{"knowledge": "{field}", "strategy": "{field}"\\}}')


def actor_reply_grammar(max_words: int) -> Grammar:
    """CoLMDriver's negotiation message: one line ``I will ...`` of at most ``max_words`` words
    (letters, digits, ``'`` and ``-``, each optionally followed by one of ``, ; . ! ?``).
    Word length is left to the token budget (a per-word cap multiplies the states)."""
    if max_words < 3:
        raise GrammarError(f"max_words must be >= 3 ('I will' and one word), got {max_words}")
    return Grammar.regex(f"I will(?: {WORD}[,;.!?]?){{1,{max_words - 2}}}")


def sum_actions_grammar(vids: Sequence[int], classes: Sequence[str] = tuple(s.name for s in SpeedIntent),
                        separators: tuple[str, str] = JSON_SEPARATORS) -> Grammar:
    """The critic's sum-actions answer ``{"<vid>": {"speed": "<class>"}, ...}``, one member per
    vid, in the given order (classes: the speed intentions STOP, SLOWER, KEEP, FASTER)."""
    vids = [int(v) for v in vids]
    if not vids or len(set(vids)) != len(vids):
        raise GrammarError(f"sum_actions_grammar needs distinct vehicle ids, got {vids}")
    member = {"type": "object", "properties": {"speed": {"type": "string", "enum": list(classes)}},
              "required": ["speed"], "additionalProperties": False}
    schema = {"type": "object", "properties": {str(v): member for v in vids},
              "required": [str(v) for v in vids], "additionalProperties": False}
    return Grammar.json_schema(schema, separators)


def consensus_grammar(scores: Sequence[int] | None = None, max_analysis_chars: int | None = None) -> Grammar:
    """The critic's consensus answer ``Short analysis: <sentence> Consensus score: <n>``.

    The sentence is one line without digits or colons (so the score the parser finds is the
    final one) of at most ``max_analysis_chars`` characters (None: its length is left to the
    token budget, which the local sampler's finish-in-budget mask enforces; a server has no
    such mask, so bound it there); the score is an integer in 0..100, or one of ``scores``
    when given. A space or a line break precedes ``Consensus score`` (the compact and paper
    prompt styles).
    """
    if scores is None:
        score = int_range_regex(0, 100)
    else:
        values = sorted({int(s) for s in scores})
        if not values or values[0] < 0 or values[-1] > 100:
            raise GrammarError(f"consensus scores must be integers in 0..100, got {scores}")
        score = "(?:" + "|".join(str(v) for v in values) + ")"
    if max_analysis_chars is not None and max_analysis_chars < 1:
        raise GrammarError(f"max_analysis_chars must be >= 1 or None, got {max_analysis_chars}")
    length = "+" if max_analysis_chars is None else f"{{1,{int(max_analysis_chars)}}}"
    return Grammar.regex(f"Short analysis: [^\\x00-\\x1f:0-9]{length}[ \\n]Consensus score: {score}")
