"""Export of `CausalLM` weights: HF safetensors (+ config.json) and PEFT LoRA adapters.

Key names follow transformers' Llama / Qwen2 modules (`model.layers.{i}.self_attn.q_proj.
weight`, ...) with torch's (out, in) linear layout; PEFT adapters use PEFT's names
(`base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight` (r, in) and `lora_B.weight`
(out, r)) with an `adapter_config.json` for a LoRA CAUSAL_LM adapter.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from jax_drive.models.layers import fold_lora
from jax_drive.models.transformer import HF_LAYER_KEYS, PROJECTIONS, CausalLM


def hf_state_dict(model: CausalLM) -> dict[str, jnp.ndarray]:
    """HF name -> array (torch layout, model dtype); LoRA adapters folded in."""
    if not isinstance(model, CausalLM):
        raise TypeError(f"expected a CausalLM, got {type(model).__name__}")
    config = model.config
    out: dict[str, jnp.ndarray] = {
        "model.embed_tokens.weight": model.embed[...],
        "model.norm.weight": model.final_norm[...],
    }
    if model.lm_head is not None:
        out["lm_head.weight"] = model.lm_head[...].T
    for name in PROJECTIONS:
        proj = getattr(model.layers, name)
        kernel = fold_lora(proj.arrays())  # an unmerged adapter folded in
        for i in range(config.num_layers):
            base = f"model.layers.{i}.{HF_LAYER_KEYS[name]}"
            out[base + ".weight"] = kernel[i].T
            if proj.bias is not None:
                out[base + ".bias"] = proj.bias[...][i]
    for i in range(config.num_layers):
        out[f"model.layers.{i}.input_layernorm.weight"] = model.layers.input_norm[...][i]
        out[f"model.layers.{i}.post_attention_layernorm.weight"] = (
            model.layers.post_attention_norm[...][i]
        )
    return out


def save_tensors(tensors: dict[str, jnp.ndarray], out: Path, stem: str,
                  max_shard_bytes: int) -> list[str]:
    from safetensors.flax import save_file

    tensors = {k: jnp.asarray(v) for k, v in tensors.items()}
    shards: list[dict[str, jnp.ndarray]] = [{}]
    size = 0
    for key in sorted(tensors):
        nbytes = tensors[key].size * tensors[key].dtype.itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = tensors[key]
        size += nbytes
    if len(shards) == 1:
        name = f"{stem}.safetensors"
        save_file(shards[0], str(out / name), metadata={"format": "pt"})
        return [name]
    names = []
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"{stem}-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / name), metadata={"format": "pt"})
        names.append(name)
        weight_map.update({k: name for k in shard})
    total = sum(v.size * v.dtype.itemsize for v in tensors.values())
    (out / f"{stem}.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": int(total)}, "weight_map": weight_map}, indent=2)
    )
    return names


def save_safetensors(model: CausalLM, out_dir: str | Path, tokenizer=None,
                     max_shard_bytes: int = 4 * 2**30) -> Path:
    """Writes a transformers-loadable checkpoint: config.json + model(-0000i-of-n).safetensors.

    Unmerged LoRA adapters are folded into the saved weights (the model is not modified).
    With a `Tokenizer`, its files are written as well. Returns the output directory.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_tensors(hf_state_dict(model), out, "model", max_shard_bytes)
    (out / "config.json").write_text(json.dumps(model.config.to_hf(), indent=2))
    if tokenizer is not None:
        tokenizer.save(out)
    return out


