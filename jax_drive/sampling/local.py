"""``JaxEngine``: the ``Engine`` interface over a local ``CausalLM`` and our jitted sampler,
with multi-turn sessions that keep the KV caches between turns (``start`` / ``Session``) and
chunked generation for streaming and cancellation (``stream`` / ``DecodeStream``)."""

from __future__ import annotations

import dataclasses
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
from jax_drive.sampling.decode import decode
from jax_drive.sampling.grammar.rows import RowGrammars
from jax_drive.sampling.grammar.spec import Grammar
from jax_drive.sampling.outputs import SamplerOutput
from jax_drive.sampling.params import SamplingParams
from jax_drive.sampling.request import Request, check_token_ids, row_keys
from jax_drive.sampling.sampler import check_model, start_decode
from jax_drive.sampling.session import Session, SessionGroup
from jax_drive.sampling.shapes import SamplerConfig
from jax_drive.sampling.speculative import PromptLookup
from jax_drive.sampling.stream import DecodeRun, DecodeStream
from jax_drive.sampling.weights import DecodeWeightCache


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
      jump_forward: with a grammar (``SamplingParams.grammar``), emit up to this many tokens
        the grammar forces (exactly one allowed token each) without sampling, in the forward
        pass of the token after them (docs/structured.md); 0 = off (default).

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
        jump_forward: int = 0,
    ):
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if not isinstance(jump_forward, int) or jump_forward < 0:
            raise ValueError(f"jump_forward must be an int >= 0, got {jump_forward!r}")
        check_model(model)
        self.model = model
        self.tokenizer = tokenizer
        self.sampler_config = sampler_config
        self.max_batch_size = max_batch_size
        self.prompt_lookup = prompt_lookup
        self.jump_forward = jump_forward
        self.decode_weights = DecodeWeightCache()  # rebuilt when the model's arrays change
        self._grammars: RowGrammars | None = None  # compiled on first use (needs the tokenizer)

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

    @property
    def grammars(self) -> RowGrammars:
        """The engine's compiled grammars (``RowGrammars``; thread-safe)."""
        if self._grammars is None:
            self._grammars = RowGrammars(self.tokenizer, self.model.config.vocab_size)
        return self._grammars

    def constrained(self, request: Request, grammars: Sequence[Grammar | None], batch: int) -> Request:
        """``request`` with the logits mask of rows with ``grammars`` (a loop of ``batch`` rows);
        unchanged when no row has a grammar. Raises GrammarError (a ValueError) for a grammar
        that cannot be compiled or cannot finish within ``max_new_tokens``."""
        if all(g is None for g in grammars):
            return request
        mask = self.grammars.mask(grammars, request.stop_token_ids, request.max_new_tokens, batch,
                                  self.jump_forward)
        return request if mask is None else dataclasses.replace(request, logits_mask=mask)

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

    def _rows(self, prompts: Sequence[Prompt], params: SamplingParams, images=None):
        """The completion rows of a request (prompt-major, ``params.n`` per prompt) as token
        ids, with their images (None without) and grammars."""
        prompts = validate_prompts(prompts)
        rows = [ids for ids in self._encode(prompts) for _ in range(params.n)]
        grammars = [g for g in params.row_grammars(len(prompts)) for _ in range(params.n)]
        check_token_ids(rows, self.model.config.vocab_size)
        if images is not None:
            if len(images) != len(prompts):
                raise ValueError(f"{len(images)} image lists for {len(prompts)} prompts")
            images = [row for row in images for _ in range(params.n)]
        return rows, images, grammars

    def _calls(self, rows: list[list[int]], key: jax.Array):
        """The sampler calls of ``rows`` (``max_batch_size`` rows each): (first row, rows, key)
        with each call's key: its rows' own keys, or ``key`` folded with the call's index."""
        chunk = self.max_batch_size or len(rows)
        keys = row_keys(key, len(rows))
        for c, start in enumerate(range(0, len(rows), chunk)):
            if keys is not None:
                part_key = keys[start : start + chunk]
            else:
                part_key = jax.random.fold_in(key, c) if chunk < len(rows) else key
            yield start, rows[start : start + chunk], part_key

    def _run(self, prompts: Sequence[Prompt], params: SamplingParams, key: jax.Array,
             keep_caches: bool, images=None):
        """First-turn generation: (completions, rows, session groups, decode steps, the
        unrolled weights used or None, per kept row its RoPE position shift (see Session))."""
        rows, images, grammars = self._rows(prompts, params, images)
        request = self.request(params)
        config = self.sampler_config
        weights = None
        if keep_caches or config.unroll_layers:
            weights = self.decode_weights.get(self.model)
            if keep_caches and weights is None:
                raise TypeError("sessions need a CausalLM-like model (with arrays())")
        graph_and_state = nnx.split(self.model)
        completions: list[Completion] = []
        groups: list[SessionGroup] = []
        shift: list[int] = []  # per row, the last prompt token's position minus its index
        steps = 0
        for start, part, part_key in self._calls(rows, key):
            call = self.constrained(request, grammars[start : start + len(part)], config.batch_size(len(part)))
            loop, n, plen = start_decode(self.model, part, part_key, call, config, graph_and_state, weights,
                                         None if images is None else images[start : start + len(part)])
            if keep_caches:
                last = np.asarray(loop.position)[:n] if images is not None else [len(p) - 1 for p in part]
                shift.extend(int(pos) - (len(p) - 1) for pos, p in zip(last, part))
            out = decode(self.model, weights, loop, call, config, graph_and_state)
            output = SamplerOutput.from_state(out, n, call)
            steps += output.steps
            completions.extend(self.completion(p, output, i, call, params.skip_special_tokens)
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

        ``key`` may also be one key per completion row (a (len(prompts) * n,) key array):
        each row then samples from its own key, whatever else is in the call.
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

    def stream(
        self, prompts: Sequence[Prompt], params: SamplingParams, key: jax.Array, *,
        chunk_steps: int = 16, images=None
    ) -> DecodeStream:
        """Like ``generate`` (same key conventions, same completions in the end), run
        ``chunk_steps`` decode-loop iterations at a time: iterate the returned
        ``DecodeStream`` for each chunk's new tokens per row, ``cancel`` rows between chunks,
        ``completions()`` for the final completions. The prefills run here; chunks reuse the
        one-call decode program (no extra compilation)."""
        rows, images, grammars = self._rows(prompts, params, images)
        request = self.request(params)
        config = self.sampler_config
        weights = self.decode_weights.get(self.model) if config.unroll_layers else None
        graph_and_state = nnx.split(self.model)
        runs = []
        for start, part, part_key in self._calls(rows, key):
            call = self.constrained(request, grammars[start : start + len(part)], config.batch_size(len(part)))
            loop, n, _ = start_decode(self.model, part, part_key, call, config, graph_and_state, weights,
                                      None if images is None else images[start : start + len(part)])
            runs.append((start, DecodeRun(self.model, weights, loop, n, call, config, graph_and_state), part))
        return DecodeStream(self, runs, request, chunk_steps, params.skip_special_tokens)

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
