"""Jitted KV-cache sampler for a ``jax_drive.models.protocol.DecoderLM`` (``CausalLM``,
``Qwen2_5_VL``): the entry points.

One call (``generate_tokens``, or ``start_decode`` then ``decode.decode``) is four steps,
each in its own module:

1. **plan** (``plan.plan_prefill``, host, pure): bucketed shapes, rows sharing a prefill,
   the common prefix, packing;
2. **cache** (``cache.prefill``, jitted): the KV cache of the prompts and the loop state
   before step 0;
3. **decode** (``decode.decode``, jitted ``lax.while_loop``, loop state donated): one token
   per row and step, or K verified drafts with prompt lookup; in one call or in chunks;
4. **outputs** (``outputs.SamplerOutput``): tokens, log-probs, lengths and stop flags on the
   host.

Sampling-only settings (temperature, top-k/p values, stop ids, min/max new tokens, pad id)
are traced values, so changing them never recompiles; greedy vs sampled, filtering on/off,
the log-prob mode and the prompt-lookup settings are static (``request``). Multi-turn
continuation of the rows of a call (their caches kept on the device) is ``session``; several
devices: ``SamplerConfig.mesh``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from flax import nnx

from jax_drive.models.protocol import DecoderLM, VisionLM
from jax_drive.parallel import make_mesh
from jax_drive.sampling.cache import prefill, sampler_prefill
from jax_drive.sampling.compiles import CompileCounter
from jax_drive.sampling.constraints import NO_MASK, LogitsMask
from jax_drive.sampling.decode import decode, sampler_decode_generic, sampler_decode_unrolled
from jax_drive.sampling.outputs import SamplerOutput
from jax_drive.sampling.plan import (
    common_prefix_length,
    generation_slots,
    plan_prefill,
    prefill_plan,
    unique_rows,
)
from jax_drive.sampling.request import Request, batch_key, check_token_ids, row_keys
from jax_drive.sampling.shapes import SamplerConfig, bucket_size, count_bucket, left_pad
from jax_drive.sampling.speculative import PromptLookup
from jax_drive.sampling.state import DecodeState
from jax_drive.sampling.weights import DecodeWeightCache, unrolled_weights

__all__ = [  # the entry points, and the names callers outside the package import from here
    "DecodeWeightCache", "Request", "SamplerConfig", "SamplerOutput", "bucket_size", "check_images",
    "check_model", "check_token_ids", "common_prefix_length", "compiled_programs", "count_bucket", "decode",
    "generate_tokens", "generation_slots", "left_pad", "prefill_plan", "row_keys", "start_decode",
    "unique_rows", "unrolled_weights",
]


def check_model(model) -> None:
    """Raises TypeError for a model the sampler cannot drive (see ``DecoderLM``)."""
    if not isinstance(model, DecoderLM):
        missing = [name for name in ("config", "prefill", "arrays") if not hasattr(model, name)]
        raise TypeError(f"{type(model).__name__} is not a DecoderLM (jax_drive.models.protocol): "
                        f"it lacks {', '.join(missing) or '__call__'}")


def check_images(model, prompts: Sequence[Sequence[int]], images) -> None:
    """Raises for images a call cannot take: a text-only model, one list per prompt missing,
    or a prompt that ends inside an image (decoding continues with text positions)."""
    if images is None:
        return
    if not isinstance(model, VisionLM):
        raise TypeError(f"{type(model).__name__} is a text-only model: it takes no images")
    if len(images) != len(prompts):
        raise ValueError(f"{len(images)} image lists for {len(prompts)} prompts")
    image_id = model.config.image_token_id
    if any(p[-1] == image_id for p in prompts):
        raise ValueError("a prompt with images must end with text, not an image token")


def start_decode(model: DecoderLM, prompts: list[list[int]], key: jax.Array, request: Request,
                 config: SamplerConfig, graph_and_state=None, weights=None,
                 images=None) -> tuple[DecodeState, int, int]:
    """Prefill of a call: (loop state before step 0, rows R, prompt bucket P).

    ``key``: one PRNG key or one per prompt (see ``request.row_keys``). ``weights`` selects the
    unrolled path (LayerCache); None the generic one (KVCache). ``images``: see
    :func:`generate_tokens`.
    """
    check_model(model)
    check_images(model, prompts, images)
    # rows share a prefill when their tokens and their image objects are the same
    share_keys = None if images is None else [p + [id(im) for im in (row or ())] + [len(row or ())]
                                              for p, row in zip(prompts, images)]
    plan = plan_prefill(prompts, request, config, max_positions=model.config.max_position_embeddings,
                        packable=not isinstance(model, VisionLM), share_keys=share_keys)
    mesh = make_mesh(config.mesh)  # rows split over the devices, weights on every one
    positions = vision = None
    if images is not None:
        rows_images = [images[i] for i in plan.prefill_rows]
        positions, vision, _ = model.multimodal_inputs(
            plan.ids, plan.mask, rows_images + [None] * (len(plan.ids) - len(rows_images)))
    loop = prefill(model, plan, batch_key(key, plan.rows, plan.batch), graph_and_state,
                   per_layer=weights is not None, mesh=mesh, positions=positions, vision=vision)
    return loop, plan.rows, plan.prompt_len


def compiled_programs(counter: CompileCounter) -> dict[str, int]:
    """The sampler's prefill and decode executables ``counter`` saw being built: a new one per
    new shape bucket or static setting."""
    return {"prefill": counter.count(sampler_prefill),
            "decode": counter.count(sampler_decode_unrolled, sampler_decode_generic)}


def prepare_call(model: DecoderLM, prompts: Sequence[Sequence[int]], request: Request, config: SamplerConfig,
                 weights: dict | None) -> tuple[list[list[int]], dict | None]:
    """Checks a call at the boundary: (the prompts as int lists, the decode weights to use:
    ``weights``, built when None and ``config.unroll_layers``, None for the generic path)."""
    check_model(model)
    prompts = [list(map(int, p)) for p in prompts]
    if not prompts:
        raise ValueError("no prompts")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    request.check(model.config.vocab_size)
    check_token_ids(prompts, model.config.vocab_size)
    if not config.unroll_layers:
        return prompts, None
    return prompts, unrolled_weights(model) if weights is None else weights


def generate_tokens(
    model: DecoderLM,
    prompts: Sequence[Sequence[int]],
    key: jax.Array,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    stop_token_ids: Sequence[int] = (),
    min_new_tokens: int = 0,
    pad_id: int = 0,
    logprobs_mode: str = "raw",
    config: SamplerConfig = SamplerConfig(),
    graph_and_state: tuple[Any, Any] | None = None,
    weights: dict | None = None,
    prompt_lookup: PromptLookup | None = None,
    images: Sequence[Sequence[Any] | None] | None = None,
    logits_mask: LogitsMask = NO_MASK,
) -> SamplerOutput:
    """Samples continuations of token-id prompts with the jitted KV-cache sampler.

    Args:
      model: a ``DecoderLM`` (``jax_drive.models.CausalLM`` or a subclass).
      prompts: R non-empty token-id lists (any lengths; left-padded here).
      key: PRNG key, or R keys (a (R,) key array): row r then samples from ``key[r]`` only,
        whatever the other rows. Equal keys and inputs give equal outputs.
      max_new_tokens, temperature, top_p, top_k, stop_token_ids, min_new_tokens,
      logprobs_mode: see ``SamplingParams`` (temperature 0 = greedy).
      pad_id: token id used for padding (inputs and outputs).
      config: shape bucketing and prefix sharing.
      graph_and_state: ``nnx.split(model)`` when the caller already has it.
      weights: the model's unrolled decode weights when the caller keeps them
        (``DecodeWeightCache``); built here when None and ``config.unroll_layers``.
      prompt_lookup: speculative decoding by prompt lookup (None: one token per step).
        Greedy outputs are unchanged; sampled ones keep their distribution, not their values.
      images: for a vision-language model, per prompt the processed images whose
        ``<|image_pad|>`` tokens (already expanded) the prompt holds, in reading order (None
        or empty for a text-only prompt); the model lays them out (``multimodal_inputs``).
      logits_mask: a per-row constraint (``constraints.LogitsMask``, e.g. a
        ``grammar.GrammarMask`` whose rows are the call's loop rows: ``config.batch_size(R)``).

    Returns:
      SamplerOutput with (R, max_new_tokens) arrays.
    """
    request = Request(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                      top_k=top_k, stop_token_ids=tuple(int(s) for s in stop_token_ids),
                      min_new_tokens=min_new_tokens, pad_id=pad_id, logprobs_mode=logprobs_mode,
                      prompt_lookup=prompt_lookup, logits_mask=logits_mask)
    prompts, weights = prepare_call(model, prompts, request, config, weights)
    graph_and_state = graph_and_state if graph_and_state is not None else nnx.split(model)
    loop, rows, _ = start_decode(model, prompts, key, request, config, graph_and_state, weights, images)
    out = decode(model, weights, loop, request, config, graph_and_state)
    return SamplerOutput.from_state(out, rows, request)

