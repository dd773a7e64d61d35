"""CoLMDriver's consensus critic alone: how well its score separates held-out negotiations
that ended in agreement from those that did not (AUC), with the base model and after a
critic-only LoRA fine-tune on balanced targets (the AUC against SFT steps in ``<json stem>.png``).

    nice -n 5 python experiments/interdrive_critic.py --preset cpu-demo \
        --json experiments/results/interdrive/interdrive_critic.json
    python experiments/interdrive_critic.py --preset smoke --train-seeds 100 --sft-steps 2 --probe-at 1 \
        --probe-size 4 --json /tmp/c.json  # check

The protocol (teacher seeds of the targets and of the held-out negotiations, target and
probe counts, SFT steps) is fixed by the flags' defaults and written into the file; see
:mod:`jax_drive.pipelines.interdrive.critic`. The critic answers under the consensus
grammar over the preset's ``consensus_scores``; its score is read out as the preset's
``consensus_readout`` says (``expected``: under the model's masked distribution over them),
and the number it sampled is scored too (``auc_sampled``). This is not Table 2: no episode
is driven by the critic.
"""

from __future__ import annotations

import argparse
import os
import sys

from jax_drive.cli.overrides import add_override_args, preset_with_overrides
from jax_drive.names import INTERDRIVE_PRESETS
from jax_drive.runinfo import (InputError, add_output_args, command_line, output_dir, run_main, run_metadata,
                               script_environment, write_json)

script_environment()


def parse_seeds(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def plot_curve(result: dict, path: str) -> None:
    """The separation AUC against critic-only SFT steps: held-out negotiations (score read
    out and number sampled) and the critic's own targets; chance at 0.5."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = result["curve"]
    steps = [p["steps"] for p in curve]
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    for key, label, style in (("auc", "held-out, expected score", "o-"), ("auc_sampled", "held-out, sampled number", "s--"),
                              ("auc_targets", "its own targets, expected score", "^:")):
        ax.plot(steps, [p[key] for p in curve], style, label=label)
    ax.axhline(0.5, color="grey", lw=0.8)
    ax.set(xlabel="critic-only LoRA SFT steps", ylabel="separation AUC", ylim=(0.3, 1.02),
           title=f"Consensus critic: agreements vs not ({result['data']['held_out']} held-out negotiations)")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    # the protocol's defaults live in CriticStudy; it is imported only after the arguments
    # (outputs included) are checked, so a bad command line fails before any heavy import
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--preset", default="cpu-demo", choices=INTERDRIVE_PRESETS)
    add_override_args(parser)
    parser.add_argument("--train-seeds", type=parse_seeds, default=None,
                        help="teacher seeds of the SFT targets (comma-separated; default: CriticStudy's)")
    parser.add_argument("--probe-seeds", type=parse_seeds, default=None,
                        help="teacher seeds of the held-out negotiations (default: CriticStudy's)")
    parser.add_argument("--train-examples", type=int, default=None, help="default: CriticStudy's")
    parser.add_argument("--probe-size", type=int, default=None, help="default: CriticStudy's")
    parser.add_argument("--sft-steps", type=int, default=None, help="default: CriticStudy's")
    parser.add_argument("--probe-at", type=parse_seeds, default=None,
                        help="earlier SFT steps also probed (comma-separated; default: CriticStudy's)")
    parser.add_argument("--balance", default=None, choices=("agreement", "score"),
                        help="how targets are drawn (default: CriticStudy's; see its docstring)")
    parser.add_argument("--work-dir", default=None, type=output_dir,
                        help="the critic's adapter (default: runs/interdrive-critic-<preset>)")
    add_output_args(parser, json_required=True)
    args = parser.parse_args(argv)
    from jax_drive.pipelines.interdrive.critic import CriticStudy

    given = {name: getattr(args, name) for name in ("train_seeds", "probe_seeds", "train_examples", "probe_size",
                                                   "sft_steps", "probe_at", "balance") if getattr(args, name) is not None}
    try:
        study = CriticStudy(**given)
    except ValueError as error:
        raise InputError(str(error)) from None
    from jax_drive.pipelines.interdrive import PRESETS
    from jax_drive.pipelines.interdrive.critic import run_critic_study

    preset = preset_with_overrides(PRESETS[args.preset], args)
    if not preset.constrain_answers:
        raise InputError("the critic study reads the score under the consensus grammar: keep constrain_answers on")
    work_dir = args.work_dir or os.path.join("runs", f"interdrive-critic-{args.preset}")
    result = run_critic_study(preset, study, work_dir, progress=None if args.no_progress else (lambda d: None),
                              log=lambda m: print(m, file=sys.stderr))
    write_json(args.json, {"command": command_line(__file__, argv), "preset": preset.name,
                           "consensus_scores": list(preset.consensus_scores),
                           "consensus_readout": preset.consensus_readout, **result,
                           "meta": run_metadata(benchmark="interdrive_critic", work_dir=work_dir)})
    plot_curve(result, os.path.splitext(args.json)[0] + ".png")
    print(f"AUC base {result['base']['auc']} (sampled {result['base']['auc_sampled']}), tuned {result['tuned']['auc']} "
          f"(sampled {result['tuned']['auc_sampled']}) on {result['data']['held_out']} held-out negotiations")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
