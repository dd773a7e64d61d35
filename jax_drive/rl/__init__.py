"""Training: GRPO / mtGRPO advantages and loss, optimiser, checkpoints, logging, SFT and the
mtGRPO trainer.

Public API:
  AdvantageConfig, compute_advantages, turn_rewards, token_advantages   (advantages)
  LossConfig, policy_loss, kl_penalty, aggregate                         (loss)
  OptimConfig, make_optimizer, split_model                               (optim)
  Checkpointer, RunState                                                 (checkpoint)
  MetricsLogger, peak_rss_gb                                             (logging)
  SFTConfig, sft_train                                                   (sft)
  GRPOConfig, grpo_train, grpo_update, build_train_batch, evaluate_multiturn   (grpo)
The trainer entry points are imported lazily (they pull in the sampler, scorer and text layer).
"""

from jax_drive.rl.advantages import AdvantageConfig, compute_advantages, token_advantages, turn_rewards
from jax_drive.rl.loss import LossConfig, aggregate, kl_penalty, policy_loss

_LAZY = {
    "OptimConfig": "optim", "make_optimizer": "optim", "split_model": "optim",
    "Checkpointer": "checkpoint", "RunState": "checkpoint",
    "MetricsLogger": "logging", "peak_rss_gb": "logging",
    "SFTConfig": "sft", "sft_train": "sft", "TrainResult": "sft",
    "GRPOConfig": "grpo", "grpo_train": "grpo", "grpo_update": "grpo", "build_train_batch": "grpo",
    "evaluate_multiturn": "grpo",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"jax_drive.rl.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'jax_drive.rl' has no attribute {name!r}")


__all__ = [
    "AdvantageConfig", "compute_advantages", "token_advantages", "turn_rewards",
    "LossConfig", "aggregate", "kl_penalty", "policy_loss", *_LAZY,
]
