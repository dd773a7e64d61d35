"""LoRA adapters: selection as trainable state, merge/unmerge, training only the adapters,
HF safetensors export (loaded back by transformers) and PEFT adapter export.

`peft` is not installed here, so the PEFT test applies the exported adapter to the
transformers model by hand: for every `...{proj}.lora_A.weight` / `lora_B.weight` pair read
from adapter_model.safetensors with PEFT's key names, W <- W + B @ A * lora_alpha / r, which
is exactly what PEFT's LoRA Linear computes (no dropout, no rsLoRA, fan_in_fan_out=False).
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_drive.models import CausalLM, LoRAParam, ModelConfig, positions_from_mask
from jax_drive.models.lora import (
    apply_lora,
    export_peft,
    load_peft,
    merge_lora,
    remove_lora,
    save_safetensors,
    unmerge_lora,
)

ATOL = 1e-4


def _model(arch="qwen2", **overrides):
    config = ModelConfig.tiny(arch, vocab_size=96, **overrides)
    return CausalLM(config, rngs=nnx.Rngs(5)), config


def _inputs(config, b=2, l=6):
    ids = jax.random.randint(jax.random.key(1), (b, l), 1, config.vocab_size)
    mask = jnp.ones((b, l), bool).at[1, :2].set(False)
    return ids, positions_from_mask(mask), mask


def _randomise_b(model, seed=0, scale=0.05):
    state = nnx.state(model, LoRAParam)
    key = jax.random.key(seed)
    leaves, tree = jax.tree.flatten(state)
    leaves = [leaf + scale * jax.random.normal(jax.random.fold_in(key, i), leaf.shape)
              for i, leaf in enumerate(leaves)]
    nnx.update(model, jax.tree.unflatten(tree, leaves))


def test_apply_lora_selects_only_adapters_and_starts_at_identity():
    model, config = _model()
    ids, pos, mask = _inputs(config)
    before, _ = model(ids, pos, mask)
    apply_lora(model, rank=4, alpha=8.0, targets=("q_proj", "v_proj", "down_proj"))
    lora_state = nnx.state(model, LoRAParam)
    paths = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(lora_state)]
    assert len(paths) == 6
    assert all("lora_a" in k or "lora_b" in k for k in paths), paths
    assert model.layers.q_proj.lora_a.shape == (config.num_layers, config.hidden_size, 4)
    assert model.layers.down_proj.lora_b.shape == (config.num_layers, 4, config.hidden_size)
    assert model.layers.k_proj.lora_a is None
    after, _ = model(ids, pos, mask)
    np.testing.assert_allclose(after, before, atol=1e-6)  # B = 0
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    n_lora = sum(x.size for x in jax.tree.leaves(lora_state))
    assert 0 < n_lora < n_params


def test_apply_lora_errors():
    model, _ = _model()
    with pytest.raises(ValueError, match="rank"):
        apply_lora(model, rank=0, alpha=1.0)
    with pytest.raises(ValueError, match="unknown"):
        apply_lora(model, rank=2, alpha=1.0, targets=("qkv",))
    apply_lora(model, rank=2, alpha=1.0, targets=("q_proj",))
    with pytest.raises(ValueError, match="already"):
        apply_lora(model, rank=2, alpha=1.0, targets=("q_proj",))
    with pytest.raises(TypeError):
        apply_lora(object(), rank=2, alpha=1.0)


def test_merge_unmerge_roundtrip():
    model, config = _model("llama")
    ids, pos, mask = _inputs(config)
    base, _ = model(ids, pos, mask)
    kernel0 = np.asarray(model.layers.up_proj.kernel[...])
    apply_lora(model, rank=3, alpha=6.0)
    _randomise_b(model)
    adapted, _ = model(ids, pos, mask)
    assert float(jnp.abs(adapted - base).max()) > 1e-3  # the adapter matters
    merge_lora(model)
    assert not np.allclose(model.layers.up_proj.kernel[...], kernel0)
    merged, _ = model(ids, pos, mask)
    np.testing.assert_allclose(merged, adapted, atol=ATOL)
    merge_lora(model)  # idempotent
    np.testing.assert_allclose(model(ids, pos, mask)[0], adapted, atol=ATOL)
    unmerge_lora(model)
    np.testing.assert_allclose(model.layers.up_proj.kernel[...], kernel0, atol=1e-6)
    np.testing.assert_allclose(model(ids, pos, mask)[0], adapted, atol=ATOL)
    remove_lora(model)
    assert model.layers.up_proj.lora_a is None
    np.testing.assert_allclose(model(ids, pos, mask)[0], base, atol=1e-5)


def test_training_updates_only_adapters():
    model, config = _model()
    apply_lora(model, rank=4, alpha=8.0)
    ids, pos, mask = _inputs(config)
    targets = jnp.roll(ids, -1, axis=1)
    frozen = jax.tree.map(np.asarray, nnx.state(model, nnx.Not(LoRAParam)))

    def loss_fn(m):
        return -jnp.mean(m.token_logprobs(ids, pos, mask, targets, chunk_size=4))

    grad_fn = nnx.jit(nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, LoRAParam)))
    losses = []
    for _ in range(4):
        loss, grads = grad_fn(model)
        losses.append(float(loss))
        state = nnx.state(model, LoRAParam)
        nnx.update(model, jax.tree.map(lambda p, g: p - 0.5 * g, state, grads))
    assert losses[-1] < losses[0] - 1e-3
    for a, b in zip(jax.tree.leaves(frozen),
                    jax.tree.leaves(nnx.state(model, nnx.Not(LoRAParam)))):
        np.testing.assert_array_equal(a, b)


def test_bfloat16_model_with_lora():
    model, config = _model("llama", dtype="bfloat16")
    apply_lora(model, rank=2, alpha=4.0)
    assert model.layers.q_proj.lora_a[...].dtype == jnp.float32
    _randomise_b(model)
    ids, pos, mask = _inputs(config)
    logits, _ = model(ids, pos, mask)
    assert logits.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(logits)))


# ----------------------------------------------------------------------------- exports
@pytest.fixture(scope="module")
def hf_libs():
    return pytest.importorskip("torch"), pytest.importorskip("transformers")


def _hf_logits(hf, ids, pos, mask):
    import torch

    with torch.no_grad():
        return hf(input_ids=torch.tensor(np.asarray(ids), dtype=torch.long),
                  attention_mask=torch.tensor(np.asarray(mask), dtype=torch.long),
                  position_ids=torch.tensor(np.asarray(pos), dtype=torch.long)).logits.numpy()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_full_export_loads_in_transformers(arch, tmp_path, hf_libs):
    torch, transformers = hf_libs
    model, config = _model(arch, tie_embeddings=arch == "llama")
    apply_lora(model, rank=4, alpha=8.0)
    _randomise_b(model)
    ids, pos, mask = _inputs(config)
    ours, _ = model(ids, pos, mask)
    save_safetensors(model, tmp_path)  # adapters folded in, model untouched
    assert model.layers.q_proj.lora_merged is False
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ref = _hf_logits(hf, ids, pos, mask)
    m = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(ours)[m], ref[m], atol=ATOL, rtol=0)


def test_peft_export_matches_manual_application(tmp_path, hf_libs):
    torch, transformers = hf_libs
    model, config = _model("qwen2")
    base_dir, adapter_dir = tmp_path / "base", tmp_path / "adapter"
    save_safetensors(model, base_dir)
    rank, alpha = 4, 16
    apply_lora(model, rank=rank, alpha=alpha, targets=("q_proj", "k_proj", "o_proj", "up_proj"))
    _randomise_b(model, seed=3)
    with pytest.raises(ValueError, match="no LoRA"):
        export_peft(CausalLM(config), tmp_path / "none")
    export_peft(model, adapter_dir, base_model_name="tiny-qwen2")
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["task_type"] == "CAUSAL_LM"
    assert cfg["r"] == rank and cfg["lora_alpha"] == alpha
    assert sorted(cfg["target_modules"]) == ["k_proj", "o_proj", "q_proj", "up_proj"]
    assert cfg["base_model_name_or_path"] == "tiny-qwen2"

    from safetensors.numpy import load_file

    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    assert len(tensors) == 2 * 4 * config.num_layers
    key = "base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight"
    assert tensors[key].shape == (rank, config.hidden_size)
    assert tensors[key.replace("lora_A", "lora_B")].shape == (
        config.num_kv_heads * config.head_dim, rank)

    hf = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    modules = dict(hf.named_modules())
    with torch.no_grad():
        for name, a in tensors.items():
            if not name.endswith("lora_A.weight"):
                continue
            b = tensors[name.replace("lora_A", "lora_B")]
            module_name = name[len("base_model.model."):-len(".lora_A.weight")]
            linear = modules[module_name]
            linear.weight += torch.from_numpy(b @ a) * (cfg["lora_alpha"] / cfg["r"])
    ids, pos, mask = _inputs(config)
    ours, _ = model(ids, pos, mask)
    ref = _hf_logits(hf, ids, pos, mask)
    m = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(ours)[m], ref[m], atol=ATOL, rtol=0)

    # and our own loader reads the adapter back
    fresh = CausalLM(config, rngs=nnx.Rngs(5))
    load_peft(fresh, adapter_dir)
    np.testing.assert_allclose(fresh(ids, pos, mask)[0], ours, atol=1e-6)
    merge_lora(model)
    with pytest.raises(ValueError, match="unmerge"):
        export_peft(model, tmp_path / "merged")
