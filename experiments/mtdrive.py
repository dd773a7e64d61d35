"""MTDrive end to end: SFT -> RL curation -> mtGRPO -> held-out multi-turn evaluation.

The same command as ``jax-drive train`` (same flags, same code: :mod:`jax_drive.cli.train`):

    python experiments/mtdrive.py --preset cpu-demo [--out runs/DIR] [--json OUT.json] [--resume]
        [--seed S] [--set PATH=VALUE ...] [--preset-file F.json] [--advantage MODE] [--skip-rl]
        [--sft-from RUN_DIR] [--evaluate {untrained,sft,rl} ...] [--no-progress]

``--out`` holds the run (journal, metrics, checkpoints, results.json, plots; default
``runs/mtdrive_<preset>_s<seed>``); ``--json OUT`` also writes the results (PDMS per turn
budget, sub-scores, format rate and turns used of the untrained, SFT and RL policies on
the held-out scenes of every evaluation seed; training curves; timings) to OUT with the
plots beside it: ``_pdms_per_turn.png``, ``_training_curve.png`` and ``_refinement.png``
(the paper's Fig. 4). ``--resume`` continues a killed run where it stopped. ``--set``
changes any preset field (``--set rl.optim.learning_rate=5e-5``).
"""

from __future__ import annotations

import sys

from jax_drive.cli.train import main
from jax_drive.runinfo import run_main

if __name__ == "__main__":
    sys.exit(run_main(lambda argv: main(argv, prog="experiments/mtdrive.py")))
