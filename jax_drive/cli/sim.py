"""`jax-drive sim`: run the cooperative driving simulator with a baseline policy.

    jax-drive sim list
    jax-drive sim run --scenario tv_red_light --policy rule_based --episodes 10 \
        [--seeds 3] [--config alternate|accident|safe] [--background] \
        [--plot out.png] [--json out.json] [--replay out.jsonl]
"""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers) -> None:
    parser = subparsers.add_parser("sim", help="multi-agent cooperative driving simulator")
    sub = parser.add_subparsers(dest="sim_command", required=True)
    ls = sub.add_parser("list", help="list scenarios and policies")
    ls.set_defaults(func=_list)
    run = sub.add_parser("run", help="run episodes and print the metric table")
    run.add_argument("--scenario", required=True)
    run.add_argument("--policy", default="rule_based", help="rule_based | silent")
    run.add_argument("--episodes", type=int, default=10, help="episodes per seed")
    run.add_argument("--seeds", type=int, default=1)
    run.add_argument("--seed", type=int, default=0, help="first seed")
    run.add_argument("--config", default="alternate", choices=("alternate", "accident", "safe"),
                     help="accident-prone / safe configurations (alternate: half each)")
    run.add_argument("--background", action="store_true", help="add background traffic")
    run.add_argument("--plot", default=None, metavar="PATH", help="write a PNG of the first episode here")
    run.add_argument("--json", default=None, help="write metrics JSON here")
    run.add_argument("--replay", default=None, help="write replay transitions (JSONL) here")
    run.set_defaults(func=_run)


def _list(args) -> int:
    from jax_drive.coop import baselines
    from jax_drive.sim import scenarios

    print("TalkingVehicles:", ", ".join(scenarios.TALKING_VEHICLES))
    print("InterDrive:     ", ", ".join(scenarios.INTERDRIVE))
    print("policies:       ", ", ".join(baselines.POLICIES))
    return 0


def _run(args) -> int:
    from jax_drive.coop import baselines, evaluate
    from jax_drive.sim import scenarios

    try:
        scenarios.family(args.scenario)
        policy = baselines.make_policy(args.policy)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.episodes < 1 or args.seeds < 1:
        print("error: --episodes and --seeds must be >= 1", file=sys.stderr)
        return 2
    report = evaluate.evaluate(
        args.scenario, policy, seeds=range(args.seed, args.seed + args.seeds), episodes=args.episodes,
        config=args.config, background=args.background, record=bool(args.replay),
        keep_first_trajectory=bool(args.plot), show_progress=True)
    print(evaluate.table([report]))
    for line in report["feedback_examples"]:
        print("  " + line)
    if args.plot:
        from jax_drive.coop.render import render_episode

        render_episode(report["first_episode"], args.plot)
        print(f"rendering: {args.plot}")
    if args.replay:
        from jax_drive.coop.replay import save_jsonl

        save_jsonl(report["transitions"], args.replay)
        print(f"replay: {args.replay} ({len(report['transitions'])} transitions)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(evaluate.to_json(report), f, indent=2)
        print(f"metrics: {args.json}")
    return 0


def main(argv=None) -> int:  # pragma: no cover - convenience
    parser = argparse.ArgumentParser(prog="jax-drive")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)
