"""Multi-turn rollouts of a language-model driving policy against the PDM Agent."""

from jax_drive.rollout.multiturn import (
    FORMAT_FEEDBACK,
    ChatContinuation,
    RolloutConfig,
    RolloutResult,
    TurnRecord,
    compute_reference,
    run_rollouts,
    scene_prompts,
    summarize,
)

__all__ = [
    "FORMAT_FEEDBACK",
    "ChatContinuation",
    "RolloutConfig",
    "RolloutResult",
    "TurnRecord",
    "compute_reference",
    "run_rollouts",
    "scene_prompts",
    "summarize",
]
