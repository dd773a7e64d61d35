"""CoLMDriver on InterDrive: the seed's Table 2 ablation, its Fig. 5 and a rendered episode.

The ablation runs with a fine-tuned SmolLM2 negotiator (or a served model, or the
rule-based teacher), the Fig. 5 convergence study and one rendered episode with its dialogue.

    python experiments/interdrive.py --preset cpu-demo --engine jax --json OUT.json
    python experiments/interdrive.py --preset smoke --work-dir /tmp/id-smoke --json /tmp/id-smoke.json  # check

The ``smoke`` preset (a random tiny model that cannot negotiate, two types, one seed) runs
every stage in a few minutes on a CPU; its numbers mean nothing.

Stages (``--stage``, default ``all``): data, sft, probe, eval, fig5, render, report, as
:mod:`jax_drive.pipelines.interdrive.pipeline` describes them. Every stage reuses what an
earlier run left in ``--work-dir`` (default ``runs/interdrive-<preset>``, ``-<engine>``
appended for openai and teacher), so a run can be stopped and started again, and arms can be
run one by one with ``--arms``; results of another negotiator or closed-loop revision are run
again. ``--set PATH=VALUE`` changes any preset field.

``--engine openai --url URL [--served-model NAME]`` negotiates with a served model
(vLLM) instead of the local JAX engine; the SFT stages are then skipped (serve the
fine-tuned adapter). ``--engine teacher`` lets the rule-based teacher (the SFT data's
source, no language model) negotiate: the ceiling the fine-tuned model is trained towards,
in minutes on a CPU. A rule-based intention planner stands in for the paper's VLM
intention planner.
"""

from __future__ import annotations

import argparse
import os
import sys

from jax_drive.cli.overrides import add_override_args, preset_with_overrides
from jax_drive.names import BASELINES, INTERDRIVE_ARMS, INTERDRIVE_PRESETS, INTERDRIVE_SCENARIOS, INTERDRIVE_STAGES
from jax_drive.runinfo import InputError, add_output_args, check_output, output_dir, run_main


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu-demo", choices=INTERDRIVE_PRESETS)
    add_override_args(parser)
    parser.add_argument("--engine", choices=("jax", "openai", "teacher"), default="jax",
                        help="negotiator: the fine-tuned local model, a served model, or the rule-based teacher")
    parser.add_argument("--url", default=None, help="OpenAI-compatible server (with --engine openai)")
    parser.add_argument("--served-model", default=None, help="model name on the server (default: the preset's)")
    parser.add_argument("--adapter", default=None, help="use this PEFT adapter instead of training one")
    parser.add_argument("--critic-adapter", default=None,
                        help="the consensus critic is the base model with this adapter (e.g. the critic-only "
                             "fine-tune of experiments/interdrive_critic.py); default: the negotiator's own")
    parser.add_argument("--stage", choices=INTERDRIVE_STAGES + ("all",), default="all")
    parser.add_argument("--arms", default=None, help="comma-separated Table 2 arms / baselines to evaluate "
                        f"(default: all of {', '.join(INTERDRIVE_ARMS + BASELINES)})")
    parser.add_argument("--background", choices=("off", "on", "both"), default="both")
    parser.add_argument("--work-dir", default=None, type=output_dir,
                        help="run directory (default runs/interdrive-<preset>, -<engine> appended unless jax)")
    parser.add_argument("--render-type", default="ic_straight_left", choices=INTERDRIVE_SCENARIOS,
                        help="InterDrive type of the rendered episode")
    add_output_args(parser, json_required=True)
    args = parser.parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    if args.engine == "openai" and not args.url:  # checks that need no heavy import come first
        raise InputError("--engine openai needs --url")
    for flag, path in (("--adapter", args.adapter), ("--critic-adapter", args.critic_adapter)):
        if path is not None and not os.path.isdir(path):
            raise InputError(f"{flag} {path} is not a directory")
    arms = [a.strip() for a in (args.arms or ",".join(INTERDRIVE_ARMS + BASELINES)).split(",") if a.strip()]
    unknown = [a for a in arms if a not in INTERDRIVE_ARMS + BASELINES]
    if unknown or not arms:
        raise InputError(f"unknown arms {unknown}; choose from {', '.join(INTERDRIVE_ARMS + BASELINES)}")

    suffix = "" if args.engine == "jax" else f"-{args.engine}"  # arms of different negotiators never mix
    work_dir = args.work_dir or check_output(os.path.join("runs", f"interdrive-{args.preset}{suffix}"), "--work-dir",
                                             directory=True)
    from jax_drive.pipelines.interdrive import PRESETS, run_interdrive

    preset = preset_with_overrides(PRESETS[args.preset], args)
    backgrounds = {"off": (False,), "on": (True,), "both": (False, True)}[args.background]
    run_interdrive(preset, work_dir, engine=args.engine, stage=args.stage, arms=arms, backgrounds=backgrounds,
                   url=args.url, served_model=args.served_model, adapter=args.adapter,
                   critic_adapter=args.critic_adapter, render_type=args.render_type,
                   json_path=args.json, command="python experiments/interdrive.py " + " ".join(argv),
                   progress=not args.no_progress)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
