"""``jax-drive data build``: write a JSONL dataset of chat records from generated scenes.

Example::

    jax-drive data build --kind multi --scenes 256 --out data/multi.jsonl --seed 0
    jax-drive data build --kind multi --scenes-file scenes.json.gz --out data/multi.jsonl

Scenes come from ``jax_drive.scenes.generate_scenes(jax.random.key(seed), ...)``; scene ``i``
is reproducible from (seed, hard fraction, scene_id) alone (``meta.scene_seed`` and
``meta.hard_fraction`` in every record). Each
chunk of ``--batch-size`` scenes is scored in one jitted scorer call (default: all scenes
in one chunk). A data card (records per kind, first-turn failures per metric, RL
categories, QA balance) is printed at the end and optionally written as JSON.

With ``--scenes-file`` (format: ``jax_drive/scenes/io.py``) the records come from the
file's scenes instead, built capacity group by capacity group; ``scene_id`` is the scene's
index in the file and ``meta.token`` its token.
"""

from __future__ import annotations

import json
import sys

from jax_drive.runinfo import (InputError, finite_float, make_parent, output_file, require_min, require_range,
                               run_metadata, write_json)

KINDS = ("single", "multi", "recovery", "qa", "rl")  # jax_drive.data.builders.KINDS (no jax import here)


def register(subparsers) -> None:
    parser = subparsers.add_parser("data", help="build datasets (SFT single/multi-turn, PDM QA, RL prompts)")
    sub = parser.add_subparsers(dest="data_command", required=True)
    build = sub.add_parser("build", help="build one dataset kind from generated scenes")
    build.add_argument("--kind", choices=KINDS, required=True, help="dataset kind")
    build.add_argument("--scenes", type=int, default=None, help="number of generated scenes")
    build.add_argument("--scenes-file", default=None, help="build from the scenes of this scene file instead")
    build.add_argument("--out", required=True, type=output_file, help="output JSONL file (folders are created)")
    build.add_argument("--seed", type=int, default=0, help="PRNG seed of scenes and sampling (default 0)")
    build.add_argument("--hard-fraction", type=finite_float, default=None,
                       help="share of hard scenes (default: the generator's default)")
    build.add_argument("--perception", choices=("camera", "text", "none"), default="camera",
                       help="prompt item 1: camera (MTDrive), text scene caption, or none")
    build.add_argument("--no-image", action="store_true", help="omit the <image> placeholder")
    build.add_argument("--system-prompt", action="store_true", help="prepend the PDM system message")
    build.add_argument("--mock-turns", type=int, default=3, help="multi: noisy turns per mock sample (<2: off)")
    build.add_argument("--reference", choices=("auto", "pdm_closed", "expert"), default="auto",
                       help="EP reference used to score first turns (default auto: PDM-Closed if available)")
    build.add_argument("--easy-ratio", type=finite_float, default=1.0, help="rl: category-3 samples per hard sample")
    build.add_argument("--qa-per-class", type=int, default=2, help="qa: yes and no questions per metric and scene")
    build.add_argument("--batch-size", type=int, default=0, help="scenes per scorer call (0: all at once)")
    build.add_argument("--card", default=None, type=output_file, help="also write the data card as JSON here")
    build.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    build.set_defaults(func=run_build)


def _check(args) -> None:
    if (args.scenes is None) == (args.scenes_file is None):
        raise InputError("give either --scenes N (generated scenes) or --scenes-file FILE")
    if args.scenes_file is not None and args.hard_fraction is not None:
        raise InputError("--hard-fraction applies to generated scenes, not to --scenes-file")
    require_min(1, scenes=args.scenes, qa_per_class=args.qa_per_class)
    require_min(0, batch_size=args.batch_size, easy_ratio=args.easy_ratio)
    require_range(0.0, 1.0, hard_fraction=args.hard_fraction)


def run_build(args) -> int:
    _check(args)
    import jax
    from tqdm import tqdm

    from jax_drive.data import builders as B
    from jax_drive.data.card import DataCard
    from jax_drive.scenes import GeneratorConfig, generate_scenes
    from jax_drive.text.prompts import PromptConfig
    from jax_drive.text.qa import QAConfig

    config = B.BuildConfig(
        prompt=PromptConfig(perception=args.perception, image_placeholder=not args.no_image,
                            system_prompt=args.system_prompt),
        qa=QAConfig(per_class=args.qa_per_class),
        reference=args.reference,
        easy_ratio=args.easy_ratio,
        mock_turns=args.mock_turns,
    )
    gen_config = GeneratorConfig() if args.hard_fraction is None else GeneratorConfig(hard_fraction=args.hard_fraction)
    scene_key = jax.random.key(args.seed)
    build_key = jax.random.fold_in(scene_key, 0x5EED)
    predictor = B.ConstantVelocityPredictor()
    if args.scenes_file is not None:
        from jax_drive.scenes.io import SceneFileError, load_scenes

        try:
            scene_file = load_scenes(args.scenes_file)
        except SceneFileError as e:
            raise InputError(str(e)) from None
        num_scenes = len(scene_file)
        batch = args.batch_size or num_scenes

        def batches():  # (key offset, scene batch builder, count) per capacity group and chunk
            for indices, sizes in scene_file.groups():
                for start in range(0, len(indices), batch):
                    chunk = indices[start: start + batch]
                    yield int(chunk[0]), (lambda c=chunk, z=sizes: scene_file.build(c, z)), len(chunk)
    else:
        num_scenes = args.scenes
        batch = args.batch_size or num_scenes

        def batches():
            for start, size in B.iterate_batches(num_scenes, batch):
                yield start, (lambda a=start, z=size: generate_scenes(scene_key, z, gen_config, start_id=a)), size
    card = DataCard(kind=args.kind, num_scenes=num_scenes, seed=args.seed, out=args.out)
    with open(make_parent(args.out), "w", encoding="utf-8") as out, tqdm(
        total=num_scenes, desc=f"data build {args.kind}", unit="scene", disable=args.no_progress
    ) as bar:
        for start, make, size in batches():
            bar.set_postfix_str("loading" if args.scenes_file else "generating")
            scene = make()
            key = jax.random.fold_in(build_key, start)
            bar.set_postfix_str("building")
            if args.kind == "single":
                records, stats = B.build_single(scene, config), {}
            elif args.kind == "multi":
                records, stats = B.build_multi(scene, predictor, key, config)
            elif args.kind == "recovery":
                records, recovery_counts = B.build_recovery(scene, key, config)
                stats = {"recovery": recovery_counts}
            elif args.kind == "qa":
                records, qa_counts = B.build_qa(scene, key, config)
                stats = {"qa": qa_counts}
            else:
                records, stats = B.build_rl(scene, predictor, key, config)
            for record in records:
                if args.scenes_file is not None:
                    record["meta"]["token"] = scene_file.tokens[record["scene_id"]]
                else:
                    record["meta"]["scene_seed"] = args.seed
                    record["meta"]["hard_fraction"] = gen_config.hard_fraction
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
            card.add_records(records)
            card.add_stats(stats)
            bar.update(size)
    print(card.to_text())
    if args.card:
        write_json(args.card, {"meta": run_metadata(command="data build"), **card.to_dict()})
    return 0


if __name__ == "__main__":  # pragma: no cover
    from jax_drive.cli import main

    sys.exit(main(["data", *sys.argv[1:]]))
