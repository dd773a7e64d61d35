"""Trajectory <-> text codec in the ReCogDrive / MTDrive answer format.

Writing
-------
``format_trajectory(points)`` writes::

    Here is the planning trajectory [PT, (+2.92, +0.15, +0.11), ..., (+24.83, 0.0, 0.0)].

Each number is written with ``{:+.2f}`` (sign, two decimals), except that a number whose
two-decimal value has magnitude <= 0.01 is written ``0.0`` (ReCogDrive's rule; so
``+0.01``, ``-0.01`` and ``-0.00`` never appear). Hence, for finite ``p``::

    parse(format(p)) == round(p, 2)  where abs(round(p, 2)) > 0.01, else 0.0

Reading: acceptance rules of :func:`parse_trajectory`
-----------------------------------------------------
``parse_trajectory(text)`` never raises; it returns a :class:`ParsedTrajectory` with
``ok``, the ``(8, 3)`` float64 poses (``None`` unless ok) and a short ``error`` reason.
A text is accepted iff all of the following hold (the reason given when a rule fails):

1. it is a ``str`` of at most ``MAX_TEXT_CHARS`` characters (``"not a string"``,
   ``"text too long"``);
2. it contains a block opener ``[PT,`` (spaces allowed around ``PT``; case-sensitive)
   (``"no [PT block"``). When several openers occur, the LAST one is parsed, so a model
   may quote earlier trajectories before its answer;
3. the block is closed by a ``]`` after the opener (``"unclosed [PT block"``);
4. the block body consists only of parenthesised tuples separated by commas, with
   optional whitespace and an optional trailing comma (``"malformed block"``; this
   rejects stray words, nested brackets, unbalanced parentheses);
5. there are exactly ``num_points`` (8) tuples (``"expected 8 points, got N"``);
6. each tuple holds exactly 3 comma-separated values (``"point K: expected 3 values"``);
7. each value is a plain decimal number: optional sign, ASCII digits, optional decimal
   point and fraction, optional exponent, e.g. ``+3.1``, ``-0.02``, ``0.0``, ``12``,
   ``1e-3``. Words such as ``nan`` / ``inf``, unicode digits and unicode minus signs are
   rejected (``"point K: bad number"``);
8. every value is finite after conversion to float (``"point K: non-finite value"``,
   e.g. ``1e999``).

Text before the opener and after the closing bracket is ignored (the leading sentence
is not required). Plausibility of the values (ranges) is not the parser's business:
see :mod:`jax_drive.text.format_score`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import numpy as np

NUM_POINTS = 8
MAX_TEXT_CHARS = 100_000
ANSWER_PREFIX = "Here is the planning trajectory"

_OPENER = re.compile(r"\[\s*PT\s*,")
_TUPLE = re.compile(r"\(([^()]*)\)")
_SEPARATORS = re.compile(r"[\s,]*")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


@dataclasses.dataclass(frozen=True)
class ParsedTrajectory:
    """Result of parsing one model answer.

    Fields:
      poses: (num_points, 3) float64 [x, y, heading] or None when not ok.
      ok: the text satisfied every acceptance rule.
      error: "" when ok, else a short reason (see the module docstring).
    """

    poses: np.ndarray | None
    ok: bool
    error: str = ""


def format_number(value: float) -> str:
    """Writes one number: ``{:+.2f}``, or ``0.0`` when its 2-decimal magnitude <= 0.01.

    Raises ValueError for non-finite values.
    """
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"cannot format non-finite value {value!r}")
    text = f"{value:+.2f}"
    if abs(float(text)) <= 0.01:
        return "0.0"
    return text


def format_point(point: Any) -> str:
    """Writes one pose (3,) [x, y, heading] as ``(+x, +y, +h)``."""
    point = np.asarray(point, dtype=np.float64)
    if point.shape != (3,):
        raise ValueError(f"a point must have shape (3,), got {point.shape}")
    return "(" + ", ".join(format_number(v) for v in point) + ")"


def format_points(points: Any) -> str:
    """Writes (K, 3) poses as the bracketed block ``[PT, (..), ..]``."""
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or points.shape[-1] != 3 or points.shape[0] < 1:
        raise ValueError(f"points must have shape (K, 3) with K >= 1, got {points.shape}")
    if not np.all(np.isfinite(points)):
        raise ValueError("points must be finite")
    return "[PT, " + ", ".join(format_point(p) for p in points) + "]"


def format_trajectory(points: Any) -> str:
    """Writes the full answer sentence for (K, 3) poses (K = 8 for MTDrive).

    Returns: ``Here is the planning trajectory [PT, (..), ...].``
    Raises ValueError for a wrong shape or non-finite values (boundary check).
    """
    return f"{ANSWER_PREFIX} {format_points(points)}."


def quantize(points: Any) -> np.ndarray:
    """What a formatted-then-parsed array holds: round to 2 decimals, |v| <= 0.01 -> 0.

    Args: points: any shape of finite floats. Returns float64 of the same shape.
    """
    points = np.asarray(points, dtype=np.float64)
    flat = [float(format_number(v)) for v in points.reshape(-1)]
    return np.asarray(flat, dtype=np.float64).reshape(points.shape)


def _fail(error: str) -> ParsedTrajectory:
    return ParsedTrajectory(poses=None, ok=False, error=error)


def parse_trajectory(text: Any, num_points: int = NUM_POINTS) -> ParsedTrajectory:
    """Parses a model answer into (num_points, 3) poses. Never raises.

    See the module docstring for the acceptance rules and error reasons.
    """
    try:
        return _parse(text, num_points)
    except Exception as error:  # defensive: parsing model output must never raise
        return _fail(f"internal parse error: {type(error).__name__}")


def _parse(text: Any, num_points: int) -> ParsedTrajectory:
    if not isinstance(text, str):
        return _fail("not a string")
    if len(text) > MAX_TEXT_CHARS:
        return _fail("text too long")
    openers = list(_OPENER.finditer(text))
    if not openers:
        return _fail("no [PT block")
    start = openers[-1].end()
    end = text.find("]", start)
    if end < 0:
        return _fail("unclosed [PT block")
    body = text[start:end]
    tuples = list(_TUPLE.finditer(body))
    # Everything between tuples must be commas / whitespace.
    cursor = 0
    for match in tuples:
        if not _SEPARATORS.fullmatch(body[cursor : match.start()]):
            return _fail("malformed block")
        cursor = match.end()
    if not _SEPARATORS.fullmatch(body[cursor:]):
        return _fail("malformed block")
    if len(tuples) != num_points:
        return _fail(f"expected {num_points} points, got {len(tuples)}")
    poses = np.zeros((num_points, 3), dtype=np.float64)
    for k, match in enumerate(tuples):
        values = match.group(1).split(",")
        if len(values) != 3:
            return _fail(f"point {k + 1}: expected 3 values")
        for j, raw in enumerate(values):
            raw = raw.strip()
            if not _NUMBER.fullmatch(raw):
                return _fail(f"point {k + 1}: bad number")
            value = float(raw)
            if not math.isfinite(value):
                return _fail(f"point {k + 1}: non-finite value")
            poses[k, j] = value
    return ParsedTrajectory(poses=poses, ok=True, error="")


def parse_trajectories(texts: Any, num_points: int = NUM_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Parses a list of N answers.

    Returns: poses (N, num_points, 3) float64 (zeros where not ok), ok (N,) bool.
    """
    texts = list(texts)
    poses = np.zeros((len(texts), num_points, 3), dtype=np.float64)
    ok = np.zeros((len(texts),), dtype=bool)
    for i, text in enumerate(texts):
        parsed = parse_trajectory(text, num_points)
        if parsed.ok:
            poses[i] = parsed.poses
            ok[i] = True
    return poses, ok
