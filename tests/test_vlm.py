"""Qwen2.5-VL in flax.nnx against transformers (torch, CPU) on a tiny random Qwen2_5_VLConfig.

The reference model is built offline (no download): 2 language layers (H = 64, M-RoPE
sections (2, 3, 3)), a 3-block vision tower (C = 32, block 1 with full attention, 56 px
windows = 2 x 2 merged tokens, so images of 8 x 12 patches already have several windows and
6 x 4 / 10 x 6 patch images have partial ones), random non-trivial norms and biases, saved
with `save_pretrained` and loaded by `load_vlm`. Tolerance 1e-4 absolute in float32
(measured ~2e-7). Checked: the vision tower's merged tokens, the image tokens scattered into
the `<|image_pad|>` embeddings, M-RoPE position ids against `get_rope_index` (left padding,
one and two images, text-only rows), full-model logits for a left-padded batch holding a row
with two images of different sizes, a row with one image and a text-only row, and for a
text-only batch; cached generation through the sampler (both decode paths) equal to the
uncached argmax loop and to transformers' greedy `generate`; both checkpoint key layouts,
the flat 4.x config, bfloat16 checkpoints; LoRA (training only the adapters, the trainer's
`token_logprobs` with images); checkpoint export loaded by transformers; PEFT adapters loaded
by `peft` onto transformers' model.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jax_drive.models import LoRAParam, init_cache, positions_from_mask  # noqa: E402
from jax_drive.models.loading import load_model, load_vlm  # noqa: E402
from jax_drive.models.lora import apply_lora  # noqa: E402
from jax_drive.models.qwen2_5_vl import (  # noqa: E402
    Qwen2_5_VL, VisionBatch, VisionSizes, VLMConfig, mrope_positions, mrope_tables)
from jax_drive.models.qwen2_5_vl.loading import export_vlm_peft, load_vlm_peft, save_vlm  # noqa: E402
from jax_drive.models.qwen2_5_vl.model import embed_inputs  # noqa: E402
from jax_drive.models.layers import rope_tables  # noqa: E402
from jax_drive.sampling.sampler import SamplerConfig, generate_tokens  # noqa: E402

ATOL = 1e-4
IMAGE, START, END = 150, 148, 149
GRIDS = np.array([[1, 8, 12], [1, 6, 4], [1, 10, 6]])  # patch grids: 24, 6 and 15 tokens


def _hf_config():
    config = transformers.Qwen2_5_VLConfig(
        text_config=dict(vocab_size=160, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, rms_norm_eps=1e-6, initializer_range=0.1,
                         bos_token_id=1, eos_token_id=2,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                          "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2,
                           out_hidden_size=64, fullatt_block_indexes=[1], window_size=56,
                           initializer_range=0.1),
        image_token_id=IMAGE, video_token_id=151, vision_start_token_id=START,
        vision_end_token_id=END)
    config._attn_implementation = "eager"
    return config


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.manual_seed(0)
    hf = transformers.Qwen2_5_VLForConditionalGeneration(_hf_config()).eval()
    with torch.no_grad():  # non-trivial norms and biases so mis-wiring shows up
        for name, param in hf.named_parameters():
            if name.endswith("norm.weight") or "norm1" in name or "norm2" in name or "ln_q" in name:
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.copy_(0.2 * torch.randn_like(param))
    path = tmp_path_factory.mktemp("tiny_qwen2_5_vl")
    hf.save_pretrained(path)
    model, config = load_vlm(path)
    return hf, model, config, path


def _pixels(grids, seed=0):
    n = int(np.prod(grids, axis=1).sum())
    return np.random.default_rng(seed).normal(size=(n, 1176)).astype(np.float32)


def _tokens(parts):
    """[text ids | number of image tokens, ...] -> ids with vision start/end around images."""
    out = []
    for part in parts:
        out += [START] + [IMAGE] * part + [END] if isinstance(part, int) else list(part)
    return out


def _left_pad(rows):
    width = max(len(r) for r in rows)
    ids = np.zeros((len(rows), width), np.int64)
    mask = np.zeros((len(rows), width), bool)
    for b, r in enumerate(rows):
        ids[b, width - len(r):] = r
        mask[b, width - len(r):] = True
    return ids, mask


def _mixed_batch():
    """Row 0: two images of different sizes; row 1: one image; row 2: text only."""
    rows = [_tokens([[5, 6, 7], 24, [8, 9], 6, [10, 11, 12, 13]]),
            _tokens([[14], 15, [15, 16, 17, 18, 19, 20, 21]]),
            [22, 23, 24, 25, 26, 27]]
    return _left_pad(rows)


def _hf_forward(hf, ids, mask, pixels=None, grids=None):
    kwargs = {}
    if pixels is not None:
        kwargs = dict(pixel_values=torch.tensor(pixels), image_grid_thw=torch.tensor(grids),
                      mm_token_type_ids=torch.tensor((ids == IMAGE).astype(np.int64)))
    with torch.no_grad():
        return hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask.astype(np.int64)),
                  **kwargs).logits.numpy()


# ----------------------------------------------------------------------------- config
def test_config_from_both_hf_layouts_and_back(tiny):
    _, _, config, path = tiny
    nested = json.loads((path / "config.json").read_text())
    assert isinstance(config, VLMConfig) and config.mrope_section == (2, 3, 3)
    assert (config.vision.depth, config.vision.window_units, config.vision.fullatt_block_indexes,
            config.hidden_size, config.tie_embeddings) == (3, 2, (1,), 64, False)
    flat = {k: v for k, v in nested.items() if k != "text_config"}  # transformers 4.x layout
    text = dict(nested["text_config"])
    rope = text.pop("rope_parameters")
    flat.update(text, model_type="qwen2_5_vl", rope_theta=rope["rope_theta"],
                rope_scaling={"type": "mrope", "mrope_section": rope["mrope_section"]})
    flat["vision_config"] = dict(nested["vision_config"], model_type="qwen2_5_vl",
                                 in_chans=3, spatial_patch_size=14)
    assert VLMConfig.from_hf(flat) == config
    again = transformers.Qwen2_5_VLConfig(**config.to_hf())
    assert VLMConfig.from_hf(again.to_dict()) == config
    assert isinstance(load_model(path)[0], Qwen2_5_VL)  # the generic loader dispatches
    with pytest.raises(ValueError, match="mrope_section"):
        VLMConfig.tiny(mrope_section=(2, 2, 2))
    with pytest.raises(ValueError, match="not a Qwen2.5-VL"):
        VLMConfig.from_hf({"model_type": "qwen2"})


# ----------------------------------------------------------------------------- vision
def test_vision_tower_matches_transformers(tiny):
    hf, model, config, _ = tiny
    grids = np.array([[1, 8, 12], [1, 6, 4], [1, 2, 2], [1, 10, 6]])
    pixels = _pixels(grids)
    with torch.no_grad():
        ref = hf.model.visual(torch.tensor(pixels), grid_thw=torch.tensor(grids)).pooler_output
    ref = ref.numpy()
    batch = VisionBatch.build(pixels, grids, config.vision)
    # 184 patches in 6 + 2 + 1 + 6 windows of 16 slots, 4 frames of up to 96 patches
    assert batch.sizes == (192, 16, 4, 96) and batch.window_index.shape == (16, 16)
    ours = np.asarray(model.image_features(batch))
    n = ref.shape[0]
    assert int(batch.token_valid.sum()) == n == 24 + 6 + 1 + 15
    assert np.abs(ref).max() > 0.3
    np.testing.assert_allclose(ours[:n], ref, atol=ATOL, rtol=0)
    # larger sizes (more padding everywhere) compute the same tokens
    bigger = VisionBatch.build(pixels, grids, config.vision, VisionSizes(256, 24, 6, 112))
    np.testing.assert_allclose(np.asarray(model.image_features(bigger))[:n], ref, atol=ATOL,
                               rtol=0)


def test_vision_batch_bad_inputs(tiny):
    config = tiny[2].vision
    with pytest.raises(ValueError, match="multiples of 2"):
        VisionBatch.build(_pixels([[1, 3, 4]]), [[1, 3, 4]], config)
    with pytest.raises(ValueError, match="pixel_values must be"):
        VisionBatch.build(_pixels([[1, 4, 4]]), [[1, 4, 6]], config)
    with pytest.raises(ValueError, match="too small.*frames"):
        VisionBatch.build(_pixels(GRIDS), GRIDS, config, VisionSizes(256, 32, 2, 128))


def test_merged_image_embeddings_match_transformers(tiny):
    hf, model, config, _ = tiny
    ids, mask = _mixed_batch()
    grids = GRIDS
    pixels = _pixels(grids, seed=3)
    ours = jax.jit(embed_inputs, static_argnames="config")(
        model.arrays(), config, jnp.asarray(ids, jnp.int32),
        VisionBatch.build(pixels, grids, config.vision))
    with torch.no_grad():
        tid = torch.tensor(ids)
        embeds = hf.model.get_input_embeddings()(tid)
        feats = torch.cat(hf.model.get_image_features(torch.tensor(pixels), torch.tensor(grids))
                          .pooler_output)
        where = (tid == IMAGE)[..., None].expand_as(embeds)
        ref = embeds.masked_scatter(where, feats).numpy()
    np.testing.assert_allclose(np.asarray(ours), ref, atol=ATOL, rtol=0)
    assert np.abs(np.asarray(ours)[ids == IMAGE] - embeds.numpy()[ids == IMAGE]).max() > 0.1


# ----------------------------------------------------------------------------- positions
def test_mrope_positions_match_get_rope_index(tiny):
    hf, _, config, _ = tiny
    ids, mask = _mixed_batch()
    ours, next_position = mrope_positions(ids, mask, GRIDS, config)
    ref, deltas = hf.model.get_rope_index(
        torch.tensor(ids), torch.tensor((ids == IMAGE).astype(np.int64)),
        image_grid_thw=torch.tensor(GRIDS), attention_mask=torch.tensor(mask.astype(np.int64)))
    np.testing.assert_array_equal(ours[:, mask], ref.numpy()[:, mask])
    np.testing.assert_array_equal(next_position, deltas.numpy()[:, 0] + mask.sum(1))
    # row 1: text restarts after the image at start + max(merged rows, merged columns)
    row = ours[:, 1, mask[1]]
    start = 2  # [14, START] precede the image
    assert row[:, start].tolist() == [start] * 3 and row[0, start + 14] == start
    assert row[:, start + 15].tolist() == [start + 5] * 3  # END token after a 5 x 3 image
    with pytest.raises(ValueError, match="grids"):
        mrope_positions(ids, mask, GRIDS[:2], config)
    with pytest.raises(ValueError, match="consecutive"):
        mrope_positions(ids, mask, GRIDS[[1, 0, 2]], config)


def test_mrope_tables_with_equal_axes_are_text_rope():
    config = VLMConfig.tiny()
    pos = jnp.asarray(np.random.default_rng(0).integers(0, 500, size=(2, 7)), jnp.int32)
    cos3, sin3 = mrope_tables(config, jnp.stack([pos, pos, pos]))
    cos1, sin1 = rope_tables(config, pos)
    np.testing.assert_array_equal(np.asarray(cos3), np.asarray(cos1))
    np.testing.assert_array_equal(np.asarray(sin3), np.asarray(sin1))


# ----------------------------------------------------------------------------- logits
def test_logits_match_transformers_with_images_and_text_only(tiny):
    hf, model, config, _ = tiny
    ids, mask = _mixed_batch()
    pixels = _pixels(GRIDS, seed=1)
    ref = _hf_forward(hf, ids, mask, pixels, GRIDS)
    pos, _ = mrope_positions(ids, mask, GRIDS, config)
    ours, _ = model(jnp.asarray(ids, jnp.int32), jnp.asarray(pos), jnp.asarray(mask),
                    pixel_values=pixels, image_grid_thw=GRIDS)
    ours = np.asarray(ours)
    assert np.abs(ref[mask]).max() > 1.0
    for b in range(3):  # two images / one image / text only
        np.testing.assert_allclose(ours[b][mask[b]], ref[b][mask[b]], atol=ATOL, rtol=0)
    # a text-only batch (no vision inputs at all, 1-D positions)
    text_ids, text_mask = _left_pad([[5, 6, 7, 8, 9, 10], [11, 12, 13]])
    ref = _hf_forward(hf, text_ids, text_mask)
    ours, _ = model(jnp.asarray(text_ids, jnp.int32),
                    positions_from_mask(jnp.asarray(text_mask)), jnp.asarray(text_mask))
    np.testing.assert_allclose(np.asarray(ours)[text_mask], ref[text_mask], atol=ATOL, rtol=0)


def test_cached_prefill_and_decode_equal_full_forward(tiny):
    _, model, config, _ = tiny
    ids, mask = _mixed_batch()
    pixels = _pixels(GRIDS, seed=1)
    pos, vision, _ = model.multimodal_inputs(ids, mask, _images_per_row(pixels))
    full, _ = model(jnp.asarray(ids, jnp.int32), pos, jnp.asarray(mask), vision=vision)
    width = ids.shape[1]
    cache = init_cache(config, 3, width + 4)
    cache = model.prefill(jnp.asarray(ids[:, :-1], jnp.int32), pos[..., :-1],
                          jnp.asarray(mask[:, :-1]), cache, vision=vision)
    step, cache = model(jnp.asarray(ids[:, -1:], jnp.int32), pos[0, :, -1:],
                        jnp.ones((3, 1), bool), cache, width - 1)
    np.testing.assert_allclose(np.asarray(step)[:, 0], np.asarray(full)[:, -1], atol=ATOL, rtol=0)


def _images_per_row(pixels):
    """The images of `_mixed_batch` as per-row (pixel_values, grid) lists."""
    sizes = np.prod(GRIDS, axis=1)
    parts = np.split(pixels, np.cumsum(sizes)[:-1])
    return [[(parts[0], GRIDS[0]), (parts[1], GRIDS[1])], [(parts[2], GRIDS[2])], None]


def test_cached_generation_equals_uncached_argmax_and_transformers(tiny):
    hf, model, config, _ = tiny
    ids, mask = _mixed_batch()
    pixels = _pixels(GRIDS, seed=2)
    images = _images_per_row(pixels)
    prompts = [ids[b][mask[b]].tolist() for b in range(3)]
    steps = 6
    # uncached reference: full forwards over a fixed-width buffer, argmax at each step
    pos, vision, next_position = model.multimodal_inputs(ids, mask, images)
    width = ids.shape[1]
    buf = np.concatenate([ids, np.zeros((3, steps), np.int64)], axis=1)
    buf_mask = np.concatenate([mask, np.zeros((3, steps), bool)], axis=1)
    gen_pos = np.asarray(next_position)[:, None] + np.arange(steps)[None, :]
    buf_pos = jnp.concatenate([pos, jnp.broadcast_to(gen_pos, (3, 3, steps))], axis=-1)
    expected = []
    for t in range(steps):
        logits, _ = model(jnp.asarray(buf, jnp.int32), buf_pos, jnp.asarray(buf_mask),
                          vision=vision)
        token = np.asarray(jnp.argmax(logits[:, width - 1 + t], axis=-1))
        expected.append(token)
        buf[:, width + t] = token
        buf_mask[:, width + t] = True
    expected = np.stack(expected, axis=1)
    for unroll in (True, False):
        out = generate_tokens(model, prompts, jax.random.key(0), max_new_tokens=steps,
                              temperature=0.0, images=images,
                              config=SamplerConfig(unroll_layers=unroll))
        np.testing.assert_array_equal(out.tokens, expected)
    with torch.no_grad():
        ref = hf.generate(input_ids=torch.tensor(ids),
                          attention_mask=torch.tensor(mask.astype(np.int64)),
                          pixel_values=torch.tensor(pixels), image_grid_thw=torch.tensor(GRIDS),
                          mm_token_type_ids=torch.tensor((ids == IMAGE).astype(np.int64)),
                          max_new_tokens=steps, min_new_tokens=steps, do_sample=False)
    np.testing.assert_array_equal(ref.numpy()[:, width:], expected)
    with pytest.raises(ValueError, match="image lists"):
        generate_tokens(model, prompts, jax.random.key(0), max_new_tokens=2, images=images[:2])


def test_sampler_never_emits_image_or_video_pads(tiny):
    """A head pushed towards the placeholder ids: the raw argmax is the image pad, yet neither
    greedy nor sampled decoding (with or without prompt lookup) emits a placeholder."""
    from jax_drive.sampling.speculative import PromptLookup

    _, model, config, _ = tiny
    biased = nnx.clone(model)  # the module fixture's model stays as it is
    placeholders = config.placeholder_token_ids
    assert placeholders == (IMAGE, 151)
    ids, mask = _mixed_batch()
    images = _images_per_row(_pixels(GRIDS, seed=2))
    prompts = [ids[b][mask[b]].tolist() for b in range(3)]
    pos, vision, _ = biased.multimodal_inputs(ids, mask, images)

    def last_logits():
        logits, _ = biased(jnp.asarray(ids, jnp.int32), pos, jnp.asarray(mask), vision=vision)
        return np.asarray(logits[:, -1])

    # the placeholders' output rows become scaled copies of row 0's winner: its score doubles
    winner = int(np.argmax(last_logits()[0]))
    assert last_logits()[0, winner] > 0
    tied = biased.lm_head is None
    head = biased.embed if tied else biased.lm_head
    w = head[...]
    row = w[winner] if tied else w[:, winner]
    for pad, scale in zip(placeholders, (3.0, 2.0)):
        w = w.at[pad].set(scale * row) if tied else w.at[:, pad].set(scale * row)
    head[...] = w
    assert int(np.argmax(last_logits()[0])) == IMAGE  # unmasked, the image pad would come next
    for temperature, lookup in ((0.0, None), (1.0, None), (0.0, PromptLookup())):
        out = generate_tokens(biased, prompts, jax.random.key(3), max_new_tokens=8, temperature=temperature,
                              images=images, prompt_lookup=lookup)
        assert not np.isin(np.asarray(out.tokens), placeholders).any(), (temperature, lookup)


# ----------------------------------------------------------------------------- checkpoints
def _rename_to_transformers5(src, dst):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(src / "model.safetensors"))
    renamed = {}
    for key, value in tensors.items():
        if key.startswith("visual."):
            key = "model." + key
        elif key.startswith("model."):
            key = "model.language_model." + key[len("model."):]
        renamed[key] = value
    dst.mkdir()
    save_file(renamed, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text((src / "config.json").read_text())
    return renamed


def test_both_key_layouts_and_bfloat16_checkpoints(tiny, tmp_path):
    hf, model, config, path = tiny
    renamed = _rename_to_transformers5(path, tmp_path / "t5")
    assert any(k.startswith("model.language_model.") for k in renamed)
    again, _ = load_vlm(tmp_path / "t5")
    for a, b in zip(jax.tree.leaves(model.arrays()), jax.tree.leaves(again.arrays())):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    hf16 = transformers.Qwen2_5_VLForConditionalGeneration(_hf_config())
    hf16.load_state_dict(hf.state_dict())
    hf16.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    native, cfg16 = load_vlm(tmp_path / "bf16")  # the checkpoint's dtype
    assert cfg16.dtype == "bfloat16" and native.embed[...].dtype == jnp.bfloat16
    as_f32, _ = load_vlm(tmp_path / "bf16", dtype="float32")
    rounded = hf.model.visual.blocks[0].attn.qkv.weight.detach().to(torch.bfloat16).float()
    np.testing.assert_array_equal(np.asarray(as_f32.visual.blocks.qkv.kernel[...][0]).T,
                                  rounded.numpy())
    ids, mask = _mixed_batch()
    pixels = _pixels(GRIDS, seed=1)
    pos, _ = mrope_positions(ids, mask, GRIDS, config)
    f32, _ = model(jnp.asarray(ids, jnp.int32), jnp.asarray(pos), jnp.asarray(mask),
                   pixel_values=pixels, image_grid_thw=GRIDS)
    b16, _ = native(jnp.asarray(ids, jnp.int32), jnp.asarray(pos), jnp.asarray(mask),
                    pixel_values=pixels, image_grid_thw=GRIDS)
    diff = np.abs(np.asarray(b16) - np.asarray(f32))[mask]
    assert diff.max() < 0.25 and diff.mean() < 0.05  # bf16 rounding only


# ----------------------------------------------------------------------------- LoRA / export
def _with_adapters(path):
    model, config = load_vlm(path)
    apply_lora(model, rank=4, alpha=8.0, rngs=nnx.Rngs(1))
    state = nnx.state(model, LoRAParam)
    leaves, tree = jax.tree.flatten(state)
    leaves = [x + 0.05 * jax.random.normal(jax.random.key(i), x.shape)
              for i, x in enumerate(leaves)]
    nnx.update(model, jax.tree.unflatten(tree, leaves))
    return model, config


def test_lora_trains_only_adapters_and_logprobs_take_images(tiny):
    _, _, _, path = tiny
    model, config = _with_adapters(path)
    ids, mask = _mixed_batch()
    pixels = _pixels(GRIDS, seed=4)
    pos, vision, _ = model.multimodal_inputs(ids, mask, _images_per_row(pixels))
    ids_j, mask_j = jnp.asarray(ids, jnp.int32), jnp.asarray(mask)
    targets = jnp.roll(ids_j, -1, axis=1)
    logp = model.token_logprobs(ids_j, pos, mask_j, targets, chunk_size=16, vision=vision)
    logits, _ = model(ids_j, pos, mask_j, vision=vision)
    ref = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(logp)[mask], np.asarray(ref)[mask], atol=ATOL, rtol=0)

    def loss(m):
        return -jnp.sum(m.token_logprobs(ids_j, pos, mask_j, targets, chunk_size=16,
                                         vision=vision) * mask_j)

    grads = nnx.grad(loss, argnums=nnx.DiffState(0, LoRAParam))(model)
    norms = [float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)]
    assert len(norms) == 2 * 7 and min(norms) > 0  # A and B of 7 projections, all updated


def test_exported_checkpoint_and_peft_adapter_load_in_transformers(tiny, tmp_path):
    peft = pytest.importorskip(
        "peft", reason="peft is not installed (requirements-test.txt pins it; run `make install`)")
    _, _, config, path = tiny
    model, _ = _with_adapters(path)
    ids, mask = _mixed_batch()
    pixels = _pixels(GRIDS, seed=5)
    pos, _ = mrope_positions(ids, mask, GRIDS, config)
    ours, _ = model(jnp.asarray(ids, jnp.int32), jnp.asarray(pos), jnp.asarray(mask),
                    pixel_values=pixels, image_grid_thw=GRIDS)
    ours = np.asarray(ours)
    # the whole model with the adapters folded in
    save_vlm(model, tmp_path / "merged")
    merged = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        tmp_path / "merged", dtype=torch.float32).eval()
    np.testing.assert_allclose(_hf_forward(merged, ids, mask, pixels, GRIDS)[mask], ours[mask],
                               atol=ATOL, rtol=0)
    # the adapters alone, through PEFT onto the base checkpoint
    export_vlm_peft(model, tmp_path / "adapter", base_model_name="tiny")
    cfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and "visual" in cfg["target_modules"]
    base = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        path, dtype=torch.float32).eval()
    base.config._attn_implementation = "eager"
    peft_model = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    lora_modules = [n for n, m in peft_model.named_modules()
                    if isinstance(m, peft.tuners.lora.LoraLayer)]
    assert len(lora_modules) == 7 * config.num_layers
    assert all("language_model" in n for n in lora_modules)
    np.testing.assert_allclose(_hf_forward(peft_model, ids, mask, pixels, GRIDS)[mask],
                               ours[mask], atol=ATOL, rtol=0)
    # and back into a fresh model of ours
    fresh, _ = load_vlm(path)
    load_vlm_peft(fresh, tmp_path / "adapter")
    again, _ = fresh(jnp.asarray(ids, jnp.int32), jnp.asarray(pos), jnp.asarray(mask),
                     pixel_values=pixels, image_grid_thw=GRIDS)
    np.testing.assert_allclose(np.asarray(again)[mask], ours[mask], atol=ATOL, rtol=0)


def test_model_rejects_bad_inputs(tiny):
    _, model, config, _ = tiny
    ids = jnp.ones((1, 4), jnp.int32)
    mask = jnp.ones((1, 4), bool)
    with pytest.raises(ValueError, match=r"\(3,\)"):
        model(ids, jnp.zeros((3, 1, 5), jnp.int32), mask)
    with pytest.raises(ValueError, match="go together"):
        model(ids, positions_from_mask(mask), mask, pixel_values=_pixels([[1, 2, 2]]))
    with pytest.raises(TypeError, match="VLMConfig"):
        Qwen2_5_VL(config.text_config)
