"""LoRA adapters: selection as trainable state, merge/unmerge, training only the adapters,
HF safetensors export (loaded back by transformers) and PEFT adapter export.

The PEFT export is checked with the real `peft` library (pinned in requirements-test.txt):
for the tiny random Qwen2 and Llama configs, with non-zero A and B, the base checkpoint from
`save_safetensors` is loaded by transformers and the `export_peft` directory on top of it by
`peft.PeftModel.from_pretrained`. Every exported tensor must be loaded into a PEFT LoRA module
(same key set and values, scaling lora_alpha / r), and float32 logits on padded token batches
must match our JAX model with the adapter applied to ATOL = 1e-4 absolute (measured: ~3e-7),
both through PEFT's adapter layers and after `merge_and_unload()`; PEFT's merged weights must
equal the ones `save_safetensors` folds in.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_drive.models import CausalLM, LoRAParam, ModelConfig, positions_from_mask
from jax_drive.models.export import hf_state_dict
from jax_drive.models.export import export_peft, load_peft, save_safetensors
from jax_drive.models.lora import apply_lora, merge_lora, remove_lora, unmerge_lora
from jax_drive.models.transformer import PROJECTIONS

ATOL = 1e-4


def _model(arch="qwen2", **overrides):
    config = ModelConfig.tiny(arch, vocab_size=96, **overrides)
    return CausalLM(config, rngs=nnx.Rngs(5)), config


def _inputs(config, b=2, l=6, seed=1):
    ids = jax.random.randint(jax.random.key(seed), (b, l), 1, config.vocab_size)
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
    import torch
    import transformers

    return torch, transformers


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


def test_peft_export_format_and_roundtrip(tmp_path):
    model, config = _model("qwen2")
    adapter_dir = tmp_path / "adapter"
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

    # our own loader reads the adapter back
    ids, pos, mask = _inputs(config)
    ours, _ = model(ids, pos, mask)
    fresh = CausalLM(config, rngs=nnx.Rngs(5))
    load_peft(fresh, adapter_dir)
    np.testing.assert_allclose(fresh(ids, pos, mask)[0], ours, atol=1e-6)
    merge_lora(model)
    with pytest.raises(ValueError, match="unmerge"):
        export_peft(model, tmp_path / "merged")


# arch -> (rank, lora_alpha, targets): a subset with an integer alpha / r, and every projection
# with a fractional scale (7.5 / 3), so names, layout and scaling are all exercised.
PEFT_CASES = {
    "qwen2": (4, 16, ("q_proj", "k_proj", "o_proj", "up_proj")),
    "llama": (3, 7.5, PROJECTIONS),
}


@pytest.mark.filterwarnings("error:Found missing adapter keys")  # a name PEFT did not load
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize("arch", sorted(PEFT_CASES))
def test_peft_adapter_loaded_by_peft_matches(arch, tmp_path, hf_libs):
    """PeftModel.from_pretrained(base, export_peft(...)) gives our logits, merged or not."""
    torch, transformers = hf_libs
    import peft

    model, config = _model(arch)
    base_dir, adapter_dir = tmp_path / "base", tmp_path / "adapter"
    save_safetensors(model, base_dir)  # base weights only: no adapters yet
    rank, alpha, targets = PEFT_CASES[arch]
    apply_lora(model, rank=rank, alpha=alpha, targets=targets)
    _randomise_b(model, seed=3)  # non-zero A and B
    export_peft(model, adapter_dir)

    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    peft_model = peft.PeftModel.from_pretrained(base.eval(), adapter_dir).eval()
    # every exported tensor landed in a PEFT LoRA module (nothing missing or left over)
    from safetensors.numpy import load_file

    exported = load_file(str(adapter_dir / "adapter_model.safetensors"))
    loaded = peft.get_peft_model_state_dict(peft_model)
    assert sorted(loaded) == sorted(exported)
    for name, value in exported.items():
        np.testing.assert_array_equal(loaded[name].numpy(), value)
    lora_layers = [m for m in peft_model.modules() if isinstance(m, peft.tuners.lora.LoraLayer)]
    assert len(lora_layers) == len(targets) * config.num_layers
    assert all(abs(m.scaling["default"] - alpha / rank) < 1e-12 for m in lora_layers)

    batches = [_inputs(config), _inputs(config, b=3, l=9, seed=7)]
    for ids, pos, mask in batches:
        m = np.asarray(mask)
        ours = np.asarray(model(ids, pos, mask)[0])[m]
        ref = _hf_logits(peft_model, ids, pos, mask)[m]
        with peft_model.disable_adapter():
            plain = _hf_logits(peft_model, ids, pos, mask)[m]
        assert np.abs(ref - plain).max() > 1e-2  # the adapter is live in PEFT
        np.testing.assert_allclose(ours, ref, atol=ATOL, rtol=0)

    merged = peft_model.merge_and_unload().eval()
    assert not any(isinstance(m, peft.tuners.lora.LoraLayer) for m in merged.modules())
    for ids, pos, mask in batches:
        m = np.asarray(mask)
        ours = np.asarray(model(ids, pos, mask)[0])[m]
        np.testing.assert_allclose(ours, _hf_logits(merged, ids, pos, mask)[m], atol=ATOL, rtol=0)
    # PEFT's merged weights are the ones save_safetensors folds in
    folded = hf_state_dict(model)
    merged_sd = merged.state_dict()
    for name, value in folded.items():
        np.testing.assert_allclose(merged_sd[name].numpy(), np.asarray(value), atol=1e-6, rtol=0)
