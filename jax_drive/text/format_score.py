"""Format reward: does a model answer hold a usable 8-point trajectory?

``format_score(text) = 1.0`` iff

* :func:`jax_drive.text.codec.parse_trajectory` accepts the text (exactly 8 finite
  (x, y, heading) tuples in a ``[PT, ...]`` block, see the codec's acceptance rules), and
* every point lies in a plausible range (:class:`FormatConfig`): ``|x| <= max_abs_x``,
  ``|y| <= max_abs_y``, ``|heading| <= max_abs_heading``;
* and, when ``FormatConfig.require_prefix`` is set, the answer starts (after whitespace)
  with ``Here is the planning trajectory``.

Otherwise the score is 0.0. There is no partial credit: a trajectory the scorer cannot use
earns nothing, so the RL reward stays unambiguous. (``FormatConfig.partial_credit`` > 0
gives that value to answers that parse but fail the range check; default 0.)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

import numpy as np

from jax_drive.text.codec import ANSWER_PREFIX, NUM_POINTS, ParsedTrajectory, parse_trajectory


@dataclasses.dataclass(frozen=True)
class FormatConfig:
    """Plausible ranges of a 4 s plan in the ego frame.

    max_abs_x: 150 m (37.5 m/s average over 4 s, well above any urban speed limit).
    max_abs_y: 150 m.
    max_abs_heading: pi + 0.05 rad (headings are wrapped to (-pi, pi]; a small margin
      allows rounding to two decimals).
    require_prefix: demand the ``Here is the planning trajectory`` sentence (default off).
    partial_credit: score of a parsed but implausible answer (default 0).
    """

    max_abs_x: float = 150.0
    max_abs_y: float = 150.0
    max_abs_heading: float = float(np.pi) + 0.05
    require_prefix: bool = False
    partial_credit: float = 0.0


def plausible(poses: np.ndarray, config: FormatConfig = FormatConfig()) -> bool:
    """Whether (K, 3) poses lie within the configured ranges."""
    poses = np.asarray(poses, dtype=np.float64)
    return bool(
        np.all(np.isfinite(poses))
        and np.all(np.abs(poses[:, 0]) <= config.max_abs_x)
        and np.all(np.abs(poses[:, 1]) <= config.max_abs_y)
        and np.all(np.abs(poses[:, 2]) <= config.max_abs_heading)
    )


@dataclasses.dataclass(frozen=True)
class AnswerCheck:
    """One answer, parsed once.

    parsed: the codec's result. usable: parsed and within the plausible ranges (the scorer
    can use ``parsed.poses``). format: the format reward (see the module docstring).
    """

    parsed: ParsedTrajectory
    usable: bool
    format: float


def check_answer(text: Any, config: FormatConfig = FormatConfig()) -> AnswerCheck:
    """Parses an answer once and returns its usability and format score. Never raises."""
    parsed = parse_trajectory(text, NUM_POINTS)
    usable = bool(parsed.ok and plausible(parsed.poses, config))
    if not parsed.ok or (config.require_prefix and not text.lstrip().startswith(ANSWER_PREFIX)):
        score = 0.0
    else:
        score = 1.0 if usable else float(config.partial_credit)
    return AnswerCheck(parsed=parsed, usable=usable, format=score)


def format_score(text: Any, config: FormatConfig = FormatConfig()) -> float:
    """1.0 for a well-formed plausible answer, else 0.0 (or partial credit). Never raises."""
    return check_answer(text, config).format


def format_scores(texts: Iterable[Any], config: FormatConfig = FormatConfig()) -> np.ndarray:
    """Format scores of N answers: (N,) float32."""
    return np.asarray([format_score(t, config) for t in texts], dtype=np.float32)
