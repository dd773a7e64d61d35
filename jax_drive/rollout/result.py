"""What a batch of multi-turn rollouts produced, and its per-step summary.

:class:`RolloutResult` is a registered pytree whose every leaf leads with the scene axis S
and the rollout axis G, so concatenating batches or selecting scenes is one ``tree_map``
(:func:`concat_results`, :func:`select_scenes`). Scores live only in the (S, G, N) arrays
(N = the turn budget); a rollout's tokens and texts live in its :class:`Transcript`, an
entry of the (S, G) object array ``transcripts``. Everything derivable from these
(turns taken, final PDMS, per-row token lists) is a property, never stored twice.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np

SUB_SCORES = ("nc", "dac", "ttc", "ep", "comfort")


@dataclasses.dataclass(frozen=True)
class TurnRecord:
    """One turn of one rollout on the host side: what the policy wrote and what it was told.

    The turn's scores are not repeated here; they are ``RolloutResult.pdms[s, g, j]`` etc.
    """

    text: str
    num_tokens: int
    finish_reason: str
    feedback: str


@dataclasses.dataclass(frozen=True, eq=False)
class Transcript:
    """One rollout's conversation as the policy saw and produced it.

    tokens: (n,) int32 prompt ids, then per turn the sampled ids followed by the chat
      template's closing / feedback / generation-header ids.
    turn_ids: (n,) int32, j for the tokens generated in turn j, -1 for the rest (no loss).
    sample_logprobs: (n,) float32 sampling log-probs (0 on tokens not generated).
    turns: one TurnRecord per turn taken.
    images: the processed images whose (expanded) pad tokens the prompt holds (empty for a
      text prompt); the trainer feeds them with ``tokens``.
    """

    tokens: np.ndarray
    turn_ids: np.ndarray
    sample_logprobs: np.ndarray
    turns: tuple[TurnRecord, ...]
    images: tuple = ()


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RolloutResult:
    """Everything a training or evaluation step needs from S scenes x G rollouts.

    Arrays over (S, G, N) (entries of turns not taken are 0 / False): ``pdms``, ``format``,
    ``reward``, ``turn_mask``, ``usable`` and ``scores[name]`` for nc, dac, ttc, ep, comfort.
    ``stop_reason``: (S, G) str, 'no_violation', 'max_turns' or 'context'.
    ``transcripts``: (S, G) object array of :class:`Transcript`.
    Row r = s * G + g indexes the flat per-row views (``tokens``, ``turn_ids``,
    ``sample_logprobs``, ``turns``).
    """

    pdms: np.ndarray
    format: np.ndarray
    reward: np.ndarray
    turn_mask: np.ndarray
    usable: np.ndarray
    scores: dict[str, np.ndarray]
    stop_reason: np.ndarray
    transcripts: np.ndarray

    @property
    def num_scenes(self) -> int:
        return int(self.pdms.shape[0])

    @property
    def group_size(self) -> int:
        return int(self.pdms.shape[1])

    @property
    def num_turns(self) -> np.ndarray:
        """(S, G) int32 turns taken."""
        return self.turn_mask.sum(-1).astype(np.int32)

    @property
    def final_pdms(self) -> np.ndarray:
        """(S, G) float32 PDMS of the last turn taken (0 for a rollout with no turn)."""
        turns = self.num_turns
        last = np.take_along_axis(self.pdms, np.maximum(turns - 1, 0)[..., None], axis=-1)[..., 0]
        return (last * (turns > 0)).astype(np.float32)

    @property
    def rows(self) -> list[Transcript]:
        """The S * G transcripts in row order r = s * G + g."""
        return list(self.transcripts.reshape(-1))

    @property
    def tokens(self) -> list[np.ndarray]:
        return [t.tokens for t in self.rows]

    @property
    def turn_ids(self) -> list[np.ndarray]:
        return [t.turn_ids for t in self.rows]

    @property
    def sample_logprobs(self) -> list[np.ndarray]:
        return [t.sample_logprobs for t in self.rows]

    @property
    def turns(self) -> list[tuple[TurnRecord, ...]]:
        return [t.turns for t in self.rows]

    @property
    def num_generated_tokens(self) -> int:
        return int(sum(int((t >= 0).sum()) for t in self.turn_ids))

    def turn_log(self, scene: int, rollout: int = 0) -> list[dict[str, Any]]:
        """The turns of one rollout as plain dicts: text, PDMS, format, usable, feedback,
        finish reason and number of generated tokens."""
        s, g = int(scene), int(rollout)
        return [{"text": t.text, "pdms": float(self.pdms[s, g, j]), "format": float(self.format[s, g, j]),
                 "usable": bool(self.usable[s, g, j]), "feedback": t.feedback, "finish_reason": t.finish_reason,
                 "tokens": t.num_tokens}
                for j, t in enumerate(self.transcripts[s, g].turns)]


def concat_results(results: Sequence[RolloutResult]) -> RolloutResult:
    """Concatenates rollout results along the scene axis."""
    return jax.tree.map(lambda *parts: np.concatenate(parts, axis=0), *results)


def select_scenes(result: RolloutResult, scene_idx: Sequence[int]) -> RolloutResult:
    """The rollouts of the given scenes (indices along the scene axis), all G of each."""
    idx = np.asarray(scene_idx, np.int64)
    return jax.tree.map(lambda leaf: leaf[idx], result)


def summarize(result: RolloutResult) -> dict[str, Any]:
    """Per-step metrics: mean PDMS / format per turn index (over rollouts that reached it),
    PDMS by turn budget (the answer held after j + 1 turns), first- and final-turn PDMS,
    format rate, reward, turns used, sub-scores of the final turn."""
    m = result.turn_mask
    count = m.sum(axis=(0, 1))
    reached = count > 0

    def per_turn(x):
        out = (x * m).sum(axis=(0, 1)) / np.maximum(count, 1)
        return [float(v) if ok else None for v, ok in zip(out, reached)]

    last = np.maximum(result.num_turns - 1, 0)[..., None]
    final = {name: float(np.take_along_axis(v, last, axis=-1).mean()) for name, v in result.scores.items()}
    n = max(int(m.sum()), 1)
    # PDMS of the answer a rollout holds after a budget of j + 1 turns (its last answer if it stopped earlier)
    budget = np.minimum(np.arange(m.shape[-1])[None, None, :], last)
    by_budget = np.take_along_axis(result.pdms, budget, axis=-1).mean(axis=(0, 1))
    return {
        "pdms_per_turn": per_turn(result.pdms),
        "pdms_by_budget": [float(v) for v in by_budget],
        "format_per_turn": per_turn(result.format),
        "rollouts_per_turn": [int(c) for c in count],
        "pdms_first": float(result.pdms[..., 0].mean()),
        "pdms_final": float(result.final_pdms.mean()),
        "format_rate": float((result.format * m).sum() / n),
        "usable_rate": float((result.usable & m).sum() / n),
        "reward_mean": float((result.reward * m).sum() / n),
        "turns_mean": float(result.num_turns.mean()),
        "stopped_no_violation": float((result.stop_reason == "no_violation").mean()),
        "generated_tokens": result.num_generated_tokens,
        **{f"final_{k}": v for k, v in final.items()},
    }
