"""``JaxEngine``: the ``Engine`` interface over a local ``CausalLM`` and our jitted sampler."""

from __future__ import annotations

from collections.abc import Sequence

import jax
from flax import nnx

from jax_drive.sampling.engine import (
    Completion,
    Message,
    Prompt,
    validate_conversations,
    validate_prompts,
)
from jax_drive.sampling.params import SamplingParams
from jax_drive.sampling.sampler import DecodeWeightCache, SamplerConfig, generate_tokens


class JaxEngine:
    """Generates with a local flax.nnx ``CausalLM``.

    Args:
      model: ``jax_drive.models.CausalLM`` (its current weights are read on every call, so
        in-place updates, e.g. by a trainer, are picked up without rebuilding the engine).
      tokenizer: ``jax_drive.models.Tokenizer`` (or anything with ``encode``, ``decode``,
        ``apply_chat_template``, ``eos_token_ids``, ``pad_token_id``). May be None when
        only token-id prompts are used; ``Completion.text`` is then empty.
      sampler_config: shape bucketing (see ``SamplerConfig``).
      max_batch_size: rows per sampler call (prompts x n); larger requests are split into
        several calls (each with its own key, folded in from ``key``). None = one call.
    """

    def __init__(
        self,
        model,
        tokenizer=None,
        sampler_config: SamplerConfig = SamplerConfig(),
        max_batch_size: int | None = None,
    ):
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.sampler_config = sampler_config
        self.max_batch_size = max_batch_size
        self.decode_weights = DecodeWeightCache()  # rebuilt when the model's arrays change

    # ------------------------------------------------------------------ helpers
    def _encode(self, prompts: list[Prompt]) -> list[list[int]]:
        if isinstance(prompts[0], str):
            if self.tokenizer is None:
                raise ValueError("JaxEngine has no tokenizer: pass token-id prompts")
            return [list(self.tokenizer.encode(p)) for p in prompts]
        return [[int(t) for t in p] for p in prompts]

    def _pad_id(self) -> int:
        if self.tokenizer is not None and getattr(self.tokenizer, "pad_token_id", None) is not None:
            return int(self.tokenizer.pad_token_id)
        return 0

    def _default_stop_ids(self) -> tuple[int, ...]:
        if self.tokenizer is None:
            return ()
        return tuple(int(i) for i in getattr(self.tokenizer, "eos_token_ids", ()) or ())

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    # --------------------------------------------------------------- interface
    def generate(
        self, prompts: Sequence[Prompt], params: SamplingParams, key: jax.Array
    ) -> list[Completion]:
        """Completes each prompt ``params.n`` times; see ``Engine.generate``."""
        prompts = validate_prompts(prompts)
        encoded = self._encode(prompts)
        rows = [ids for ids in encoded for _ in range(params.n)]
        stop_ids = params.resolved_stop_ids(self._default_stop_ids())
        graph_and_state = nnx.split(self.model)
        weights = self.decode_weights.get(self.model) if self.sampler_config.unroll_layers else None
        chunk = self.max_batch_size or len(rows)
        completions: list[Completion] = []
        for c, start in enumerate(range(0, len(rows), chunk)):
            part = rows[start : start + chunk]
            out = generate_tokens(
                self.model,
                part,
                jax.random.fold_in(key, c) if chunk < len(rows) else key,
                max_new_tokens=params.max_new_tokens,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,
                stop_token_ids=stop_ids,
                min_new_tokens=params.min_new_tokens,
                pad_id=self._pad_id(),
                logprobs_mode=params.logprobs_mode,
                config=self.sampler_config,
                graph_and_state=graph_and_state,
                weights=weights,
            )
            for i, prompt_ids in enumerate(part):
                ids, logprobs = out.row(i)
                completions.append(
                    Completion(
                        prompt_token_ids=tuple(prompt_ids),
                        token_ids=tuple(ids),
                        text=self._decode(ids, params.skip_special_tokens),
                        logprobs=tuple(float(x) for x in logprobs),
                        finish_reason="stop" if bool(out.stopped[i]) else "length",
                    )
                )
        return completions

    def generate_chat(
        self, conversations: Sequence[Sequence[Message]], params: SamplingParams, key: jax.Array
    ) -> list[Completion]:
        """Applies the tokenizer's chat template (with the generation prompt) and generates."""
        conversations = validate_conversations(conversations)
        if self.tokenizer is None:
            raise ValueError("generate_chat needs a tokenizer with a chat template")
        prompts = [
            self.tokenizer.apply_chat_template(conv, add_generation_prompt=True)
            for conv in conversations
        ]
        return self.generate(prompts, params, key)
