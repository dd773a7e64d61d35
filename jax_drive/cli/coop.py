"""`jax-drive coop`: one TalkingVehicles scenario with a chosen language-agent method.

    jax-drive coop --scenario tv_red_light --method zero_shot [--preset cpu-demo] \
        [--engine jax|openai] [--model NAME] [--base-url URL] [--episodes 2] [--seeds 1] \
        [--student DIR] [--run-dir DIR] [--json OUT] [--no-progress]

Learns first when the method learns (reflection, correction_rag, debrief), distils first for
``distilled`` unless ``--student`` names a trained policy, then evaluates and prints the
CR / SR / TR (collision, success, timeout rates) table and the latency / bytes row.
"""

from __future__ import annotations

from jax_drive.names import TALKING_VEHICLES_METHODS as METHODS
from jax_drive.names import TALKING_VEHICLES_PRESETS as PRESET_NAMES
from jax_drive.names import TALKING_VEHICLES_SCENARIOS
from jax_drive.runinfo import InputError, add_output_args, check_output, output_dir, require_min


def register(subparsers) -> None:
    parser = subparsers.add_parser("coop", help="talking language agents on one cooperative scenario")
    parser.add_argument("--scenario", required=True, choices=TALKING_VEHICLES_SCENARIOS)
    parser.add_argument("--method", default="zero_shot", choices=[m for m in METHODS if m != "central_memory"],
                        help="central_memory needs every scenario's debrief run: experiments/talking_vehicles.py")
    parser.add_argument("--preset", default="cpu-demo", choices=PRESET_NAMES)
    parser.add_argument("--engine", choices=("jax", "openai"), default=None, help="default: the preset's")
    parser.add_argument("--model", default=None, help="LLM agents' model (load_pretrained source or served name)")
    parser.add_argument("--base-url", default=None, help="OpenAI-compatible server for --engine openai")
    parser.add_argument("--episodes", type=int, default=2, help="evaluation episodes per seed (alternating)")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--student", default=None, help="a distilled policy directory (method distilled)")
    parser.add_argument("--run-dir", default=None, type=output_dir, help="default: runs/coop/<scenario>/<preset>")
    parser.add_argument("--force", action="store_true", help="rerun even if the run dir has a result")
    add_output_args(parser)
    parser.set_defaults(func=_run)


def _run(args) -> int:
    import dataclasses
    import os

    from jax_drive.runinfo import run_metadata, write_json

    require_min(1, episodes=args.episodes, seeds=args.seeds)
    if args.student and not os.path.isdir(args.student):
        raise InputError(f"--student {args.student!r} is not a directory")
    run_dir = args.run_dir or os.path.join("runs", "coop", args.scenario, args.preset)
    check_output(run_dir, "--run-dir", directory=True)
    from jax_drive.pipelines import talking_vehicles as TV

    changes = {k: v for k, v in (("engine", args.engine), ("model", args.model), ("base_url", args.base_url)) if v}
    try:
        preset = dataclasses.replace(TV.PRESETS[args.preset], scenarios=(args.scenario,),
                                     seeds=tuple(range(args.seeds)), eval_episodes=args.episodes,
                                     baseline_eval_episodes=args.episodes, student_path=args.student or "", **changes)
    except ValueError as error:
        raise InputError(str(error)) from None
    result = TV.run_method(preset, args.method, run_dir, progress=not args.no_progress, force=args.force,
                           story=args.scenario)
    print(TV.table_rows({args.method: result}, [args.scenario], keys=("CR", "SR", "TR")))
    if preset.max_time is not None:
        print(f"note: preset {preset.name} ends every episode after {preset.max_time:g} s (the scenarios' own "
              "limits are longer); TR counts the episodes still driving then, which are not successes")
    print(TV.table3_rows({args.method: result}))
    if args.json:
        write_json(args.json, {"scenario": args.scenario, "method": args.method, "preset": preset.name,
                               "result": result, "meta": run_metadata(command="coop", run_dir=run_dir)})
    return 0
