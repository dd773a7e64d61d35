"""MTDrive end to end: SFT -> RL curation -> mtGRPO -> held-out multi-turn evaluation.

    python experiments/mtdrive.py --preset cpu-demo --out experiments/results/mtdrive_cpu_demo \
        [--seed S] [--work runs/...] [--sft-from WORK_OF_AN_EARLIER_RUN] [--sft-steps N]
        [--skip-rl] [--evaluate {untrained,sft,rl} ...]

Metrics, TensorBoard events and orbax checkpoints go to ``--work`` (default
``runs/mtdrive_<preset>_s<seed>``), so the results directory only holds what is committed.
``--sft-from`` loads the SFT checkpoint of an earlier run of the same preset and seed
instead of repeating SFT.

The script writes ``results.json`` (PDMS per turn budget, sub-scores, format rate and turns used for
the untrained, SFT and RL policies on held-out scenes of every evaluation seed; training
curves; timings) and three plots:
  * ``pdms_per_turn.png``: PDMS by turn budget per stage,
  * ``training_curve.png``: SFT loss and mtGRPO reward / PDMS per step,
  * ``refinement.png``: the paper's Fig. 4 for a few held-out scenes: the trajectory of
    each turn over the map, violating points marked.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from jax_drive.mtdrive import PRESETS, STAGES, public, results_table, run_mtdrive, with_seed, write_results  # noqa: E402


def plot_pdms_per_turn(results: dict, path: str) -> None:
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, stage in results["stages"].items():
        ys = stage["pdms_by_budget"]
        ax.plot(range(1, len(ys) + 1), ys, marker="o", label=name)
    ax.set_xlabel("turn budget")
    ax.set_ylabel("mean PDMS (held-out)")
    ax.set_title(f"PDMS per turn ({results['preset']})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_training(results: dict, path: str) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    sft = results["sft_history"]
    axes[0].plot([r["step"] for r in sft], [r["loss"] for r in sft])
    axes[0].set_title("SFT loss")
    axes[0].set_xlabel("step")
    rl = results["rl_history"]
    if rl:
        steps = [r["step"] for r in rl]
        axes[1].plot(steps, [r["reward_mean"] for r in rl], label="reward")
        axes[1].plot(steps, [r["pdms_final"] for r in rl], label="final-turn PDMS")
        axes[1].legend()
    axes[1].set_title(f"mtGRPO ({results.get('advantage')})")
    axes[1].set_xlabel("step")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_refinement(results: dict, path: str, stage: str = "rl", max_scenes: int = 4) -> None:
    """Fig. 4 style: per scene, the answer of each turn over the map; violating points marked."""
    import jax

    from jax_drive import geometry
    from jax_drive.pdm import score_proposals
    from jax_drive.text import parse_trajectory

    stage = stage if stage in results["_rollouts"] else list(results["_rollouts"])[-1]
    rollouts = results["_rollouts"][stage][0]
    scenes, refs = results["_held_out"][0]
    usable = rollouts.usable[:, 0].any(-1)  # at least one answer to draw
    multi = rollouts.num_turns[:, 0] > 1
    order = np.concatenate([np.flatnonzero(multi & usable), np.flatnonzero(~multi & usable),
                            np.flatnonzero(~usable)])
    chosen = list(order[:max_scenes])
    fig, axes = plt.subplots(1, len(chosen), figsize=(4.2 * len(chosen), 4.5), squeeze=False)
    for ax, s in zip(axes[0], chosen):
        scene = jax.tree_util.tree_map(lambda x: np.asarray(x)[s], scenes)
        for poly, ok in zip(scene.map.drivable.vertices, scene.map.drivable.valid):
            if ok:
                ax.fill(poly[:, 0], poly[:, 1], color="0.88", zorder=0)
        route = scene.route.points[scene.route.valid]
        ax.plot(route[:, 0], route[:, 1], "--", color="0.6", lw=0.8)
        for i in np.flatnonzero(scene.agents.valid[:, 0]):
            c = np.asarray(geometry.box_corners(scene.agents.x[i, 0], scene.agents.y[i, 0], scene.agents.heading[i, 0],
                                                scene.agents.length[i], scene.agents.width[i]))
            ax.fill(c[:, 0], c[:, 1], color="tab:blue", alpha=0.5)
        ego = np.asarray(geometry.ego_corners(np.zeros(3, np.float32)))
        ax.fill(ego[:, 0], ego[:, 1], color="tab:green", alpha=0.8)
        turns = rollouts.turns[s]
        colors = plt.cm.viridis(np.linspace(0, 0.9, max(len(turns), 1)))
        for j, (turn, color) in enumerate(zip(turns, colors)):
            parsed = parse_trajectory(turn.text)
            if not parsed.ok:
                continue
            poses = np.asarray(parsed.poses, np.float32)
            result = score_proposals(jax.tree_util.tree_map(lambda x: x[None], scene), poses[None, None],
                                     np.asarray(refs[s])[None])
            v = result.violations
            bad = np.asarray(v.dac_point[0, 0] | v.nc_point[0, 0] | v.ttc_point[0, 0])
            ax.plot(poses[:, 0], poses[:, 1], "-o", ms=3, color=color, label=f"turn {j + 1} (PDMS {turn.pdms:.2f})")
            ax.scatter(poses[bad, 0], poses[bad, 1], s=60, facecolors="none", edgecolors="red", zorder=5)
        ax.plot(scene.expert[:, 0], scene.expert[:, 1], ":", color="k", lw=1, label="expert")
        ax.set_aspect("equal")
        ax.set_xlim(-10, 50)
        ax.set_ylim(-20, 20)
        ax.set_title(f"scene {int(scene.scene_id)}")
        ax.legend(fontsize=6, loc="lower left")
    fig.suptitle(f"multi-turn refinement ({stage}); red circles: violating points")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu-demo")
    parser.add_argument("--out", default=None, help="output directory (default experiments/results/mtdrive_<preset>)")
    parser.add_argument("--advantage", choices=["grpo", "mtgrpo_intra", "mtgrpo_cross"], default=None)
    parser.add_argument("--skip-rl", action="store_true")
    parser.add_argument("--seed", type=int, default=None, help="training seed (default: the preset's)")
    parser.add_argument("--sft-from", default=None, help="reuse the SFT checkpoint of an earlier --work directory")
    parser.add_argument("--work", default=None,
                        help="metrics / checkpoints directory (default runs/mtdrive_<preset>_s<seed>)")
    parser.add_argument("--sft-steps", type=int, default=None, help="override the preset's SFT step budget")
    parser.add_argument("--evaluate", nargs="+", choices=list(STAGES), default=list(STAGES),
                        help="stages evaluated on held-out scenes (default: all)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    if args.sft_steps is not None:
        preset = dataclasses.replace(preset, sft=dataclasses.replace(preset.sft, max_steps=args.sft_steps))
    if args.seed is not None:
        preset = with_seed(preset, args.seed)
    out = args.out or os.path.join("experiments", "results", f"mtdrive_{args.preset.replace('-', '_')}")
    os.makedirs(out, exist_ok=True)
    work = args.work or os.path.join("runs", f"mtdrive_{args.preset.replace('-', '_')}_s{preset.seed}")
    results = run_mtdrive(preset, work, advantage=args.advantage, skip_rl=args.skip_rl, sft_from=args.sft_from,
                          evaluate=args.evaluate, progress=not args.no_progress)
    write_results(results, os.path.join(out, "results.json"))
    plot_pdms_per_turn(public(results), os.path.join(out, "pdms_per_turn.png"))
    plot_training(public(results), os.path.join(out, "training_curve.png"))
    plot_refinement(results, os.path.join(out, "refinement.png"))
    print(results_table(results))
    print(f"results: {out}/results.json (checkpoints and metrics: {work}); timings (s): {results['timings_s']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
