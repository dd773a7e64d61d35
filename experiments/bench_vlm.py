"""Benchmark: our Qwen2.5-VL (flax.nnx) vs transformers (torch) on the same random weights.

One run, one config, the same inputs: rendered front-camera images of generated scenes
(`jax_drive.render`, 448 x 252 -> 32 x 18 patches, 144 image tokens each), preprocessed by
`jax_drive.models.image_processing`, in MTDrive-like prompts (`<image>` + ~200 text tokens).

  * vision tower: images / s of the tower alone (ours: jitted, compiled before timing;
    transformers: `model.model.visual`, its default attention),
  * prefill: prompt tokens / s of a KV-cache prefill with the images (ours: `prefill` into a
    static cache, vision tower included; transformers: a forward with `use_cache=True` and
    `logits_to_keep=1`, vision tower included),
  * the max |logit difference| of the last prompt token between the two (a sanity check that
    both run the same model).

Default config: Qwen2.5-VL-3B's widths with 4 language layers and 4 vision blocks (full
attention in the last), vocabulary 151936. `--tiny` runs a very small config (a smoke check).

Usage (canonical run, on an idle machine):
  python experiments/bench_vlm.py --json runs/bench_vlm.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
from tqdm import tqdm

from jax_drive.runinfo import add_output_args, require_min, run_main, run_metadata, script_environment, write_json

script_environment()


def bench_config(tiny: bool, layers: int, vision_blocks: int):
    """The benchmarked VLMConfig."""
    from jax_drive.models.qwen2_5_vl import VisionConfig, VLMConfig

    if tiny:
        return VLMConfig.tiny(vocab_size=151680, image_token_id=151655, video_token_id=151656,
                              vision_start_token_id=151652, vision_end_token_id=151653,
                              vision=VisionConfig(depth=2, hidden_size=32, intermediate_size=48,
                                                  num_heads=2, out_hidden_size=64,
                                                  fullatt_block_indexes=(1,)))
    vision = VisionConfig(depth=vision_blocks, fullatt_block_indexes=(vision_blocks - 1,))
    return VLMConfig.qwen2_5_vl_3b(num_layers=layers, vision=vision)


def median_seconds(fn, repeats: int, desc: str, quiet: bool = False) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after one untimed warm-up."""
    fn()  # warm-up (compiles ours)
    times = []
    for _ in tqdm(range(repeats), desc=desc, leave=False, disable=quiet):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def prompts_with_images(config, images, text_tokens: int, seed: int = 0):
    """Token rows: text, <vision_start><image_pad><vision_end>, text; pads expanded."""
    from jax_drive.models.image_processing import expand_image_tokens

    rng = np.random.default_rng(seed)
    rows = []
    for im in images:
        head = rng.integers(100, 5000, size=8).tolist()
        tail = rng.integers(100, 5000, size=text_tokens - 8).tolist()
        ids = head + [config.vision_start_token_id, config.image_token_id,
                      config.vision_end_token_id] + tail
        rows.append(expand_image_tokens(ids, im.grid_thw, config.image_token_id))
    return np.asarray(rows, np.int64)  # equal lengths: no padding needed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser, json_required=True)
    parser.add_argument("--tiny", action="store_true", help="a very small config (smoke check)")
    parser.add_argument("--layers", type=int, default=4, help="language layers (real widths)")
    parser.add_argument("--vision-blocks", type=int, default=4, help="vision blocks")
    parser.add_argument("--images", type=int, default=2, help="batch of prompts, one image each")
    parser.add_argument("--text-tokens", type=int, default=200, help="text tokens per prompt (>= 8)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per measurement")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="ours (transformers always float32 on the CPU)")
    args = parser.parse_args(argv)
    require_min(1, layers=args.layers, vision_blocks=args.vision_blocks, images=args.images, repeats=args.repeats)
    require_min(8, text_tokens=args.text_tokens)

    import jax  # heavy imports only after the arguments are checked
    import jax.numpy as jnp
    import torch
    import transformers

    from jax_drive.models import init_cache
    from jax_drive.models.image_processing import preprocess_image
    from jax_drive.models.qwen2_5_vl.loading import assign_vlm_weights
    from jax_drive.models.qwen2_5_vl.vision import vision_forward_jit
    from jax_drive.render import CameraConfig, render_camera
    from jax_drive.scenes import generate_scenes

    meta = run_metadata(benchmark="bench_vlm", torch_threads=torch.get_num_threads(),  # before any timed call
                        versions={"torch": torch.__version__, "transformers": transformers.__version__})
    config = bench_config(args.tiny, args.layers, args.vision_blocks).replace(dtype=args.dtype)
    camera = CameraConfig()
    progress = tqdm(total=5, desc="bench_vlm", disable=args.no_progress)
    scenes = generate_scenes(jax.random.key(0), args.images)
    frames = np.asarray(render_camera(scenes, camera))
    images = [preprocess_image(f) for f in frames]
    ids = prompts_with_images(config, images, args.text_tokens)
    pixels = np.concatenate([im.pixel_values for im in images])
    grids = np.stack([im.grid_thw for im in images])
    progress.update()

    torch.manual_seed(0)
    hf_config = transformers.Qwen2_5_VLConfig(**config.replace(dtype="float32").to_hf())
    hf = transformers.Qwen2_5_VLForConditionalGeneration(hf_config).eval()
    state = {k: v.detach() for k, v in hf.state_dict().items()}
    model = assign_vlm_weights(config, lambda name: state[name].float().numpy(), state.keys())
    progress.update()

    # vision tower
    batch = model.multimodal_inputs(ids, np.ones(ids.shape, bool), [[im] for im in images])[1]
    params = model.visual.arrays()
    ours_vision = median_seconds(
        lambda: jax.block_until_ready(vision_forward_jit(params, config.vision, batch)),
        args.repeats, "ours vision", args.no_progress)
    tpx, tgrid = torch.tensor(pixels), torch.tensor(grids)
    with torch.no_grad():
        hf_vision = median_seconds(lambda: hf.model.visual(tpx, grid_thw=tgrid), args.repeats,
                                   "transformers vision", args.no_progress)
    progress.update()

    # prefill (vision tower + language model into a KV cache)
    mask = np.ones(ids.shape, bool)
    positions, vision, _ = model.multimodal_inputs(ids, mask, [[im] for im in images])
    jids, jmask = jnp.asarray(ids, jnp.int32), jnp.asarray(mask)
    cache = init_cache(config, ids.shape[0], ids.shape[1] + 16)
    ours_prefill = median_seconds(
        lambda: jax.block_until_ready(model.prefill(jids, positions, jmask, cache, vision=vision)),
        args.repeats, "ours prefill", args.no_progress)
    token_types = torch.tensor((ids == config.image_token_id).astype(np.int64))
    hf_inputs = dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask.astype(np.int64)),
                     pixel_values=tpx, image_grid_thw=tgrid, mm_token_type_ids=token_types)
    with torch.no_grad():
        hf_prefill = median_seconds(lambda: hf(**hf_inputs, use_cache=True, logits_to_keep=1),
                                    args.repeats, "transformers prefill", args.no_progress)
        ref_last = hf(**hf_inputs, logits_to_keep=1).logits[:, -1].float().numpy()
    ours_last = np.asarray(model(jids, positions, jmask, vision=vision)[0][:, -1])
    progress.update()

    tokens = int(ids.size)
    n = len(images)
    result = {
        "meta": meta,
        "config": {"tiny": args.tiny, "dtype": args.dtype, "layers": config.num_layers,
                   "hidden": config.hidden_size, "vision_blocks": config.vision.depth,
                   "vision_hidden": config.vision.hidden_size, "vocab": config.vocab_size},
        "inputs": {"images": n, "image_size": [camera.height, camera.width],
                   "patches_per_image": int(np.prod(grids[0])),
                   "image_tokens_per_prompt": int(np.prod(grids[0])) // 4,
                   "prompt_tokens": int(ids.shape[1]), "repeats": args.repeats},
        "vision": {"ours_s": ours_vision, "transformers_s": hf_vision,
                   "ours_images_per_s": n / ours_vision, "transformers_images_per_s": n / hf_vision,
                   "speedup": hf_vision / ours_vision},
        "prefill": {"ours_s": ours_prefill, "transformers_s": hf_prefill,
                    "ours_tokens_per_s": tokens / ours_prefill,
                    "transformers_tokens_per_s": tokens / hf_prefill,
                    "speedup": hf_prefill / ours_prefill},
        "max_abs_last_logit_diff": float(np.abs(ours_last - ref_last).max()),
        "max_abs_last_logit": float(np.abs(ref_last).max()),
    }
    write_json(args.json, result)
    progress.update()
    progress.close()
    print(json.dumps({k: result[k] for k in ("vision", "prefill", "max_abs_last_logit_diff")},
                     indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
