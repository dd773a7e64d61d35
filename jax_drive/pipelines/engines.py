"""The one engine factory of the pipelines: which model, and which engine serves it.

Every pipeline builds its language models and engines here, from two small specs:
:class:`ModelSpec` (a ``load_pretrained`` source or a random tiny model, fresh LoRA adapters
or a trained adapter merged in, training-time settings) and :class:`EngineSpec` (the local
:class:`~jax_drive.sampling.JaxEngine` with its shape buckets, or an OpenAI-compatible
server such as vLLM or ``jax-drive serve``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jax_drive.sampling import PromptLookup

ENGINE_KINDS = ("jax", "openai")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A language model to load.

    Attributes:
      source: a ``load_pretrained`` source ('smollm2-135m-instruct', a safetensors directory,
        a GGUF file), 'tiny' / 'tiny-1m' (a random tiny model over the byte tokenizer, of
        that size) or 'tiny-vlm' (a random tiny Qwen2.5-VL with the vision tokens).
      seed: initialisation of a random tiny model.
      lora_rank, lora_alpha, lora_seed: fresh LoRA adapters (rank 0: none), A initialised
        from ``lora_seed``.
      adapter: a trained PEFT adapter directory, merged into the weights (before any fresh
        adapters: with ``lora_rank`` too, training continues from the merged model).
      remat_layers, frozen_layers: ``ModelConfig`` training settings (None: the model's own).
    """

    source: str
    seed: int = 0
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_seed: int = 1
    adapter: str | None = None
    remat_layers: bool | None = None
    frozen_layers: int | None = None


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """How to serve a model.

    Attributes:
      kind: 'jax' (in-process sampler) or 'openai' (a server at ``url``).
      prompt_buckets: padded prompt lengths of the local sampler (None: powers of two).
      min_gen_bucket: smallest generation-budget bucket of the local sampler (None: its default).
      max_batch: rows per local sampler call (None: all).
      prompt_lookup: prompt-lookup speculative decoding of the local engine (None: off).
      url, served_model, max_concurrency: the server, its model name, concurrent requests.
    """

    kind: str = "jax"
    prompt_buckets: tuple[int, ...] | None = None
    min_gen_bucket: int | None = None
    max_batch: int | None = None
    prompt_lookup: PromptLookup | None = None
    url: str | None = None
    served_model: str | None = None
    max_concurrency: int = 64

    def __post_init__(self):
        if self.kind not in ENGINE_KINDS:
            raise ValueError(f"unknown engine {self.kind!r}; choose from {', '.join(ENGINE_KINDS)}")
        if self.kind == "openai" and not self.url:
            raise ValueError("an 'openai' engine needs a server url")


def bucket_range(step: int, top: int) -> tuple[int, ...]:
    """Prompt buckets every ``step`` tokens up to ``top``: (step, 2 step, ..., <= top)."""
    return tuple(range(step, top + 1, step))


def load_model(spec: ModelSpec) -> tuple[Any, Any]:
    """(model, tokenizer) as ``spec`` says."""
    from flax import nnx

    from jax_drive.models.tiny import TINY_SIZES, tiny_policy

    if spec.source in TINY_SIZES:
        model, _, tokenizer = tiny_policy(seed=spec.seed, lora_rank=None, size=spec.source)
    elif spec.source == "tiny-vlm":
        from jax_drive.models.tiny import tiny_vlm_policy

        model, _, tokenizer = tiny_vlm_policy(seed=spec.seed, lora_rank=None)
    else:
        from jax_drive.models import load_pretrained

        model, _, tokenizer = load_pretrained(spec.source)
    if spec.adapter is not None:
        from jax_drive.models.export import load_peft
        from jax_drive.models.lora import remove_lora

        remove_lora(load_peft(model, spec.adapter), merge=True)  # fold the trained adapter in
    if spec.lora_rank:  # fresh adapters (on top of a folded-in one: training continues from it)
        from jax_drive.models.lora import apply_lora

        apply_lora(model, rank=spec.lora_rank, alpha=spec.lora_alpha, rngs=nnx.Rngs(spec.lora_seed))
    settings = {k: v for k, v in (("remat_layers", spec.remat_layers), ("frozen_layers", spec.frozen_layers))
                if v is not None}
    if settings:
        model.config = dataclasses.replace(model.config, **settings)
    return model, tokenizer


def make_engine(spec: EngineSpec, model=None, tokenizer=None, model_name: str | None = None):
    """The engine ``spec`` describes: a local one over ``model`` / ``tokenizer``, or a client
    of the server (``served_model`` or else ``model_name``)."""
    if spec.kind == "openai":
        from jax_drive.sampling import OpenAIEngine

        return OpenAIEngine(spec.url, spec.served_model or model_name, max_concurrency=spec.max_concurrency)
    from jax_drive.sampling import JaxEngine
    from jax_drive.sampling.sampler import SamplerConfig

    sampler = {"prompt_buckets": spec.prompt_buckets}
    if spec.min_gen_bucket is not None:
        sampler["min_gen_bucket"] = spec.min_gen_bucket
    return JaxEngine(model, tokenizer, SamplerConfig(**sampler), max_batch_size=spec.max_batch,
                     prompt_lookup=spec.prompt_lookup)
