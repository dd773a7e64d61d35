"""MTDrive end to end: SFT -> RL curation -> mtGRPO -> held-out multi-turn evaluation.

The same command as ``jax-drive train`` (same flags, same code: :mod:`jax_drive.cli.train`):

    python experiments/mtdrive.py --preset cpu-demo [--out runs/DIR] [--json OUT.json] [--resume]
        [--seed S] [--advantage MODE] [--skip-rl] [--sft-from RUN_DIR] [--sft-steps N]
        [--sft-max-tokens N] [--sft-recovery N]
        [--sft-onpolicy-scenes N] [--sft-onpolicy-steps N] [--rl-steps N] [--rl-prompts N] [--rl-lr LR]
        [--rl-kl BETA] [--rl-improvement-bonus ALPHA] [--curation-scenes N] [--curation-easy-ratio R]
        [--evaluate {untrained,sft,rl} ...] [--no-progress]

``--out`` holds the run (journal, metrics, checkpoints, results.json, plots; default
``runs/mtdrive_<preset>_s<seed>``); ``--json OUT`` also writes the results (PDMS per turn
budget, sub-scores, format rate and turns used of the untrained, SFT and RL policies on
the held-out scenes of every evaluation seed; training curves; timings) to OUT with the
plots beside it: ``_pdms_per_turn.png``, ``_training_curve.png`` and ``_refinement.png``
(the paper's Fig. 4). ``--resume`` continues a killed run where it stopped.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from jax_drive.cli.train import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(prog="experiments/mtdrive.py"))
