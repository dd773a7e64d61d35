"""MTDrive: scenes -> SFT -> RL curation -> mtGRPO -> multi-turn evaluation, as data.

Modules:
  :mod:`~jax_drive.pipelines.mtdrive.presets`     presets (``PRESETS``) and the configs derived from them
  :mod:`~jax_drive.pipelines.mtdrive.pipeline`    the stages (``STAGES``) and ``run_mtdrive``
  :mod:`~jax_drive.pipelines.mtdrive.runs`        a run directory: checkpoints, SFT lineage, identity
  :mod:`~jax_drive.pipelines.mtdrive.reevaluate`  a finished run's policies on a larger held-out set
  :mod:`~jax_drive.pipelines.mtdrive.report`      results JSON, printed lines and table, goals
  :mod:`~jax_drive.pipelines.mtdrive.plots`       PDMS per turn, training curves, Fig. 4 refinement
"""

from jax_drive.pipelines.mtdrive.pipeline import (
    EVAL_SEED_OFFSET,
    POLICIES,
    STAGES,
    build_sft_data,
    evaluate_policy,
    load_engine,
    load_policy,
    make_held_out,
    make_scenes,
    public_stages,
    run_mtdrive,
)
from jax_drive.pipelines.mtdrive.reevaluate import reevaluate
from jax_drive.pipelines.mtdrive.runs import (
    final_sft_dir,
    load_sft,
    onpolicy_checkpoint_dir,
    rl_checkpoint_dir,
    run_identity,
    run_preset,
    sft_checkpoint_dir,
    sft_lineage,
)

__all__ = ["EVAL_SEED_OFFSET", "POLICIES", "STAGES", "build_sft_data", "evaluate_policy", "final_sft_dir", "load_engine", "load_policy",
           "load_sft", "make_held_out", "make_scenes", "onpolicy_checkpoint_dir", "public_stages", "reevaluate",
           "rl_checkpoint_dir", "run_identity", "run_mtdrive", "run_preset", "sft_checkpoint_dir", "sft_lineage"]
