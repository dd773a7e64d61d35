"""Training: GRPO / mtGRPO advantages and loss, optimiser, checkpoints, logging, SFT and the
mtGRPO trainer.

Public API:
  AdvantageConfig, compute_advantages, token_advantages                  (advantages)
  LossConfig, policy_loss, kl_penalty, aggregate                         (loss)
  OptimConfig, make_optimizer, split_model                               (optim)
  Checkpointer, RunState, restore_trainable                              (checkpoint)
  atomic_write_bytes, atomic_write_json, atomic_save_npz                 (atomic)
  MetricsLogger, peak_rss_gb, read_jsonl                                 (logging)
  train_loop, LoopConfig, StepOutcome, TrainResult, NonFiniteError   (loop: the loop both trainers share)
  SFTConfig, sft_train                                                   (sft)
  GRPOConfig, grpo_train, grpo_update, build_train_batch                 (grpo)
The turn reward (MTDrive Eq. 2) and the evaluation helpers live with the rollouts
(:mod:`jax_drive.rollout`). The trainer entry points are imported lazily (they pull in the
sampler, scorer and text layer).
"""

from jax_drive.rl.advantages import AdvantageConfig, compute_advantages, token_advantages
from jax_drive.rl.loss import LossConfig, aggregate, kl_penalty, policy_loss

_LAZY = {
    "OptimConfig": "optim", "make_optimizer": "optim", "split_model": "optim",
    "Checkpointer": "checkpoint", "RunState": "checkpoint", "restore_trainable": "checkpoint",
    "atomic_write_bytes": "atomic", "atomic_write_json": "atomic", "atomic_save_npz": "atomic",
    "MetricsLogger": "logging", "peak_rss_gb": "logging", "read_jsonl": "logging",
    "SFTConfig": "sft", "sft_train": "sft",
    "TrainResult": "loop", "train_loop": "loop", "LoopConfig": "loop", "StepOutcome": "loop", "NonFiniteError": "loop",
    "GRPOConfig": "grpo", "grpo_train": "grpo", "grpo_update": "grpo", "build_train_batch": "grpo",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"jax_drive.rl.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'jax_drive.rl' has no attribute {name!r}")


__all__ = [
    "AdvantageConfig", "compute_advantages", "token_advantages",
    "LossConfig", "aggregate", "kl_penalty", "policy_loss", *_LAZY,
]
