"""Multi-turn rollouts of a language-model driving policy against the PDM Agent.

Public API:
  RolloutConfig, run_rollouts, scene_prompts, compute_reference,
  ChatContinuation, FORMAT_FEEDBACK                                   (multiturn)
  RolloutResult, Transcript, TurnRecord, concat_results,
  select_scenes, summarize, SUB_SCORES                                (result)
  turn_rewards                                                        (reward: MTDrive Eq. 2)
  evaluate_multiturn, evaluate_sets, PolicyPredictor                 (evaluate)
"""

from jax_drive.rollout.evaluate import PolicyPredictor, evaluate_multiturn, evaluate_sets
from jax_drive.rollout.multiturn import (
    FORMAT_FEEDBACK,
    ChatContinuation,
    RolloutConfig,
    compute_reference,
    run_rollouts,
    scene_prompts,
)
from jax_drive.rollout.result import (
    SUB_SCORES,
    RolloutResult,
    Transcript,
    TurnRecord,
    concat_results,
    select_scenes,
    summarize,
)
from jax_drive.rollout.reward import turn_rewards

__all__ = [
    "FORMAT_FEEDBACK",
    "SUB_SCORES",
    "ChatContinuation",
    "RolloutConfig",
    "RolloutResult",
    "Transcript",
    "TurnRecord",
    "compute_reference",
    "concat_results",
    "evaluate_multiturn",
    "evaluate_sets",
    "PolicyPredictor",
    "run_rollouts",
    "scene_prompts",
    "select_scenes",
    "summarize",
    "turn_rewards",
]
