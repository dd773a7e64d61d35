"""The critic of CoLMDriver's negotiation: parse, score, criticise.

After each round the critic (1) sums the conversation into one speed intention per
member (an LLM answer parsed by :func:`parse_sum_actions`; KEEP below 4 m/s becomes
FASTER), (2) scores the summed intentions: consensus (an LLM score 0-100 parsed by
:func:`parse_consensus`, divided by 100), safety (the minimum pairwise
``sigmoid(2 (d_min - 3))`` over the members' intention-guided waypoints) and efficiency
(``min(mean waypoint speed / 8, 1)``), and (3) writes feedback for the next round: a line
per member pair with safety below 0.7, one when efficiency is below 0.4 and, when the
consensus score takes part, one when it is below 0.8. No feedback ends the negotiation.

The negotiation-quality score of a round (the seed's Fig. 5) is
``3 consensus + 5 safety + 2 efficiency`` (0-10; weights from the public CoLMDriver code).

Parsers never raise: model output is arbitrary text.
"""

from __future__ import annotations

import dataclasses
import re

import jax.numpy as jnp
import numpy as np

from jax_drive.coop.negotiation.prompts import SPEED_NAMES
from jax_drive.sim.actions import KEEP_MIN_SPEED, SpeedIntent
from jax_drive.sim.grouping import GroupingConfig, pairwise_min_distance, safety_score
from jax_drive.text.json_answer import extract_json_object

SAFETY_FEEDBACK = ("Safety issue: Vehicle {i} and vehicle {j} may have conflict. Suggest one of them to yield, "
                   "and another go pass faster.")
