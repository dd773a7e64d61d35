"""`jax-drive coop-rl`: talking vehicles trained by reinforcement learning (GRPO on the joint
return), evaluated frozen on held-out episodes.

    jax-drive coop-rl --preset tiny-study [--out DIR] [--resume] [--set PATH=VALUE ...]
        [--preset-file F.json] [--json OUT] [--no-progress]

Presets: ``smoke`` (tests), ``tiny-study`` (a random tiny model, the CPU study),
``tiny-distilled`` (the tiny model distilled from the language rule teacher first, then RL),
``cpu-demo`` (SmolLM2 with LoRA from its zero-shot answers, small scale), ``paper`` (the
accelerator protocol). ``--out`` (default ``runs/coop_rl_<preset>``) holds each training
seed's metrics, TensorBoard scalars and checkpoints, each finished evaluation, the recorded
preset, ``results.json``, ``curves.png`` and ``storyboard.png`` (a trained episode with its
messages). ``--resume`` continues a killed run where it
stopped (training from its last checkpoint; finished evaluations are read back); the preset
must then be the recorded one. Exit status: 0 done, 2 bad usage or input, 1 a failure.
"""

from __future__ import annotations

import argparse
import os
import sys

from jax_drive.cli.overrides import add_override_args, preset_with_overrides
from jax_drive.names import COOP_RL_PRESETS as PRESETS
from jax_drive.runinfo import InputError, add_output_args, check_output, output_dir, parse_and_run, run_metadata



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="tiny-study", choices=PRESETS)
    parser.add_argument("--out", default=None, type=output_dir, help="run directory (default runs/coop_rl_<preset>)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out where it stopped")
    parser.add_argument("--only-seed", type=int, default=None, metavar="S",
                        help="train and evaluate only training seed S (one process per seed, or per machine); "
                             "a later call without it (with --resume) summarises")
    add_override_args(parser)
    add_output_args(parser)


def register(subparsers) -> None:
    parser = subparsers.add_parser("coop-rl", help="talking vehicles trained by RL (GRPO on the joint return)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = args.out or os.path.join("runs", f"coop_rl_{args.preset.replace('-', '_')}")
    check_output(out, "--out", directory=True)
    from jax_drive.pipelines import coop_rl as P
    from jax_drive.rl.loop import NonFiniteError
    from jax_drive.runinfo import write_json

    preset = preset_with_overrides(P.PRESETS[args.preset], args)
    if args.only_seed is not None and args.only_seed not in preset.training_seeds:
        raise InputError(f"--only-seed {args.only_seed}: not one of the preset's training seeds "
                         f"{list(preset.training_seeds)}")
    try:
        results = P.run(preset, out, resume=args.resume, progress=not args.no_progress, only_seed=args.only_seed)
    except P.RunDirError as error:
        raise InputError(str(error)) from None
    except NonFiniteError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if results is None:
        print(f"training seed {args.only_seed} trained and evaluated in {out}; the other seeds' runs, then "
              "the same command without --only-seed (with --resume), write the summary")
        return 0
    results["meta"] = run_metadata(command="coop-rl", run_dir=out)
    write_json(os.path.join(out, "results.json"), results)
    plots = P.write_plots(results, os.path.join(out, ""))
    if args.json:
        write_json(args.json, results)
        stem = args.json[:-len(".json")] if args.json.endswith(".json") else args.json
        plots += P.write_plots(results, stem + "_")
    print(P.summary_table(results))
    print(f"results: {os.path.join(out, 'results.json')}" + (f" and {args.json}" if args.json else "")
          + f"; plots: {', '.join(plots)}")
    return 0


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Parses the coop-rl flags and runs the pipeline (experiments/coop_rl.py)."""
    return parse_and_run(add_arguments, run, argv, prog, __doc__.splitlines()[0])
