"""``JaxEngine``: the ``Engine`` interface over a local ``CausalLM`` and our jitted sampler,
with multi-turn sessions that keep the KV caches between turns (``start`` / ``Session``)."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from jax_drive.sampling.engine import (
    Completion,
    Message,
    Prompt,
    validate_conversations,
    validate_prompts,
)
from jax_drive.sampling.params import SamplingParams
from jax_drive.sampling.sampler import (
    DecodeWeightCache,
    Request,
    SamplerConfig,
    SamplerOutput,
    check_token_ids,
    decode,
    start_decode,
)
from jax_drive.sampling.session import Session, SessionGroup
from jax_drive.sampling.speculative import PromptLookup


class JaxEngine:
    """Generates with a local flax.nnx ``CausalLM``.

    Args:
      model: ``jax_drive.models.CausalLM`` (its current weights are read on every call, so
        in-place updates, e.g. by a trainer, are picked up without rebuilding the engine).
      tokenizer: ``jax_drive.models.Tokenizer`` (or anything with ``encode``, ``decode``,
        ``apply_chat_template``, ``eos_token_ids``, ``pad_token_id``). May be None when
        only token-id prompts are used; ``Completion.text`` is then empty.
      sampler_config: shape bucketing and prefix sharing (see ``SamplerConfig``).
      max_batch_size: rows per sampler call (prompts x n); larger requests are split into
        several calls (each with its own key, folded in from ``key``). None = one call.
      prompt_lookup: speculative decoding by prompt lookup for ``Session.extend`` turns
        (refinement turns, which repeat much of their context); None = off.

    ``supports_sessions`` is True: ``start`` returns a ``Session`` whose rows keep their KV
    caches between turns (engines without it, e.g. HTTP servers, re-send whole contexts).
    """

    supports_sessions = True

    def __init__(
        self,
        model,
        tokenizer=None,
        sampler_config: SamplerConfig = SamplerConfig(),
        max_batch_size: int | None = None,
        prompt_lookup: PromptLookup | None = None,
    ):
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.sampler_config = sampler_config
        self.max_batch_size = max_batch_size
        self.prompt_lookup = prompt_lookup
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

    def request(self, params: SamplingParams, prompt_lookup: PromptLookup | None = None) -> Request:
        """The sampler request for ``params`` with this engine's stop and pad ids."""
        request = Request(
            max_new_tokens=params.max_new_tokens, temperature=params.temperature,
            top_p=params.top_p, top_k=params.top_k,
            stop_token_ids=params.resolved_stop_ids(self._default_stop_ids()),
            min_new_tokens=params.min_new_tokens, pad_id=self._pad_id(),
            logprobs_mode=params.logprobs_mode, prompt_lookup=prompt_lookup)
        request.check(self.model.config.vocab_size)
        return request

    def completion(self, prompt_ids: Sequence[int], output: SamplerOutput, i: int,
                   request: Request, skip_special_tokens: bool = True) -> Completion:
        """Row ``i`` of a sampler output as a Completion."""
        ids, logprobs = output.row(i)
        return Completion(
            prompt_token_ids=tuple(prompt_ids),
            token_ids=tuple(ids),
            text=self._decode(ids, skip_special_tokens),
            logprobs=tuple(float(x) for x in logprobs),
            finish_reason="stop" if bool(output.stopped[i]) else "length",
        )

    def _run(self, prompts: Sequence[Prompt], params: SamplingParams, key: jax.Array,
             keep_caches: bool, images=None):
        """First-turn generation: (completions, rows, session groups, decode steps, the
        unrolled weights used or None, per kept row its RoPE position shift (see Session))."""
        prompts = validate_prompts(prompts)
        rows = [ids for ids in self._encode(prompts) for _ in range(params.n)]
        check_token_ids(rows, self.model.config.vocab_size)
        if images is not None:
            if len(images) != len(prompts):
                raise ValueError(f"{len(images)} image lists for {len(prompts)} prompts")
            images = [row for row in images for _ in range(params.n)]
        request = self.request(params)
        config = self.sampler_config
        weights = None
        if keep_caches or config.unroll_layers:
            weights = self.decode_weights.get(self.model)
            if keep_caches and weights is None:
                raise TypeError("sessions need a CausalLM-like model (with arrays())")
        graph_and_state = nnx.split(self.model)
        chunk = self.max_batch_size or len(rows)
        completions: list[Completion] = []
        groups: list[SessionGroup] = []
        shift: list[int] = []  # per row, the last prompt token's position minus its index
        steps = 0
        for c, start in enumerate(range(0, len(rows), chunk)):
            part = rows[start : start + chunk]
            loop, n, plen = start_decode(self.model, part, jax.random.fold_in(key, c) if chunk < len(rows) else key,
                                         request, config, graph_and_state, weights,
                                         None if images is None else images[start : start + chunk])
            if keep_caches:
                last = np.asarray(loop.position)[:n] if images is not None else [len(p) - 1 for p in part]
                shift.extend(int(pos) - (len(p) - 1) for pos, p in zip(last, part))
            out = decode(self.model, weights, loop, request, config, graph_and_state)
            output = SamplerOutput.from_state(out, n, request)
            steps += output.steps
            completions.extend(self.completion(p, output, i, request, params.skip_special_tokens)
                               for i, p in enumerate(part))
            if keep_caches:
                groups.append(SessionGroup(rows=list(range(start, start + n)), cache=out.cache,
                                           slot=plen - 1 + np.asarray(output.lengths, np.int64)))
        return completions, rows, groups, steps, weights, shift

    # --------------------------------------------------------------- interface
    def generate(
        self, prompts: Sequence[Prompt], params: SamplingParams, key: jax.Array, images=None
    ) -> list[Completion]:
        """Completes each prompt ``params.n`` times; see ``Engine.generate``.

        images: for a vision-language model, per prompt its processed images (see
        ``generate_tokens``); the prompts are then token ids with the image pads expanded.
        """
        return self._run(prompts, params, key, keep_caches=False, images=images)[0]

    def start(
        self, prompts: Sequence[Prompt], params: SamplingParams, key: jax.Array, images=None
    ) -> tuple[Session, list[Completion]]:
        """Like ``generate`` (same completions for the same key; ``images`` as there), and keeps
        every row's KV cache on the device in the returned ``Session`` for ``Session.extend``
        (later turns append text). Always decodes on the unrolled weight layout (whatever
        ``sampler_config.unroll_layers``)."""
        completions, rows, groups, steps, weights, shift = self._run(prompts, params, key, keep_caches=True,
                                                                     images=images)
        contexts = [list(r) + list(c.token_ids) for r, c in zip(rows, completions)]
        return Session(self, contexts, groups, weights, steps, shift), completions

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
