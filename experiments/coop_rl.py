"""Talking vehicles trained by RL: the `jax-drive coop-rl` pipeline as an experiment script.

    python experiments/coop_rl.py --preset tiny-study --out runs/coop_rl_tiny_study \
        --json experiments/results/coop_rl/coop_rl.json

Same flags as ``jax-drive coop-rl`` (see ``--help``).
"""

import sys

from jax_drive.cli.coop_rl import main

if __name__ == "__main__":
    sys.exit(main(prog="experiments/coop_rl.py"))
