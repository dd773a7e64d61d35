"""The language interface: trajectory codec, format score, prompts, scene captions,
PDM Agent feedback, PDM-understanding QA and chat message helpers.

Modules: :mod:`~jax_drive.text.codec` (answer <-> poses), :mod:`~jax_drive.text.format_score`,
:mod:`~jax_drive.text.prompts`, :mod:`~jax_drive.text.caption` (text scene descriptions),
:mod:`~jax_drive.text.feedback` (PDM Agent feedback), :mod:`~jax_drive.text.qa`
(appendix A.2 questions), :mod:`~jax_drive.text.chat` (message lists).
"""

from jax_drive.text.chat import add_turn, conversation, split_prompt_target
from jax_drive.text.codec import (
    ParsedTrajectory,
    format_number,
    format_point,
    format_trajectory,
    parse_trajectories,
    parse_trajectory,
    quantize,
)
from jax_drive.text.feedback import PointViolations, feedback_message, feedback_messages
from jax_drive.text.format_score import FormatConfig, format_score, format_scores
from jax_drive.text.prompts import SYSTEM_PROMPT, TEXT_ONLY, PromptConfig, planning_prompt

__all__ = [
    "FormatConfig",
    "ParsedTrajectory",
    "PointViolations",
    "PromptConfig",
    "SYSTEM_PROMPT",
    "TEXT_ONLY",
    "add_turn",
    "conversation",
    "feedback_message",
    "feedback_messages",
    "format_number",
    "format_point",
    "format_score",
    "format_scores",
    "format_trajectory",
    "parse_trajectories",
    "parse_trajectory",
    "planning_prompt",
    "quantize",
    "split_prompt_target",
]
