"""Device-only: a real Qwen2.5-VL-3B-Instruct checkpoint on an accelerator against transformers.

Skips (with the reason) unless JAX runs on an accelerator (e.g. `JAX_PLATFORMS=cuda`) and the
environment variable JAX_DRIVE_QWEN2_5_VL_3B names a local directory holding the checkpoint
(config.json, *.safetensors, tokenizer.json; nothing is downloaded). On one rendered front
camera image in an MTDrive prompt, our float32 logits (matmuls at 'highest' precision) are
compared with transformers' float32 logits on the CPU over every prompt position: max
|difference| <= 0.05 (logits of magnitude ~20-40 through 36 layers) and the same top-1 token
at >= 99% of the positions, including the last one.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ENV = "JAX_DRIVE_QWEN2_5_VL_3B"
PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    "<|vision_start|><|image_pad|><|vision_end|>As an autonomous driving system, predict the "
    "vehicle's trajectory based on:\n1. Visual perception from front camera view\n"
    "2. Historical motion context (last 4 timesteps): - t-3: (-9.44, +0.02, -0.02) - t-2: "
    "(-6.21, -0.02, 0.0) - t-1: (-3.05, -0.03, 0.0) - t-0: (0.0, 0.0, 0.0)\n"
    "3. Active navigation command: [GO STRAIGHT]\nOutput requirements:\n"
    "- Predict 8 future trajectory points\n- Each point format: (x:float, y:float, "
    "heading:float)\n- Use [PT, ...] to encapsulate the trajectory\n- Maintain numerical "
    "precision to 2 decimal places<|im_end|>\n<|im_start|>assistant\n"
)


def test_real_qwen2_5_vl_3b_logits_match_transformers_on_a_rendered_scene():
    if jax.default_backend() == "cpu":
        pytest.skip("needs an accelerator: run on a GPU/TPU machine with JAX_PLATFORMS=cuda "
                    "(or tpu) and a CUDA/TPU jax build (see BUILD.md)")
    path = os.environ.get(ENV)
    if not path or not os.path.isdir(path):
        pytest.skip(f"set {ENV} to a local Qwen2.5-VL-3B-Instruct directory (no download)")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    from jax_drive.models import load_pretrained
    from jax_drive.models.image_processing import expand_image_tokens, preprocess_image
    from jax_drive.models.qwen2_5_vl import Qwen2_5_VL, mrope_positions
    from jax_drive.render import render_camera
    from jax_drive.scenes import generate_scenes

    model, config, tokenizer = load_pretrained(path, dtype="float32")
    assert isinstance(model, Qwen2_5_VL) and config.num_layers == 36
    scene = jax.tree.map(lambda a: a[0], generate_scenes(jax.random.key(7), 1))
    image = preprocess_image(np.asarray(render_camera(scene)))
    ids = expand_image_tokens(tokenizer.encode(PROMPT), image.grid_thw, config.image_token_id)
    ids = np.asarray([ids], np.int64)
    mask = np.ones(ids.shape, bool)
    positions, _ = mrope_positions(ids, mask, image.grid_thw[None], config)
    with jax.default_matmul_precision("highest"):
        ours, _ = model(jnp.asarray(ids, jnp.int32), jnp.asarray(positions), jnp.asarray(mask),
                        pixel_values=image.pixel_values, image_grid_thw=image.grid_thw[None])
    ours = np.asarray(ours)[0]

    hf = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        path, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(ids), pixel_values=torch.tensor(image.pixel_values),
                 image_grid_thw=torch.tensor(image.grid_thw[None]),
                 mm_token_type_ids=torch.tensor((ids == config.image_token_id).astype(np.int64))
                 ).logits[0].float().numpy()
    diff = np.abs(ours - ref)
    assert np.abs(ref).max() > 5.0
    assert diff.max() <= 0.05, diff.max()
    same_top1 = ours.argmax(-1) == ref.argmax(-1)
    assert same_top1[-1] and same_top1.mean() >= 0.99, same_top1.mean()
