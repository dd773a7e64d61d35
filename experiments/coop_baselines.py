"""Rule-based and silent baselines on the six TalkingVehicles scenarios (CR / SR / TR)
and the ten InterDrive types without and with background traffic (DS / RC / IS / SR),
3 seeds, mean ± standard error across seeds. Episodes alternate accident-prone and safe
configurations (accident-prone first).

    python experiments/coop_baselines.py --json OUT.json

Writes the JSON (its ``meta`` holds the command line), a plot next to it (<OUT>.png) and one
rendering per TalkingVehicles scenario (coop_<scenario>.png beside it, rule-based, accident-prone).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
from tqdm import tqdm

from jax_drive.runinfo import (InputError, add_output_args, command_line, finite_float, require_min, run_main,
                               run_metadata, script_environment, write_json)

script_environment(cpu=False)


def run_group(names, policy, seeds, episodes, background, keep_trajectory=False, max_time=None, show_progress=True):
    """All scenarios x seeds x episodes of one policy in a single batch; returns
    {scenario: {seed: [EpisodeResult]}}."""
    import jax

    from jax_drive.coop.evaluate import episode_flags
    from jax_drive.coop.runner import run_episodes

    flags = episode_flags("alternate", episodes)
    batch_names, keys, batch_flags, tags = [], [], [], []
    for name in names:
        for seed in seeds:
            for k in range(episodes):
                batch_names.append(name)
                keys.append(jax.random.fold_in(jax.random.key(seed), k))
                batch_flags.append(flags[k])
                tags.append((name, seed))
    bar = tqdm(desc=f"{policy.name}{' bg' if background else ''} ({len(keys)} episodes)", unit="decision",
               leave=False, disable=not show_progress)
    results, _ = run_episodes(batch_names, keys, accident_prone=batch_flags, policy=policy,
                              background=background, keep_trajectory=keep_trajectory,
                              progress=lambda d: bar.update(1), max_time=max_time)
    bar.close()
    out: dict = {}
    for tag, r in zip(tags, results):
        out.setdefault(tag[0], {}).setdefault(tag[1], []).append(r)
    return out


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # a script: choosing the backend here is fine (the library never does)
    import matplotlib.pyplot as plt

    from jax_drive.sim import scenarios as S

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    tv = report["talking_vehicles"]
    names = list(S.TALKING_VEHICLES)
    x = np.arange(len(names))
    for k, (pol, colour) in enumerate((("silent", "tab:orange"), ("rule_based", "tab:blue"))):
        for j, (metric, hatch) in enumerate((("CR", "//"), ("SR", ""))):
            m = [tv[n][pol]["aggregate"][metric]["mean"] for n in names]
            e = [tv[n][pol]["aggregate"][metric]["se"] for n in names]
            axes[0].bar(x + (2 * k + j - 1.5) * 0.2, m, 0.2, yerr=e, color=colour, hatch=hatch,
                        label=f"{pol} {metric}", alpha=0.85)
    axes[0].set_xticks(x, [n.replace("tv_", "") for n in names], rotation=30, ha="right", fontsize=7)
    axes[0].set_ylabel("%")
    axes[0].set_title("TalkingVehicles: CR (hatched) and SR, mean ± SE over 3 seeds", fontsize=9)
    axes[0].legend(fontsize=7)
    for ax, bg in ((axes[1], "without_background"), (axes[2], "with_background")):
        idr = report["interdrive"][bg]
        if not idr:
            ax.axis("off")
            continue
        names = list(S.INTERDRIVE)
        x = np.arange(len(names))
        for k, (pol, colour) in enumerate((("silent", "tab:orange"), ("rule_based", "tab:blue"))):
            m = [idr[n][pol]["aggregate"]["DS"]["mean"] for n in names]
            e = [idr[n][pol]["aggregate"]["DS"]["se"] for n in names]
            ax.bar(x + (k - 0.5) * 0.4, m, 0.4, yerr=e, color=colour, label=pol, alpha=0.85)
        ax.set_xticks(x, names, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("DS")
        ax.set_title(f"InterDrive DS ({bg.replace('_', ' ')})", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def read_tv_section(path: str) -> tuple[dict, str | None]:
    """The TalkingVehicles section of an earlier results file and the command that made it."""
    try:
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
        return old["talking_vehicles"], old.get("meta", old).get("command")  # older files: command at the top
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise InputError(f"--reuse-tv {path}: not a coop_baselines results file ({error!r})") from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--tv-episodes", type=int, default=10, help="episodes per seed per TalkingVehicles scenario")
    parser.add_argument("--id-episodes", type=int, default=4, help="episodes per seed per InterDrive type and setting")
    add_output_args(parser, json_required=True)  # the plot and renderings go next to the JSON
    parser.add_argument("--no-render", action="store_true")
    parser.add_argument("--reuse-tv", default=None,
                        help="take the TalkingVehicles section from this earlier JSON instead of re-running it")
    parser.add_argument("--no-id-background", action="store_true", help="skip InterDrive with background traffic")
    parser.add_argument("--id-max-time", type=finite_float, default=None,
                        help="optional cap on InterDrive episode length, s (default: each scenario's own "
                             "time limit; episodes also end when every ego is done or blocked for 30 s)")
    args = parser.parse_args(argv)
    require_min(1, seeds=args.seeds, tv_episodes=args.tv_episodes, id_episodes=args.id_episodes)
    require_min(0, id_max_time=args.id_max_time)
    reused = read_tv_section(args.reuse_tv) if args.reuse_tv else None
    from jax_drive.coop import baselines
    from jax_drive.coop.evaluate import ID_KEYS, TV_KEYS, jsonable, summarise
    from jax_drive.sim import metrics as M, scenarios as S

    seeds = list(range(args.seeds))
    t0 = time.time()
    report = {"meta": run_metadata(benchmark="coop_baselines", command=command_line(__file__, argv)),
              "seeds": seeds, "tv_episodes_per_seed": args.tv_episodes, "id_episodes_per_seed": args.id_episodes,
              "configs": "alternating accident-prone / safe, accident-prone first",
              "id_max_time_s": args.id_max_time,
              "talking_vehicles": {}, "interdrive": {"without_background": {}, "with_background": {}}}
    out_dir = os.path.dirname(os.path.abspath(args.json))
    os.makedirs(out_dir, exist_ok=True)
    policies = [baselines.SilentPolicy(), baselines.RuleBasedPolicy()]
    if reused is not None:
        report["talking_vehicles"], report["tv_command"] = reused
    progress = not args.no_progress
    for policy in policies:
        if args.reuse_tv:
            groups = {}
        else:
            groups = run_group(S.TALKING_VEHICLES, policy, seeds, args.tv_episodes, False,
                               keep_trajectory=not args.no_render and policy.name == "rule_based",
                               show_progress=progress)
        for name, by_seed in groups.items():
            report["talking_vehicles"].setdefault(name, {})[policy.name] = summarise(by_seed, "talking_vehicles")
            if not args.no_render and policy.name == "rule_based":
                from jax_drive.coop.render import render_episode

                render_episode(by_seed[seeds[0]][0], os.path.join(out_dir, f"coop_{name}.png"))
        for bg, label in ((False, "without_background"), (True, "with_background")):
            if bg and args.no_id_background:
                continue
            groups = run_group(S.INTERDRIVE, policy, seeds, args.id_episodes, bg, max_time=args.id_max_time,
                               show_progress=progress)
            for name, by_seed in groups.items():
                report["interdrive"][label].setdefault(name, {})[policy.name] = summarise(by_seed, "interdrive")
    report["wall_seconds"] = time.time() - t0
    write_json(args.json, jsonable(report))
    plot(report, os.path.splitext(args.json)[0] + ".png")
    # tables
    for fam, keys in (("talking_vehicles", TV_KEYS),):
        rows = [(f"{n} [{p}]", report[fam][n][p]["aggregate"]) for n in S.TALKING_VEHICLES for p in
                ("silent", "rule_based")]
        print(M.format_table(rows, keys))
    for label in ("without_background", "with_background"):
        if not report["interdrive"][label]:
            continue
        rows = [(f"{n} [{p}]", report["interdrive"][label][n][p]["aggregate"]) for n in S.INTERDRIVE for p in
                ("silent", "rule_based")]
        print(label)
        print(M.format_table(rows, ID_KEYS))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
