"""HF (transformers) weight names and shapes: checking, stacking and assigning checkpoint
tensors to our modules, shared by the text and vision-language loaders.

Checkpoint tensors arrive as numpy arrays under HF key names in torch layout ((out, in)
linear weights); :func:`assign_hf_weights` stacks them per layer, transposes to our (in, out)
kernels, checks every shape and builds the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_drive.models.config import ModelConfig
from jax_drive.models.transformer import HF_LAYER_KEYS, PROJECTIONS, CausalLM


class WeightLoadError(ValueError):
    """Missing / malformed checkpoint files or tensors."""


_NORM_KEYS = {"input_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm"}
_PREFIXES = ("model.", "model.language_model.", "language_model.model.", "")


def expected_hf_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF key name -> torch-layout shape for every tensor of `config`'s checkpoint."""
    c = config
    h, f = c.hidden_size, c.intermediate_size
    qd, kvd = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    proj = {
        "q_proj": (qd, h), "k_proj": (kvd, h), "v_proj": (kvd, h), "o_proj": (h, qd),
        "gate_proj": (f, h), "up_proj": (f, h), "down_proj": (h, f),
    }
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, h),
                                          "model.norm.weight": (h,)}
    if not c.tie_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, h)
    for i in range(c.num_layers):
        base = f"model.layers.{i}."
        for name, key in HF_LAYER_KEYS.items():
            shapes[base + key + ".weight"] = proj[name]
        if c.attention_bias:
            for name in ("q_proj", "k_proj", "v_proj"):
                shapes[base + HF_LAYER_KEYS[name] + ".bias"] = (proj[name][0],)
        for key in _NORM_KEYS.values():
            shapes[base + key + ".weight"] = (h,)
    return shapes


def _canonical_names(names: Iterable[str]) -> dict[str, str]:
    """canonical HF name ('model.…' / 'lm_head.weight') -> name as stored."""
    out: dict[str, str] = {}
    for name in names:
        canon = name
        for prefix in ("model.language_model.", "language_model.model."):
            if name.startswith(prefix):
                canon = "model." + name[len(prefix):]
        if name == "language_model.lm_head.weight":
            canon = "lm_head.weight"
        out.setdefault(canon, name)
    return out


def assign_hf_weights(config: ModelConfig, get: Callable[[str], np.ndarray],
                      names: Iterable[str]) -> CausalLM:
    """Builds a CausalLM from HF-named torch-layout tensors.

    Args:
      config: the model config (its dtype is the parameter dtype).
      get: name -> numpy array (any float dtype).
      names: the tensor names available.
    Raises:
      WeightLoadError on missing tensors or shape mismatches.
    """
    available = _canonical_names(names)
    shapes = expected_hf_shapes(config)
    missing = [k for k in shapes if k not in available]
    if missing:
        raise WeightLoadError(
            f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]} "
            f"(architecture {config.architecture}, {config.num_layers} layers)"
        )
    dt = config.jnp_dtype

    def fetch(key: str) -> np.ndarray:
        arr = np.asarray(get(available[key]))
        if tuple(arr.shape) != shapes[key]:
            raise WeightLoadError(
                f"tensor {key!r} has shape {tuple(arr.shape)}, expected {shapes[key]} "
                "for this config"
            )
        return arr.astype(np.float32) if arr.dtype != np.float32 else arr

    def to_param(arr: np.ndarray):
        return jnp.asarray(arr, jnp.float32).astype(dt)

    model = nnx.eval_shape(lambda: CausalLM(config, rngs=nnx.Rngs(0)))
    model.embed.set_value(to_param(fetch("model.embed_tokens.weight")))
    model.final_norm.set_value(to_param(fetch("model.norm.weight")))
    if not config.tie_embeddings:
        model.lm_head.set_value(to_param(fetch("lm_head.weight").T))
    n = config.num_layers
    for name in PROJECTIONS:
        proj = getattr(model.layers, name)
        key = HF_LAYER_KEYS[name]
        kernel = np.stack([fetch(f"model.layers.{i}.{key}.weight").T for i in range(n)])
        proj.kernel.set_value(to_param(kernel))
        if proj.bias is not None:
            bias = np.stack([fetch(f"model.layers.{i}.{key}.bias") for i in range(n)])
            proj.bias.set_value(to_param(bias))
    for attr, key in _NORM_KEYS.items():
        norm = np.stack([fetch(f"model.layers.{i}.{key}.weight") for i in range(n)])
        getattr(model.layers, attr).set_value(to_param(norm))
    return model


def safetensors_tensors(path: str | Path) -> tuple[Callable[[str], np.ndarray], list[str]]:
    """(get, names) over the weights of an HF directory: model.safetensors.index.json's
    shards or every *.safetensors file (adapters excluded); get(name) -> float32 numpy."""
    from safetensors import safe_open

    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({path / f for f in weight_map.values()})
    else:
        files = sorted(path.glob("*.safetensors"))
    files = [f for f in files if not f.name.startswith("adapter_")]
    if not files:
        raise WeightLoadError(f"no *.safetensors weight files in {path}")
    for f in files:
        if not f.is_file():
            raise WeightLoadError(f"shard {f.name} listed in the index is missing from {path}")
    handles = [safe_open(str(f), framework="flax") for f in files]
    where: dict[str, object] = {}
    for handle in handles:
        for key in handle.keys():
            where[key] = handle
    def get(name):
        return np.asarray(where[name].get_tensor(name).astype(jnp.float32))

    return get, list(where)




def unpermute_qk(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's rotary row permutation of a q/k weight (out, in) or bias (out,).

    llama.cpp stores each head's rows interleaved (pairs (0, D/2), (1, D/2+1), ...); HF uses
    the two halves. Inverse of reshape(n, 2, D/2, ...).swapaxes(1, 2).
    """
    rest = w.shape[1:]
    d2 = w.shape[0] // num_heads // 2
    return w.reshape(num_heads, d2, 2, *rest).swapaxes(1, 2).reshape(w.shape)