EFFICIENCY_FEEDBACK = "Efficiency issue: The efficiency is not high. Some of the cars can be faster."
CONSENSUS_FEEDBACK = "Consensus issue: The vehicles have not agreed yet. Settle who yields and who passes."
_CLASSES = {name: SpeedIntent(k) for k, name in SPEED_NAMES.items()}
_CLASS_RE = re.compile(r"\b(STOP|SLOWER|KEEP|FASTER)\b", re.IGNORECASE)
_PAIR_RE = re.compile(r"(\d+)\D{0,24}?\b(STOP|SLOWER|KEEP|FASTER)\b", re.IGNORECASE)
# "Consensus score: 85", "**Consensus Score**: 85", "Consensus score:** 85", "consensus score = 85"
_SCORE_RE = re.compile(r"consensus\s*score[\s*:=]*(\d{1,3}(?:\.\d+)?)(?!\d|\.\d)", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class CriticConfig:
    """Critic thresholds and weights (CoLMDriver's; the consensus threshold is from the
    public code, where that feedback line is present but disabled).

    Attributes:
      safety_feedback_below: a member pair with a lower safety score gets a feedback line.
      efficiency_feedback_below: efficiency feedback below this score.
      consensus_feedback_below: consensus feedback below this score (when used).
      efficiency_speed: m/s at which the efficiency score saturates.
      keep_min_speed: KEEP below this speed (m/s) becomes FASTER.
      weights: (consensus, safety, efficiency) weights of the quality score.
    """

    safety_feedback_below: float = 0.7
    efficiency_feedback_below: float = 0.4
    consensus_feedback_below: float = 0.8
    efficiency_speed: float = 8.0
    keep_min_speed: float = KEEP_MIN_SPEED
    weights: tuple[float, float, float] = (3.0, 5.0, 2.0)

    def __post_init__(self):
        if self.efficiency_speed <= 0:
            raise ValueError(f"efficiency_speed must be > 0, got {self.efficiency_speed}")
        if len(self.weights) != 3:
            raise ValueError(f"weights are (consensus, safety, efficiency), got {self.weights}")


@dataclasses.dataclass(frozen=True)
class SumActions:
    """Parsed sum-actions answer.

    Fields: intents {vid: SpeedIntent} for the members found; missing (vids without a
    class); source ("json", "text" when recovered from prose, or "none"); error (why the
    JSON could not be used, or None).
    """

    intents: dict[int, int]
    missing: tuple[int, ...]
    source: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        return not self.missing


def _vid_of(key) -> int | None:
    digits = re.findall(r"\d+", str(key))
    return int(digits[-1]) if len(digits) >= 1 and len(digits[-1]) <= 6 else None


def _class_of(value) -> int | None:
    if isinstance(value, dict):
        for k, v in value.items():
            if str(k).strip().lower() == "speed":
                return _class_of(v)
        return None
    if isinstance(value, str):
        m = _CLASS_RE.fullmatch(value.strip())
        return _CLASSES[m.group(1).upper()] if m else None
    return None


def parse_sum_actions(text, vids) -> SumActions:
    """Speed intention per member from a sum-actions answer; never raises.

    Accepts the first JSON object in ``text`` whose keys name member ids (``"201"``,
    ``"Vehicle 201"``) and whose values are ``{"speed": class}`` or a bare class (any case).
    When no JSON object yields a class, falls back to ``<id> ... <class>`` pairs in the text.
    Ids that are not members are ignored; members without a class are ``missing``.
    """
    vids = [int(v) for v in vids]
    found: dict[int, int] = {}
    answer = extract_json_object(text)
    error = answer.error
    if answer.ok:
        for key, value in answer.value.items():
            vid, cls = _vid_of(key), _class_of(value)
            if vid in vids and cls is not None and vid not in found:
                found[vid] = int(cls)
        if not found:
            error = "no member with a speed class"
    source = "json" if found else "none"
    if not found and isinstance(text, str) and len(text) <= 20_000:
        for vid_text, cls in _PAIR_RE.findall(text):
            vid = int(vid_text)
            if vid in vids and vid not in found:
                found[vid] = int(_CLASSES[cls.upper()])
        source = "text" if found else "none"
    missing = tuple(v for v in vids if v not in found)
    return SumActions(intents=found, missing=missing, source=source, error=error)


def keep_rule(intents: dict[int, int], speeds: dict[int, float], cfg: CriticConfig = CriticConfig()) -> dict[int, int]:
    """KEEP below ``cfg.keep_min_speed`` becomes FASTER (a slow car asked to keep would crawl)."""
    return {v: int(SpeedIntent.FASTER) if (i == SpeedIntent.KEEP and speeds[v] < cfg.keep_min_speed) else int(i)
            for v, i in intents.items()}


def parse_consensus(text) -> tuple[float | None, str | None]:
    """(score in [0, 1], None) from ``Consensus score: <n>`` (an integer, or a decimal: the
    expected score of :mod:`~jax_drive.coop.negotiation.consensus`; clipped to 100), or
    (None, error); never raises."""
    if not isinstance(text, str):
        return None, "not a string"
    m = _SCORE_RE.search(text[:20_000])
    if not m:
        return None, "no consensus score"
    return min(float(m.group(1)), 100.0) / 100.0, None


def separation_auc(scores, agreed) -> float:
    """How well ``scores`` separate negotiations that ended in agreement (``agreed`` True)
    from those that did not: the probability that a random agreed one scores higher than a
    random other one, ties counting one half (the ROC AUC; 0.5 = no separation, 1 = every
    agreed one above every other). ValueError when either class is empty or lengths differ.

    Args: scores (N,) floats; agreed (N,) bools.
    """
    s, y = np.asarray(scores, np.float64), np.asarray(agreed, bool)
    if s.shape != y.shape or s.ndim != 1:
        raise ValueError(f"scores {s.shape} and agreed {y.shape} must be two equal-length vectors")
    pos, neg = s[y], s[~y]
    if not len(pos) or not len(neg):
        raise ValueError(f"need both classes: {len(pos)} agreed, {len(neg)} not")
    above = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(above / (len(pos) * len(neg)))


def pairwise_safety(waypoints, cfg: GroupingConfig = GroupingConfig()) -> np.ndarray:
    """(..., A, A) safety scores of waypoints (..., A, W, 2) (the grouping's formula)."""
    d_min, _ = pairwise_min_distance(jnp.asarray(waypoints, jnp.float32))
    return np.asarray(safety_score(d_min, cfg))


def efficiency_score(waypoints, dt: float = 0.2, cfg: CriticConfig = CriticConfig()) -> float:
    """min(mean over vehicles of (waypoint path length / ((W - 1) dt)) / efficiency_speed, 1).

    Args: waypoints (n, W, 2) of the group members.
    """
    wp = np.asarray(waypoints, np.float64)
    if wp.ndim != 3 or wp.shape[1] < 2 or wp.shape[2] != 2:
        raise ValueError(f"efficiency needs waypoints (n, W >= 2, 2), got {wp.shape}")
    length = np.linalg.norm(np.diff(wp, axis=1), axis=-1).sum(-1)
    speed = length / ((wp.shape[1] - 1) * dt)
    return float(min(speed.mean() / cfg.efficiency_speed, 1.0))


@dataclasses.dataclass(frozen=True)
class RoundScores:
    """Scores and feedback of one negotiation round.

    Fields: safety (min pairwise), pair_safety {(vid_i, vid_j): score}, efficiency,
    consensus (None when not asked), quality (3 c + 5 s + 2 e with c = 0 when None),
    feedback (lines for the next round).
    """

    safety: float
    pair_safety: dict
    efficiency: float
    consensus: float | None
    quality: float
    feedback: tuple[str, ...]


def score_round(vids, safety_matrix, efficiency: float, consensus: float | None, *, use_safety_efficiency: bool,
                use_consensus: bool, cfg: CriticConfig = CriticConfig()) -> RoundScores:
    """Scores and feedback of a round from the members' pairwise safety (n, n) matrix.

    Feedback lines come only from the parts that take part: safety and efficiency when
    ``use_safety_efficiency``, consensus when ``use_consensus``.
    """
    vids = [int(v) for v in vids]
    s = np.asarray(safety_matrix, np.float64)
    pairs = {(vids[a], vids[b]): float(s[a, b]) for a in range(len(vids)) for b in range(a + 1, len(vids))}
    safety = min(pairs.values()) if pairs else 1.0
    lines = []
    if use_safety_efficiency:
        lines += [SAFETY_FEEDBACK.format(i=i, j=j) for (i, j), v in pairs.items() if v < cfg.safety_feedback_below]
        if efficiency < cfg.efficiency_feedback_below:
            lines.append(EFFICIENCY_FEEDBACK)
    if use_consensus and consensus is not None and consensus < cfg.consensus_feedback_below:
        lines.append(CONSENSUS_FEEDBACK)
    wc, ws, we = cfg.weights
    quality = wc * (consensus or 0.0) + ws * safety + we * efficiency
    return RoundScores(safety=safety, pair_safety=pairs, efficiency=efficiency, consensus=consensus,
                       quality=float(quality), feedback=tuple(lines))
