"""`jax-drive train`: the MTDrive pipeline (SFT -> RL curation -> mtGRPO -> evaluation).

    jax-drive train --preset cpu-demo [--out DIR] [--json OUT] [--resume] [--seed S]
        [--set PATH=VALUE ...] [--preset-file F.json] [--advantage {grpo,mtgrpo_intra,mtgrpo_cross}]
        [--skip-rl] [--sft-from DIR] [--evaluate STAGE ...] [--engine-url URL [--engine-model NAME]]
        [--no-progress]

The one MTDrive front end (``experiments/mtdrive.py`` runs :func:`main` with the same
flags). ``--out`` is the run directory (default ``runs/mtdrive_<preset>_s<seed>``): the
journal of finished stages, SFT / RL metrics (``metrics.jsonl``, TensorBoard) and orbax
checkpoints, ``results.json`` and the plots. ``--json OUT`` also writes the results to OUT
and the plots beside it (``<OUT without .json>_<plot>.png``). ``--resume`` continues a run
killed in ``--out`` at the stage and step where it died; without it, ``--out`` must not
hold a run. ``--set PATH=VALUE`` changes any field of the preset by its dotted path
(``--set rl.optim.learning_rate=5e-5 --set sft.max_steps=96``; a budget study without a
new preset); ``--preset-file F.json`` applies a JSON object of such paths first.
``results.json`` records the budget it ran. ``--engine-url`` has an OpenAI-compatible
server (``jax-drive serve`` or vLLM, serving the preset's base model) generate the RL
rollouts; the trainer pushes its policy to it after every step (LoRA adapter or full
weights). Exit status: 0 done, 2 bad usage or input, 1 a failure while running.
"""

from __future__ import annotations

import argparse
import os
import sys

from jax_drive.cli.overrides import add_override_args, preset_with_overrides
from jax_drive.names import ADVANTAGE_MODES, MTDRIVE_POLICIES, MTDRIVE_PRESETS
from jax_drive.runinfo import InputError, check_output, output_dir, output_file, parse_and_run, run_metadata

STAGE_HELP = f"policies evaluated on the held-out scenes: {', '.join(MTDRIVE_POLICIES)} (default: all)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The MTDrive flags (shared by ``jax-drive train`` and ``experiments/mtdrive.py``)."""
    parser.add_argument("--preset", default="cpu-demo", choices=MTDRIVE_PRESETS,
                        help="default cpu-demo; smoke = tiny random model; smoke-vlm = its vision-language twin; "
                             "cpu-study = the studied CPU recipe")
    parser.add_argument("--out", default=None, type=output_dir,
                        help="run directory: journal, metrics, checkpoints, results.json, plots "
                             "(default runs/mtdrive_<preset>_s<seed>)")
    parser.add_argument("--json", default=None, type=output_file, metavar="OUT",
                        help="also write the results JSON here (plots beside it)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out where it stopped")
    parser.add_argument("--seed", type=int, default=None, help="training seed (default: the preset's)")
    add_override_args(parser)
    parser.add_argument("--advantage", default=None, choices=ADVANTAGE_MODES,
                        help="advantage estimator (default: the preset's)")
    parser.add_argument("--skip-rl", action="store_true", help="stop after SFT and its evaluation")
    parser.add_argument("--sft-from", default=None, help="reuse the final SFT policy of an earlier run directory "
                                                           "(its on-policy continuation when it has one)")
    parser.add_argument("--evaluate", nargs="+", default=None, choices=MTDRIVE_POLICIES, metavar="STAGE",
                        help=STAGE_HELP)
    parser.add_argument("--engine-url", default=None,
                        help="generate RL rollouts on this OpenAI-compatible server (jax-drive serve, vLLM), "
                             "pushing the policy after every step")
    parser.add_argument("--engine-model", default=None,
                        help="the server's name of the base model (default: the first it lists)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def register(subparsers) -> None:
    parser = subparsers.add_parser("train", help="SFT + mtGRPO on generated scenes (MTDrive)", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    evaluate = list(MTDRIVE_POLICIES) if args.evaluate is None else args.evaluate
    if args.engine_model is not None and args.engine_url is None:
        raise InputError("--engine-model names a model of the --engine-url server; give --engine-url")
    if args.engine_url is not None and args.skip_rl:
        raise InputError("--engine-url serves the RL rollouts; --skip-rl skips RL")
    if args.sft_from is not None and not os.path.isdir(args.sft_from):
        raise InputError(f"--sft-from {args.sft_from} is not a directory")
    check_output(args.out or "runs", "--out", directory=True)  # the default's seed is known once the preset is
    from jax_drive.pipelines.journal import RunDirError
    from jax_drive.pipelines.mtdrive import final_sft_dir, run_mtdrive
    from jax_drive.pipelines.mtdrive.plots import write_plots
    from jax_drive.pipelines.mtdrive.presets import PRESETS, with_seed
    from jax_drive.pipelines.mtdrive.report import goals_lines, public, quality_goals, results_table, write_results
    from jax_drive.rl.checkpoint import committed_steps
    from jax_drive.rl.loop import NonFiniteError

    if args.sft_from is not None and not committed_steps(final_sft_dir(args.sft_from)):
        raise InputError(f"--sft-from {args.sft_from}: no SFT checkpoint in {final_sft_dir(args.sft_from)}")
    preset = preset_with_overrides(PRESETS[args.preset], args)
    if args.seed is not None:
        preset = with_seed(preset, args.seed)
    if args.engine_url is not None:
        if preset.prompt.uses_images:
            raise InputError(f"--engine-url: preset {preset.name!r} prompts with images; remote rollouts are "
                             "text only (OpenAIEngine sends no images)")
        from jax_drive.rl.weight_sync import served_base_model
        from jax_drive.sampling.openai_engine import OpenAIEngineError

        try:  # before SFT, not after it: a wrong URL or name fails in seconds
            served_base_model(args.engine_url, args.engine_model)
        except (OpenAIEngineError, ValueError) as error:
            raise InputError(f"--engine-url {args.engine_url}: {error}") from None
    out = args.out or os.path.join("runs", f"mtdrive_{args.preset.replace('-', '_')}_s{preset.seed}")
    try:
        results = run_mtdrive(preset, out, advantage=args.advantage, skip_rl=args.skip_rl, sft_from=args.sft_from,
                              evaluate=evaluate, resume=args.resume, progress=not args.no_progress,
                              engine_url=args.engine_url, engine_model=args.engine_model)
    except RunDirError as error:
        raise InputError(f"{error} (--resume continues it)") from None
    except NonFiniteError as error:  # a failure, not bad usage: one line, exit 1, no results written
        print(f"error: {error}; --set rl.optim.skip_nonfinite=true (or sft.optim...) drops such updates instead",
              file=sys.stderr)
        return 1
    results["meta"] = run_metadata(command="train")
    write_results(results, os.path.join(out, "results.json"))
    written = write_plots(results, os.path.join(out, ""))
    if args.json:
        write_results(results, args.json)
        stem = args.json[:-len(".json")] if args.json.endswith(".json") else args.json
        written += write_plots(results, stem + "_")
    print(results_table(public(results)))
    print(goals_lines(quality_goals([public(results)])))
    print(f"results: {os.path.join(out, 'results.json')}" + (f" and {args.json}" if args.json else "")
          + f"; plots: {', '.join(written)}; timings (s): {results['timings_s']}")
    return 0


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Parses the MTDrive flags and runs the pipeline (for scripts that wrap this command)."""
    return parse_and_run(add_arguments, run, argv, prog, __doc__.splitlines()[0])
