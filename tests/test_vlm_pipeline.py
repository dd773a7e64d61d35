"""The vision-language policy in the MTDrive pipeline, on a tiny random Qwen2.5-VL over the
byte tokenizer (no reference model): camera images in the planning prompt, in the dataset
records, through the sampler (shared prefill, sessions) and the trainers' batches, and the
``smoke-vlm`` preset end to end (SFT -> RL curation -> mtGRPO -> evaluation)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_drive.data.builders import BuildConfig, build_qa, build_single
from jax_drive.models import LoRAParam
from jax_drive.models.qwen2_5_vl import VisionBatch, apply_vision_lora
from jax_drive.models.loading import load_vlm
from jax_drive.models.qwen2_5_vl.loading import save_vlm
from jax_drive.models.qwen2_5_vl.vision import VISION_PROJECTIONS, vision_forward
from jax_drive.models.tiny import VISION_TOKENS, tiny_vlm_policy
from jax_drive.models.layers import fold_lora
from jax_drive.data.arrays import rows_from_arrays, rows_to_arrays
from jax_drive.pipelines.mtdrive import run_mtdrive
from jax_drive.pipelines.mtdrive.presets import PRESETS
from jax_drive.render import render_camera
from jax_drive.data.tokens import TokenRow, with_images
from jax_drive.rl.batching import add_images, batch_token_logprobs, pad_rows
from jax_drive.rl.grpo import _rows
from jax_drive.rollout import scene_prompts
from jax_drive.sampling import JaxEngine, SamplingParams
from jax_drive.sampling.sampler import SamplerConfig, generate_tokens
from jax_drive.scenes import index_scene, stack_scenes, straight_road_scene
from jax_drive.text.prompts import CAMERA_ITEM, TEXT_ONLY, PromptConfig, prompt_images

PROMPT = PRESETS["smoke-vlm"].prompt  # a 112 x 56 front camera: 4 x 8 patches, 8 image tokens


@pytest.fixture(scope="module")
def policy():
    return tiny_vlm_policy(seed=0, lora_rank=None)


@pytest.fixture(scope="module")
def scenes():
    return stack_scenes([straight_road_scene(scene_id=0, ego_speed=5.0),
                         straight_road_scene(agents=[dict(x=15.0, y=0.0)], scene_id=1, ego_speed=8.0)])


def _frames(seed=0, n=2):
    return list(np.random.default_rng(seed).integers(0, 256, (n, 56, 112, 3), dtype=np.uint8))


def test_image_prompt_holds_the_rendered_front_camera(scenes):
    text = scene_prompts(scenes, PROMPT)[0]
    assert text.startswith("<image>\n") and CAMERA_ITEM in text
    images = prompt_images(scenes, PROMPT)
    assert len(images) == 2 and all(len(row) == 1 for row in images)
    assert images[1][0].shape == (56, 112, 3) and images[1][0].dtype == np.uint8
    np.testing.assert_array_equal(images[1][0], np.asarray(render_camera(index_scene(scenes, np.array([1])), PROMPT.camera))[0])
    assert not np.array_equal(images[0][0], images[1][0])  # a car ahead in scene 1
    assert prompt_images(scenes, TEXT_ONLY) is None
    with pytest.raises(ValueError, match="placeholder"):
        PromptConfig(perception="image", image_placeholder=False)


def test_image_tokenizer_marks_and_expands_images(policy):
    _, config, tok = policy
    start, end, pad, _ = (tok.token_to_id(t) for t in VISION_TOKENS)
    assert (config.vision_start_token_id, config.vision_end_token_id, config.image_token_id) == (start, end, pad)
    ids = tok.encode("a<image>\nb")
    assert ids == tok.tokenizer.encode("a") + [start, pad, end] + tok.tokenizer.encode("\nb")
    image = tok.preprocess(_frames(n=1))[0]
    assert tuple(image.grid_thw) == (1, 4, 8) and image.pixel_values.shape == (32, 1176)
    expanded, weight = tok.expand(ids, [image], np.arange(len(ids)))
    assert expanded.count(pad) == 8 and len(weight) == len(expanded)
    assert weight.tolist() == [0, 1] + [2] * 8 + [3, 4, 5]  # each entry repeated like its token
    with pytest.raises(ValueError, match="image pad"):
        tok.expand(ids, [])


def test_dataset_records_carry_their_scene_camera(scenes):
    config = BuildConfig(prompt=PROMPT)
    images = prompt_images(scenes, PROMPT)
    records = build_single(scenes, config)
    for record, row in zip(records, images):
        assert len(record["images"]) == 1
        np.testing.assert_array_equal(record["images"][0], row[0])
    qa, _ = build_qa(scenes, jax.random.key(0), config)
    assert qa and all(len(r["images"]) == 1 and r["messages"][0]["content"].startswith("<image>") for r in qa)
    assert "images" not in build_single(scenes, BuildConfig(prompt=TEXT_ONLY))[0]


def test_sampler_with_images_shares_prefill_only_between_equal_images(policy):
    model, _, tok = policy
    a, b = tok.preprocess(_frames(1))
    prompt = tok.expand(tok.encode("<image>\nplan"), [a])
    prompts, images = [prompt] * 3, [[a], [a], [b]]
    outs = [generate_tokens(model, prompts, jax.random.key(0), max_new_tokens=4, temperature=0.0, images=images,
                            config=SamplerConfig(share_prefix=share)) for share in (True, False)]
    np.testing.assert_array_equal(outs[0].tokens, outs[1].tokens)
    np.testing.assert_allclose(outs[0].logprobs, outs[1].logprobs, atol=1e-5)
    np.testing.assert_allclose(outs[0].logprobs[0], outs[0].logprobs[1], atol=1e-6)
    # the image reaches the policy: another image, other log-probs
    assert np.abs(outs[0].logprobs[0] - outs[0].logprobs[2]).max() > 1e-4
    engine = JaxEngine(model, tok)
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    completions = engine.generate(prompts, params, jax.random.key(0), images=images)
    np.testing.assert_allclose([c.logprobs for c in completions], outs[0].logprobs, atol=1e-5)
    with pytest.raises(ValueError, match="end with text"):
        generate_tokens(model, [prompt[:-1] + [tok.image_token_id]], jax.random.key(0), max_new_tokens=2,
                        images=[[a]])


def test_session_with_images_equals_whole_context_generation(policy):
    model, _, tok = policy
    a, b = tok.preprocess(_frames(2))
    prompts = [tok.expand(tok.encode("<image>\nplan"), [a]), tok.expand(tok.encode("go <image>\nnow"), [b])]
    engine = JaxEngine(model, tok)
    params = SamplingParams(max_new_tokens=3, temperature=0.0, stop_token_ids=())
    session, first = engine.start(prompts, params, jax.random.key(0), images=[[a], [b]])
    appended = [tok.encode(" again"), tok.encode(" ok")]
    second = session.extend(appended, params, jax.random.key(1))
    contexts = [list(p) + list(c.token_ids) + x for p, c, x in zip(prompts, first, appended)]
    fresh = engine.generate(contexts, params, jax.random.key(1), images=[[a], [b]])
    for s, f in zip(second, fresh):
        assert s.token_ids == f.token_ids
        np.testing.assert_allclose(s.logprobs, f.logprobs, atol=1e-5)


def test_image_rollouts_through_sessions_equal_resending_contexts(policy, scenes):
    """``run_rollouts`` with camera prompts: turn 2 extends each row's kept cache (M-RoPE
    position shift after the image) and equals re-sending the whole context with its image."""
    from jax_drive.rollout import RolloutConfig, run_rollouts

    model, _, tok = policy
    ref = np.broadcast_to(np.stack([5.0 * 0.1 * np.arange(1, 41), np.zeros(40), np.zeros(40)], -1), (2, 40, 3))
    sampling = SamplingParams(max_new_tokens=6, temperature=0.0, stop_token_ids=())
    results = [run_rollouts(JaxEngine(model, tok), tok, scenes, jax.random.key(3),
                            RolloutConfig(group_size=2, max_turns=2, sampling=sampling, prompt=PROMPT,
                                          use_sessions=use), reference=np.asarray(ref, np.float32))
               for use in (True, False)]
    sessions, plain = results
    assert plain.turn_mask[..., 1].all()  # every row took turn 2 (out of format: format feedback)
    assert [t.tolist() for t in sessions.tokens] == [t.tolist() for t in plain.tokens]
    for x, y in zip(sessions.sample_logprobs, plain.sample_logprobs):
        np.testing.assert_allclose(x, y, atol=1e-4)
    assert all(len(t.images) == 1 for t in sessions.transcripts.reshape(-1))


def _image_rows(tok, frames):
    """Two rows with one image each (the first twice) and a text-only row."""
    images = tok.preprocess(frames)
    rows = []
    for text, ims in (("<image>\nplan", images[:1]), ("x<image>\ndrive on", images[1:]), ("just text", ())):
        ids = tok.encode(text)
        rows.append(with_images(TokenRow(np.asarray(ids, np.int32), np.ones(len(ids), np.float32)), ims, tok))
    return rows


def test_training_batches_with_images_match_the_model(policy):
    model, _, tok = policy
    rows = _image_rows(tok, _frames(3))
    assert [int((r.ids == tok.image_token_id).sum()) for r in rows] == [8, 8, 0]
    batch = add_images(pad_rows(rows, 24, tok.pad_token_id, num_rows=4), rows, model)
    assert batch["positions"].shape == (4, 3, 24) and batch["vision"].patches.shape[0] == 4
    batch = jax.tree.map(jnp.asarray, batch)
    logp = np.asarray(batch_token_logprobs(model, batch))
    # the reference: the whole batch's images laid out at once (the sampler's layout)
    positions, vision, _ = model.multimodal_inputs(batch["input_ids"], batch["attention_mask"],
                                                   [r.images for r in rows] + [()])
    ref = np.asarray(model.token_logprobs(batch["input_ids"], positions, batch["attention_mask"], batch["targets"],
                                          vision=vision))
    mask = np.asarray(batch["attention_mask"])
    np.testing.assert_allclose(logp[mask], ref[mask], atol=1e-5)
    # mini-batches keep each row's own images
    np.testing.assert_allclose(np.asarray(batch_token_logprobs(model, _rows(batch, np.array([1, 0])))),
                               logp[[1, 0]], atol=1e-5)
    # and the images matter
    text_only = {**batch, "positions": batch["positions"][:, 0]}
    del text_only["vision"]
    assert np.abs(np.asarray(batch_token_logprobs(model, text_only)) - logp)[mask].max() > 1e-4


def test_vision_lora_changes_the_tower_like_folded_kernels_and_trains(tmp_path):
    model, config, tok = tiny_vlm_policy(seed=1, lora_rank=2)
    image = tok.preprocess(_frames(5, 1))[0]
    vision = VisionBatch.build(image.pixel_values, image.grid_thw[None], config.vision)
    before = np.asarray(model.image_features(vision))
    apply_vision_lora(model, rank=2, alpha=4.0, rngs=nnx.Rngs(3))
    np.testing.assert_allclose(np.asarray(model.image_features(vision)), before, atol=1e-6)  # B = 0
    with pytest.raises(ValueError, match="already has"):
        apply_vision_lora(model, rank=2, alpha=4.0)
    keys = jax.random.split(jax.random.key(4), len(VISION_PROJECTIONS))
    for key, name in zip(keys, VISION_PROJECTIONS):
        b = getattr(model.visual.blocks, name).lora_b
        b.set_value(0.5 * jax.random.normal(key, b.shape))
    after = np.asarray(model.image_features(vision))
    assert np.abs(after - before).max() > 1e-3
    folded = model.visual.arrays()
    folded["blocks"] = {k: ({"kernel": fold_lora(v), "bias": v["bias"]} if k in VISION_PROJECTIONS else v)
                        for k, v in folded["blocks"].items()}
    np.testing.assert_allclose(np.asarray(vision_forward(folded, config.vision, vision)), after, atol=1e-5)
    # the exported checkpoint holds the folded tower
    save_vlm(model, tmp_path / "ckpt")
    np.testing.assert_allclose(np.asarray(load_vlm(tmp_path / "ckpt")[0].image_features(vision)), after, atol=1e-5)
    # a training batch's gradient reaches the vision adapters as well as the language model's
    rows = _image_rows(tok, _frames(6))
    batch = jax.tree.map(jnp.asarray, add_images(pad_rows(rows, 24, tok.pad_token_id), rows, model))
    grads = nnx.grad(lambda m: -jnp.sum(batch_token_logprobs(m, batch) * batch["loss_mask"]),
                     argnums=nnx.DiffState(0, LoRAParam))(model)
    assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(nnx.state(grads.visual)))
    # (the language model's fresh adapters have B = 0, so only their B gets a gradient)
    assert all(float(jnp.abs(getattr(grads.layers, name).lora_b[...]).max()) > 0
               for name in ("q_proj", "v_proj", "down_proj"))


def test_sft_rows_with_images_round_trip_through_the_journal(policy):
    _, _, tok = policy
    rows = _image_rows(tok, _frames(4))
    rows.append(dataclasses.replace(rows[0]))  # a row sharing the first row's image objects
    arrays = rows_to_arrays(rows)
    assert arrays["image_grid"].shape == (2, 3)  # each image stored once
    back = rows_from_arrays(arrays)
    for r, b in zip(rows, back):
        np.testing.assert_array_equal(r.ids, b.ids)
        np.testing.assert_array_equal(r.weight, b.weight)
        assert len(r.images) == len(b.images)
        for x, y in zip(r.images, b.images):
            np.testing.assert_array_equal(x.pixel_values, y.pixel_values)
            np.testing.assert_array_equal(x.grid_thw, y.grid_thw)


def test_smoke_vlm_pipeline_end_to_end(tmp_path):
    """SFT on image prompts -> RL curation with the policy's first turn -> mtGRPO on rollouts
    with the rendered camera -> greedy evaluation, on the tiny random VLM. Evaluated after RL
    only (the other evaluations compile nothing new)."""
    preset = PRESETS["smoke-vlm"]
    results = run_mtdrive(preset, tmp_path, evaluate=("rl",), progress=False, log=lambda _: None)
    assert set(results["stages"]) == {"rl"} and results["stages"]["rl"]["per_seed"][0]["scenes"] == preset.eval_scenes
    assert 0.0 <= results["stages"]["rl"]["mean"]["pdms_final"] <= 1.0
    assert preset.constrain_answers and results["stages"]["rl"]["mean"]["format_rate"] == 1.0  # the grammar's promise
    assert len(results["sft_history"]) == preset.sft.max_steps and len(results["rl_history"]) == preset.rl.steps
    # every SFT row held its scene's camera: 8 image tokens per placeholder
    rows = rows_from_arrays(dict(np.load(tmp_path / "stages" / "sft_data.npz")))
    assert rows and all(len(r.images) == 1 and tuple(r.images[0].grid_thw) == (1, 4, 8) for r in rows)
    # the trainer scored the sampled tokens with the same images the sampler saw
    for record in results["rl_history"]:
        if record["optimizer_steps"]:
            assert record["logp_mismatch"] < 1e-4