def export_peft(model: CausalLM, out_dir: str | Path, base_model_name: str = "",
                layers_prefix: str = "model.layers", target_modules: str | None = None) -> Path:
    """Writes adapter_config.json + adapter_model.safetensors in PEFT's LoRA format.

    lora_A.weight is A^T (r, in), lora_B.weight is B^T (out, r), so PEFT computes
    W x + B_peft A_peft x * lora_alpha / r, the same update as ours.
    layers_prefix: module path of the decoder layers in the HF model ('model.layers' for
    Llama / Qwen2; e.g. 'model.language_model.layers' inside a vision-language model).
    target_modules: PEFT's target_modules (a regex string, e.g. to keep a vision tower out);
    default: the list of adapted projection names.
    Raises ValueError when the model has no adapters or the adapters are merged.
    """
    if not isinstance(model, CausalLM):
        raise TypeError(f"expected a CausalLM, got {type(model).__name__}")
    projs = {n: getattr(model.layers, n) for n in PROJECTIONS
             if getattr(model.layers, n).lora_a is not None}
    if not projs:
        raise ValueError("the model has no LoRA adapters to export")
    if any(p.lora_merged for p in projs.values()):
        raise ValueError("unmerge the LoRA adapters before exporting them")
    ranks = {p.lora_rank for p in projs.values()}
    alphas = {p.lora_alpha for p in projs.values()}
    if len(ranks) != 1 or len(alphas) != 1:
        raise ValueError(f"adapters must share one rank/alpha, got {ranks} / {alphas}")
    alpha = alphas.pop()
    alpha = int(alpha) if float(alpha).is_integer() else float(alpha)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, np.ndarray] = {}
    for name, proj in projs.items():
        a = proj.lora_a[...]
        b = proj.lora_b[...]
        for i in range(model.config.num_layers):
            base = f"base_model.model.{layers_prefix}.{i}.{HF_LAYER_KEYS[name]}"
            tensors[base + ".lora_A.weight"] = a[i].T.astype(jnp.float32)
            tensors[base + ".lora_B.weight"] = b[i].T.astype(jnp.float32)
    save_tensors(tensors, out, "adapter_model", max_shard_bytes=2**62)
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name,
        "r": ranks.pop(),
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": sorted(projs) if target_modules is None else target_modules,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "layers_to_transform": None,
        "revision": None,
    }
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))
    return out


def load_peft(model: CausalLM, adapter_dir: str | Path, layers_prefix: str = "model.layers",
              targets: tuple[str, ...] | None = None) -> CausalLM:
    """Applies a PEFT LoRA adapter directory (as written by `export_peft`) to `model` in place.

    layers_prefix: as in `export_peft`. targets: the adapted projections; default: those
    named in the adapter's target_modules list, or (regex target_modules) those with
    tensors under ``layers_prefix``.

    Raises FileNotFoundError / ValueError for missing files, non-LoRA adapters, unknown target
    modules or shape mismatches.
    """
    from safetensors.numpy import load_file

    from jax_drive.models.lora import apply_lora

    adapter_dir = Path(adapter_dir)
    cfg_file = adapter_dir / "adapter_config.json"
    weights = adapter_dir / "adapter_model.safetensors"
    for f in (cfg_file, weights):
        if not f.is_file():
            raise FileNotFoundError(f"PEFT adapter file {f} is missing")
    cfg = json.loads(cfg_file.read_text())
    if cfg.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"only LoRA adapters are supported, got {cfg.get('peft_type')!r}")
    if cfg.get("use_rslora") or cfg.get("use_dora") or cfg.get("fan_in_fan_out"):
        raise ValueError("rsLoRA / DoRA / fan_in_fan_out adapters are not supported")
    tensors = load_file(str(weights))
    if targets is None:
        targets = cfg.get("target_modules") or []
        if isinstance(targets, str):  # a regex: adapted projections are those with tensors
            targets = [t for t in PROJECTIONS if f"base_model.model.{layers_prefix}.0."
                       f"{HF_LAYER_KEYS[t]}.lora_A.weight" in tensors]
    targets = [t for t in PROJECTIONS if t in targets]
    if not targets:
        raise ValueError(f"no adapted projections found in {adapter_dir} under {layers_prefix!r}")
    rank, alpha = int(cfg["r"]), float(cfg["lora_alpha"])
    apply_lora(model, rank, alpha, targets)
    n = model.config.num_layers
    for name in targets:
        proj = getattr(model.layers, name)
        a, b = [], []
        for i in range(n):
            base = f"base_model.model.{layers_prefix}.{i}.{HF_LAYER_KEYS[name]}"
            try:
                a_i = tensors[base + ".lora_A.weight"]
                b_i = tensors[base + ".lora_B.weight"]
            except KeyError as error:
                raise ValueError(f"adapter lacks tensor {error.args[0]!r}") from None
            a.append(a_i.T)
            b.append(b_i.T)
        a_arr, b_arr = np.stack(a), np.stack(b)
        if a_arr.shape != proj.lora_a.shape or b_arr.shape != proj.lora_b.shape:
            raise ValueError(
                f"{name}: adapter shapes {a_arr.shape}/{b_arr.shape} do not match the model "
                f"{proj.lora_a.shape}/{proj.lora_b.shape}"
            )
        proj.lora_a.set_value(jnp.asarray(a_arr, jnp.float32))
        proj.lora_b.set_value(jnp.asarray(b_arr, jnp.float32))
    return model
