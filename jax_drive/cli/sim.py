"""`jax-drive sim`: run the cooperative driving simulator with a baseline policy.

    jax-drive sim list
    jax-drive sim run --scenario tv_red_light --policy rule_based --episodes 10 \
        [--seeds 3] [--config alternate|accident|safe] [--background] \
        [--plot out.png] [--json out.json] [--replay out.jsonl] [--no-progress]

Nothing is written unless a path is given (``--plot``, ``--json``, ``--replay``).
"""

from __future__ import annotations

from jax_drive.names import BASELINES, SCENARIOS
from jax_drive.runinfo import add_output_args, make_parent, output_file, require_min, run_metadata, write_json


def register(subparsers) -> None:
    parser = subparsers.add_parser("sim", help="multi-agent cooperative driving simulator")
    sub = parser.add_subparsers(dest="sim_command", required=True)
    ls = sub.add_parser("list", help="list scenarios and policies")
    ls.set_defaults(func=_list)
    run = sub.add_parser("run", help="run episodes and print the metric table")
    run.add_argument("--scenario", required=True, choices=SCENARIOS, metavar="SCENARIO",
                     help=f"one of {', '.join(SCENARIOS)}")
    run.add_argument("--policy", default="rule_based", choices=BASELINES)
    run.add_argument("--episodes", type=int, default=10, help="episodes per seed")
    run.add_argument("--seeds", type=int, default=1)
    run.add_argument("--seed", type=int, default=0, help="first seed")
    run.add_argument("--config", default="alternate", choices=("alternate", "accident", "safe"),
                     help="accident-prone / safe configurations (alternate: half each)")
    run.add_argument("--background", action="store_true", help="add background traffic")
    run.add_argument("--plot", default=None, metavar="PATH", type=output_file,
                     help="write a PNG of the first episode here")
    run.add_argument("--replay", default=None, metavar="PATH", type=output_file,
                     help="write replay transitions (JSONL) here")
    add_output_args(run)
    run.set_defaults(func=_run)


def _list(args) -> int:
    from jax_drive.coop import baselines
    from jax_drive.sim import scenarios

    print("TalkingVehicles:", ", ".join(scenarios.TALKING_VEHICLES))
    print("InterDrive:     ", ", ".join(scenarios.INTERDRIVE))
    print("policies:       ", ", ".join(baselines.POLICIES))
    return 0


def _run(args) -> int:
    require_min(1, episodes=args.episodes, seeds=args.seeds)
    from jax_drive.coop import baselines, evaluate

    policy = baselines.make_policy(args.policy)
    report = evaluate.evaluate(
        args.scenario, policy, seeds=range(args.seed, args.seed + args.seeds), episodes=args.episodes,
        config=args.config, background=args.background, record=bool(args.replay),
        keep_first_trajectory=bool(args.plot), show_progress=not args.no_progress)
    print(evaluate.table([report]))
    for line in report["feedback_examples"]:
        print("  " + line)
    if args.plot:
        from jax_drive.coop.render import render_episode

        render_episode(report["first_episode"], make_parent(args.plot))
        print(f"rendering: {args.plot}")
    if args.replay:
        from jax_drive.coop.replay import save_jsonl

        save_jsonl(report["transitions"], make_parent(args.replay))
        print(f"replay: {args.replay} ({len(report['transitions'])} transitions)")
    if args.json:
        write_json(args.json, {"meta": run_metadata(command="sim run"), **evaluate.to_json(report)})
        print(f"metrics: {args.json}")
    return 0
