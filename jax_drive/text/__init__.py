"""The language interface: trajectory codec, format score, prompts, scene captions,
PDM Agent feedback, PDM-understanding QA and chat message helpers."""

from jax_drive.text.codec import (
    ParsedTrajectory,
    format_number,
    format_point,
    format_trajectory,
    parse_trajectories,
    parse_trajectory,
    quantize,
)
from jax_drive.text.format_score import FormatConfig, format_score, format_scores
from jax_drive.text.prompts import PromptConfig, planning_prompt

__all__ = [
    "FormatConfig",
    "ParsedTrajectory",
    "PromptConfig",
    "format_number",
    "format_point",
    "format_score",
    "format_scores",
    "format_trajectory",
    "parse_trajectories",
    "parse_trajectory",
    "planning_prompt",
    "quantize",
]
