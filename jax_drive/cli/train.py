"""`jax-drive train`: the MTDrive pipeline (SFT -> RL curation -> mtGRPO -> evaluation).

    jax-drive train --preset cpu-demo [--out DIR] [--json OUT] [--resume] [--seed S]
        [--advantage {grpo,mtgrpo_intra,mtgrpo_cross}] [--skip-rl] [--sft-from DIR]
        [--sft-steps N] [--sft-max-tokens N] [--sft-recovery N]
        [--sft-onpolicy-scenes N] [--sft-onpolicy-steps N] [--rl-steps N] [--rl-prompts N] [--rl-lr LR]
        [--rl-kl BETA] [--rl-improvement-bonus ALPHA] [--curation-scenes N] [--curation-easy-ratio R]
        [--evaluate STAGE ...] [--engine-url URL [--engine-model NAME]] [--no-progress]

The one MTDrive front end (``experiments/mtdrive.py`` runs :func:`main` with the same
flags). ``--out`` is the run directory (default ``runs/mtdrive_<preset>_s<seed>``): the
journal of finished stages, SFT / RL metrics (``metrics.jsonl``, TensorBoard) and orbax
checkpoints, ``results.json`` and the plots. ``--json OUT`` also writes the results to OUT
and the plots beside it (``<OUT without .json>_<plot>.png``). ``--resume`` continues a run
killed in ``--out`` at the stage and step where it died; without it, ``--out`` must not
hold a run. The ``--sft-*``, ``--rl-*`` and ``--curation-*`` flags override the preset's
budget (a budget study without a new preset; ``results.json`` records the budget it ran).
``--engine-url`` has an OpenAI-compatible server (``jax-drive serve`` or vLLM,
serving the preset's base model) generate the RL rollouts; the trainer pushes its policy to
it after every step (LoRA adapter or full weights). Exit status: 0 done, 2 bad usage or
input, 1 a failure while running.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

STAGE_HELP = "policies evaluated on the held-out scenes: untrained, sft, rl (default: all)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The MTDrive flags (shared by ``jax-drive train`` and ``experiments/mtdrive.py``)."""
    parser.add_argument("--preset", default="cpu-demo",
                        help="a preset of jax_drive.pipelines.presets (default cpu-demo; smoke = tiny random model)")
    parser.add_argument("--out", default=None,
                        help="run directory: journal, metrics, checkpoints, results.json, plots "
                             "(default runs/mtdrive_<preset>_s<seed>)")
    parser.add_argument("--json", default=None, help="also write the results JSON here (plots beside it)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out where it stopped")
    parser.add_argument("--seed", type=int, default=None, help="training seed (default: the preset's)")
    parser.add_argument("--advantage", default=None,
                        help="advantage estimator: grpo, mtgrpo_intra or mtgrpo_cross (default: the preset's)")
    parser.add_argument("--skip-rl", action="store_true", help="stop after SFT and its evaluation")
    parser.add_argument("--sft-from", default=None, help="reuse the final SFT policy of an earlier run directory "
                                                           "(its on-policy continuation when it has one)")
    parser.add_argument("--sft-steps", type=int, default=None, help="override the preset's SFT step budget")
    parser.add_argument("--sft-max-tokens", type=int, default=None,
                        help="override the preset's SFT sample length limit (longer samples are left out)")
    parser.add_argument("--sft-recovery", type=int, default=None,
                        help="override the preset's number of format-recovery SFT samples (malformed answer, "
                             "format feedback, expert answer; loss on the last answer only)")
    parser.add_argument("--sft-onpolicy-scenes", type=int, default=None,
                        help="on-policy format recovery after SFT: the SFT policy answers this many fresh scenes and "
                             "SFT continues on its unusable answers (expert + recovery rows, SFT rows replayed); 0 = off")
    parser.add_argument("--sft-onpolicy-steps", type=int, default=None,
                        help="SFT steps of the on-policy recovery continuation (default: the preset's, 16)")
    parser.add_argument("--rl-steps", type=int, default=None, help="override the preset's number of mtGRPO steps")
    parser.add_argument("--rl-prompts", type=int, default=None, help="override the preset's prompts (scenes) per mtGRPO step")
    parser.add_argument("--rl-lr", type=float, default=None, help="override the preset's mtGRPO learning rate")
    parser.add_argument("--rl-kl", type=float, default=None, metavar="BETA",
                        help="override the preset's mtGRPO KL coefficient (k3 KL to the SFT policy; 0 = no KL term "
                             "and no reference pass)")
    parser.add_argument("--rl-improvement-bonus", type=float, default=None, metavar="ALPHA",
                        help="refinement bonus: a later turn also earns ALPHA times its reward gain over the turn "
                             "before (SCoRe's shaping against copying the first answer; default: the preset's, 0)")
    parser.add_argument("--curation-scenes", type=int, default=None,
                        help="override how many training scenes RL curation draws its prompts from")
    parser.add_argument("--curation-easy-ratio", type=float, default=None, metavar="R",
                        help="easy scenes RL curation keeps per scene whose first answer draws feedback or scores "
                             "low (default: the preset's, 1.0; 0 = only those)")
    parser.add_argument("--evaluate", nargs="+", default=None, metavar="STAGE", help=STAGE_HELP)
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


