"""What the sampler reports: the per-token log-probabilities and the host-side result.

Log-probability modes (``Request.logprobs_mode``, ``SamplingParams.logprobs_mode``):

- ``"raw"``: log-softmax of the model's float32 logits at the sampled token (temperature 1,
  no top-k / top-p, no min-token mask): log pi(token | prefix) of the policy, what a
  policy-gradient trainer recomputes. A logits mask (``constraints.LogitsMask``) is part of
  the policy: raw log-probs are those of the masked logits.
- ``"processed"``: log-softmax after temperature, top-k / top-p and the min-token mask: the
  distribution the token was drawn from (0 under greedy decoding).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jax_drive.sampling.request import DecodeMode, Request
from jax_drive.sampling.selection import gather_logprob
from jax_drive.sampling.state import DecodeState


def reported_logprobs(mode: DecodeMode, logits: jax.Array, tokens: jax.Array,
                      processed: jax.Array) -> jax.Array:
    """The log-probs a step reports for ``tokens`` (...): ``processed`` (...) (those of the
    draw) in processed mode, else the raw ones from ``logits`` (..., V) float32."""
    return processed if mode.processed_logprobs else gather_logprob(logits, tokens)


@dataclasses.dataclass(frozen=True)
class SamplerOutput:
    """Host-side result of ``generate_tokens`` (R = number of prompts, N = max_new_tokens).

    tokens (R, N) int32 (``pad_id`` after a stop / past the end), logprobs (R, N) float32
    (0 past the end), lengths (R,) int32 generated tokens (stop token included),
    stopped (R,) bool (a stop token ended the row), steps: decode-loop iterations (forward
    passes) the call ran (fewer than max(lengths) when drafted tokens were accepted).
    """

    tokens: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray
    stopped: np.ndarray
    steps: int = 0

    def row(self, i: int) -> tuple[list[int], list[float]]:
        n = int(self.lengths[i])
        return self.tokens[i, :n].tolist(), self.logprobs[i, :n].tolist()

    @classmethod
    def from_state(cls, out: DecodeState, rows: int, request: Request) -> "SamplerOutput":
        """The first ``rows`` rows of a loop state (finished, or between chunks), fetched to
        the host."""
        n = request.max_new_tokens
        tokens, logprobs, lengths, stopped, steps = jax.device_get(
            (out.tokens, out.logprobs, out.lengths, out.stopped, out.step))
        tokens = np.asarray(tokens)[:rows, :n].copy()
        logprobs = np.asarray(logprobs)[:rows, :n].copy()
        lengths = np.asarray(lengths)[:rows]
        # Columns never reached (early exit) or past a row's end: pads.
        past = np.arange(n)[None, :] >= lengths[:, None]
        tokens[past] = request.pad_id
        logprobs[past] = 0.0
        return cls(tokens=tokens, logprobs=logprobs, lengths=lengths,
                   stopped=np.asarray(stopped)[:rows], steps=int(steps))
