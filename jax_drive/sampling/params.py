"""Sampling parameters shared by every engine (local JAX sampler, OpenAI-compatible server).

The fields follow the vocabulary of vLLM / the OpenAI completions API so the same
``SamplingParams`` drives both back ends.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

LogprobsMode = Literal["raw", "processed"]


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to decode.

    Attributes:
      max_new_tokens: upper bound on generated tokens per completion (stop token included).
      temperature: softmax temperature; ``0`` means greedy (argmax) decoding.
      top_p: nucleus filtering; keep the smallest set of most likely tokens whose
        probability mass reaches ``top_p`` (``1.0`` disables it).
      top_k: keep only the ``top_k`` most likely tokens (``0`` disables it).
      stop_token_ids: token ids that end a completion (the stop token is kept in
        ``Completion.token_ids`` and its log-prob is reported). ``None`` means "the
        tokenizer's end-of-sequence ids"; ``()`` means "never stop early".
      min_new_tokens: stop tokens are forbidden (their logits set to -inf) until this
        many tokens have been generated.
      n: completions per prompt; results are ordered prompt-major
        (prompt 0 sample 0..n-1, prompt 1 sample 0..n-1, ...).
      logprobs_mode: ``"raw"`` (default): log-softmax of the model's raw logits
        (temperature 1, no top-k/top-p filtering), i.e. log pi(token | prefix) of the
        policy, which is what policy-gradient RL needs. ``"processed"``: log-softmax of
        the logits after temperature scaling and top-k/top-p filtering, i.e. the log
        probability of the distribution the token was actually drawn from. Under greedy
        decoding ``"processed"`` is reported as 0 (the argmax has probability one).
      skip_special_tokens: drop special tokens when decoding ``Completion.text``.
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] | None = None
    min_new_tokens: int = 0
    n: int = 1
    logprobs_mode: LogprobsMode = "raw"
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0, got {self.top_k!r}")
        if not isinstance(self.min_new_tokens, int) or not (
            0 <= self.min_new_tokens <= self.max_new_tokens
        ):
            raise ValueError(
                f"min_new_tokens must be an int in [0, max_new_tokens], got {self.min_new_tokens!r}"
            )
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an int >= 1, got {self.n!r}")
        if self.logprobs_mode not in ("raw", "processed"):
            raise ValueError(f"logprobs_mode must be 'raw' or 'processed', got {self.logprobs_mode!r}")
        if self.stop_token_ids is not None:
            ids = tuple(self.stop_token_ids)
            if any((not isinstance(i, int)) or i < 0 for i in ids):
                raise ValueError(f"stop_token_ids must be non-negative ints, got {ids!r}")
            object.__setattr__(self, "stop_token_ids", ids)

    @property
    def greedy(self) -> bool:
        """True when decoding is deterministic argmax (temperature 0)."""
        return self.temperature == 0.0

    def replace(self, **changes) -> "SamplingParams":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def resolved_stop_ids(self, default: tuple[int, ...]) -> tuple[int, ...]:
        """The stop ids to use: ``stop_token_ids`` or ``default`` when it is None."""
        return tuple(default) if self.stop_token_ids is None else self.stop_token_ids
