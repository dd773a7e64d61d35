"""MTDrive figures: PDMS by turn budget, training curves, and the paper's Fig. 4 (the
answer of each turn over the map, violating points marked).

Figures are drawn on ``matplotlib.figure.Figure`` objects (no pyplot, no global backend).
"""

from __future__ import annotations

import os

import numpy as np


def _figure(width: float, height: float, columns: int = 1):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    return fig, fig.subplots(1, columns, squeeze=False)[0]


def plot_pdms_per_turn(results: dict, path: str | os.PathLike) -> None:
    fig, (ax,) = _figure(5, 3.5)
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


def plot_training(results: dict, path: str | os.PathLike) -> None:
    fig, axes = _figure(9, 3.5, columns=2)
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


def plot_refinement(results: dict, path: str | os.PathLike, stage: str = "rl", max_scenes: int = 4) -> bool:
    """Fig. 4 style, for the first held-out set: per scene, the answer of each turn over the
    map; violating points circled. Scenes refined over several turns come first. Needs the
    private ``_transcripts`` and ``_held_out`` of :func:`jax_drive.pipelines.mtdrive.run_mtdrive`;
    returns False (and draws nothing) when no stage was evaluated."""
    import jax
    from matplotlib import colormaps

    from jax_drive.pdm import score_proposals
    from jax_drive.render.axes import draw_proposal, draw_scene
    from jax_drive.scenes import index_scene
    from jax_drive.text import parse_trajectory

    transcripts = results["_transcripts"]
    if not transcripts:
        return False
    stage = stage if stage in transcripts else list(transcripts)[-1]
    logs = transcripts[stage]
    scenes, refs = results["_held_out"][0]
    usable = np.array([any(t["usable"] for t in turns) for turns in logs], bool)  # at least one answer to draw
    multi = np.array([len(turns) > 1 for turns in logs], bool)
    order = np.concatenate([np.flatnonzero(multi & usable), np.flatnonzero(~multi & usable),
                            np.flatnonzero(~usable)])
    chosen = list(order[:max_scenes])
    fig, axes = _figure(4.2 * len(chosen), 4.5, columns=len(chosen))
    for ax, s in zip(axes, chosen):
        scene = jax.tree.map(np.asarray, index_scene(scenes, int(s)))
        draw_scene(ax, scene)
        turns = logs[s]
        colors = [colormaps["viridis"](x) for x in np.linspace(0, 0.9, max(len(turns), 1))]
        for j, (turn, color) in enumerate(zip(turns, colors)):
            parsed = parse_trajectory(turn["text"])
            if not parsed.ok:
                continue
            poses = np.asarray(parsed.poses, np.float32)
            scored = score_proposals(jax.tree.map(lambda x: x[None], scene), poses[None, None],
                                     np.asarray(refs[s])[None])
            draw_proposal(ax, poses, scored.violations, index=(0, 0), color=color,
                          label=f"turn {j + 1} (PDMS {turn['pdms']:.2f})")
        ax.plot(scene.expert[:, 0], scene.expert[:, 1], ":", color="k", lw=1, label="expert")
        ax.set_aspect("equal")
        ax.set_xlim(-10, 50)
        ax.set_ylim(-20, 20)
        ax.set_title(f"scene {int(scene.scene_id)}")
        ax.legend(fontsize=6, loc="lower left")
    fig.suptitle(f"multi-turn refinement ({stage}); red circles: violating points")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def write_plots(results: dict, prefix: str | os.PathLike) -> list[str]:
    """Writes ``<prefix>pdms_per_turn.png``, ``<prefix>training_curve.png`` and
    ``<prefix>refinement.png``; returns the paths written."""
    prefix = os.fspath(prefix)
    written = []
    if results["stages"]:
        plot_pdms_per_turn(results, prefix + "pdms_per_turn.png")
        written.append(prefix + "pdms_per_turn.png")
    plot_training(results, prefix + "training_curve.png")
    written.append(prefix + "training_curve.png")
    if plot_refinement(results, prefix + "refinement.png"):
        written.append(prefix + "refinement.png")
    return written