def _usage_error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _with_overrides(preset, args: argparse.Namespace):
    """The preset with the budget flags that were given (ValueError names a bad value)."""
    replace = dataclasses.replace
    if args.sft_steps is not None:
        preset = replace(preset, sft=replace(preset.sft, max_steps=args.sft_steps))
    if args.sft_max_tokens is not None:
        preset = replace(preset, sft_max_tokens=args.sft_max_tokens)
    if args.sft_recovery is not None:
        preset = replace(preset, sft_recovery=args.sft_recovery)
    if args.sft_onpolicy_scenes is not None:
        preset = replace(preset, sft_onpolicy_scenes=args.sft_onpolicy_scenes)
    if args.sft_onpolicy_steps is not None:
        preset = replace(preset, sft_onpolicy_steps=args.sft_onpolicy_steps)
    if args.curation_scenes is not None:
        preset = replace(preset, curation_scenes=args.curation_scenes)
    if args.curation_easy_ratio is not None:
        preset = replace(preset, curation_easy_ratio=args.curation_easy_ratio)
    rl = {"steps": args.rl_steps, "prompts_per_step": args.rl_prompts}
    rl = {k: v for k, v in rl.items() if v is not None}
    if args.rl_lr is not None:
        rl["optim"] = replace(preset.rl.optim, learning_rate=args.rl_lr)
    if args.rl_kl is not None:
        rl["loss"] = replace(preset.rl.loss, kl_coef=args.rl_kl)
    if args.rl_improvement_bonus is not None:
        rl["rollout"] = replace(preset.rl.rollout, improvement_weight=args.rl_improvement_bonus)
    return replace(preset, rl=replace(preset.rl, **rl)) if rl else preset


def run(args: argparse.Namespace) -> int:
    from jax_drive.pipelines.journal import RunDirError
    from jax_drive.pipelines.mtdrive import STAGES, final_sft_dir, run_mtdrive
    from jax_drive.pipelines.plots import write_plots
    from jax_drive.pipelines.presets import PRESETS, with_seed
    from jax_drive.pipelines.report import goals_lines, public, quality_goals, results_table, write_results
    from jax_drive.rl.advantages import ADVANTAGE_MODES
    from jax_drive.rl.checkpoint import committed_steps

    if args.preset not in PRESETS:
        return _usage_error(f"unknown preset {args.preset!r}; choose from {sorted(PRESETS)}")
    if args.advantage is not None and args.advantage not in ADVANTAGE_MODES:
        return _usage_error(f"unknown advantage {args.advantage!r}; choose from {list(ADVANTAGE_MODES)}")
    evaluate = list(STAGES) if args.evaluate is None else args.evaluate
    if set(evaluate) - set(STAGES):
        return _usage_error(f"unknown stages {sorted(set(evaluate) - set(STAGES))}; choose from {list(STAGES)}")
    if args.sft_from is not None and not committed_steps(final_sft_dir(args.sft_from)):
        return _usage_error(f"--sft-from {args.sft_from}: no SFT checkpoint in {final_sft_dir(args.sft_from)}")
    try:
        preset = _with_overrides(PRESETS[args.preset], args)
        if args.seed is not None:
            preset = with_seed(preset, args.seed)
    except ValueError as error:
        return _usage_error(str(error))
    if args.engine_model is not None and args.engine_url is None:
        return _usage_error("--engine-model names a model of the --engine-url server; give --engine-url")
    if args.engine_url is not None:
        if args.skip_rl:
            return _usage_error("--engine-url serves the RL rollouts; --skip-rl skips RL")
        if preset.prompt.uses_images:
            return _usage_error(f"--engine-url: preset {preset.name!r} prompts with images; remote rollouts are "
                                "text only (OpenAIEngine sends no images)")
        from jax_drive.rl.weight_sync import served_base_model
        from jax_drive.sampling.openai_engine import OpenAIEngineError

        try:  # before SFT, not after it: a wrong URL or name fails in seconds
            served_base_model(args.engine_url, args.engine_model)
        except (OpenAIEngineError, ValueError) as error:
            return _usage_error(f"--engine-url {args.engine_url}: {error}")
    out = args.out or os.path.join("runs", f"mtdrive_{args.preset.replace('-', '_')}_s{preset.seed}")
    try:
        results = run_mtdrive(preset, out, advantage=args.advantage, skip_rl=args.skip_rl, sft_from=args.sft_from,
                              evaluate=evaluate, resume=args.resume, progress=not args.no_progress,
                              engine_url=args.engine_url, engine_model=args.engine_model)
    except RunDirError as error:
        return _usage_error(f"{error} (--resume continues it)")
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
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
