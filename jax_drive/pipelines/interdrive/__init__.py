"""CoLMDriver on InterDrive: the Table 2 arms, the small-model negotiator, Fig. 5, a dialogue render.

Modules:
  :mod:`~jax_drive.pipelines.interdrive.presets`      presets (``PRESETS``) and the model / engine specs
  :mod:`~jax_drive.pipelines.interdrive.arms`         Table 2 as data, evaluating one policy
  :mod:`~jax_drive.pipelines.interdrive.negotiator`   teacher SFT data, LoRA fine-tune, probes (actor, critic), negotiator
  :mod:`~jax_drive.pipelines.interdrive.critic`       the critic-only study (held-out separation AUC)
  :mod:`~jax_drive.pipelines.interdrive.convergence`  Fig. 5 and the rendered dialogue
  :mod:`~jax_drive.pipelines.interdrive.pipeline`     the stages (``STAGES``) and ``run_interdrive``
  :mod:`~jax_drive.pipelines.interdrive.report`       Table 2, goals, plots
"""

from jax_drive.names import BASELINES
from jax_drive.names import INTERDRIVE_ARMS as ARMS
from jax_drive.pipelines.interdrive.arms import (
    ARM_LABELS,
    KEYS,
    LOOP_REVISION,
    arm_config,
    episode_plan,
    evaluate_policy,
    make_policy,
    negotiation_stats,
)
from jax_drive.pipelines.interdrive.convergence import collect_situations, convergence_study, render_dialogue
from jax_drive.pipelines.interdrive.negotiator import (
    decision_agreement,
    decision_probe,
    finetune,
    load_model,
    make_negotiator,
    probe_examples,
    select_examples,
    sft_examples,
)
from jax_drive.pipelines.interdrive.pipeline import STAGE_NAMES, STAGES, run_interdrive
from jax_drive.pipelines.interdrive.presets import PRESETS, Preset

__all__ = ["ARMS", "ARM_LABELS", "BASELINES", "KEYS", "LOOP_REVISION", "PRESETS", "Preset", "STAGES", "STAGE_NAMES",
           "arm_config", "collect_situations", "convergence_study", "decision_agreement", "decision_probe",
           "episode_plan", "evaluate_policy", "finetune", "load_model", "make_negotiator", "make_policy",
           "negotiation_stats", "probe_examples", "render_dialogue", "run_interdrive", "select_examples",
           "sft_examples"]
