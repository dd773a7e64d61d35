"""Sampling parameters shared by every engine (local JAX sampler, OpenAI-compatible server).

The fields follow the vocabulary of vLLM / the OpenAI completions API so the same
``SamplingParams`` drives both back ends.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Literal, Union

from jax_drive.sampling.grammar.spec import Grammar

LogprobsMode = Literal["raw", "processed"]
GrammarField = Union[Grammar, tuple[Union[Grammar, None], ...], None]


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
      grammar: constrain every answer to a :class:`~jax_drive.sampling.grammar.Grammar`
        (regex, JSON schema, choice), or one entry per prompt (None: that prompt's answer is
        free; a list is stored as a tuple). ``JaxEngine`` masks the logits inside its decode
        loop (raw log-probs are then the masked policy's: docs/structured.md); ``OpenAIEngine``
        sends the grammar in the server's dialect. ``None`` (default): unconstrained.
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
    grammar: GrammarField = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "grammar", _grammar_field(self.grammar))
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

    def row_grammars(self, prompts: int) -> list[Grammar | None]:
        """The grammar of each of ``prompts`` prompts (None: unconstrained).

        Raises ValueError when ``grammar`` is a sequence of another length."""
        if self.grammar is None or isinstance(self.grammar, Grammar):
            return [self.grammar] * prompts
        if len(self.grammar) != prompts:
            raise ValueError(f"grammar has {len(self.grammar)} entries for {prompts} prompts")
        return list(self.grammar)

    def replace(self, **changes) -> "SamplingParams":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def resolved_stop_ids(self, default: tuple[int, ...]) -> tuple[int, ...]:
        """The stop ids to use: ``stop_token_ids`` or ``default`` when it is None."""
        return tuple(default) if self.stop_token_ids is None else self.stop_token_ids


def _grammar_field(value) -> GrammarField:
    """``SamplingParams.grammar`` checked and made hashable (a sequence becomes a tuple)."""
    if value is None or isinstance(value, Grammar):
        return value
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"grammar must be a Grammar, a sequence of Grammar / None, or None; got "
                        f"{type(value).__name__} (build one with Grammar.regex / json_schema / choice)")
    items = tuple(value)
    if any(g is not None and not isinstance(g, Grammar) for g in items):
        raise TypeError("every entry of a grammar sequence must be a Grammar or None")
    return items
