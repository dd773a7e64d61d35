"""The MTDrive / ReCogDrive single-turn planning prompt.

The wording follows MTDrive's appendix A.1 (which reuses ReCogDrive's prompt)::

    <image>
    As an autonomous driving system, predict the vehicle's trajectory based on:
    1. Visual perception from front camera view
    2. Historical motion context (last 4 timesteps): - t-3: (x, y, h) - t-2: ... - t-0: (0.0, 0.0, 0.0)
    3. Active navigation command: [GO STRAIGHT]
    Output requirements:
    - Predict 8 future trajectory points
    - Each point format: (x:float, y:float, heading:float)
    - Use [PT, ...] to encapsulate the trajectory
    - Maintain numerical precision to 2 decimal places

History: the ego poses at -1.5, -1.0, -0.5 and 0 s (every 5th of the 16 logged states at
0.1 s) in the t0 rear-axle frame, written with the trajectory codec's number format.

Options (:class:`PromptConfig`): drop the ``<image>`` placeholder for text-only policies,
and replace item 1 by a text scene description (:mod:`jax_drive.text.caption`) for
policies without vision. An optional system message describes the PDM metrics (our own
wording); it never contains the expert trajectory.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from jax_drive.configs import one_of
from jax_drive.render.camera import CameraConfig, render_camera
from jax_drive.text.codec import format_point
from jax_drive.types import COMMAND_TEXT, NUM_HISTORY_STEPS, Command

IMAGE_PLACEHOLDER = "<image>"
PERCEPTIONS = ("camera", "image", "text", "none")
# Indices into EgoState.history_poses (16 states, -1.5 .. 0 s) used by the prompt.
HISTORY_INDICES = (0, 5, 10, 15)

INTRO = "As an autonomous driving system, predict the vehicle's trajectory based on:"
CAMERA_ITEM = "1. Visual perception from front camera view"
TEXT_ITEM = "1. Scene description in the ego frame (x forward, y left, metres, radians):"
NO_PERCEPTION_ITEM = "1. No perception input is available"
OUTPUT_REQUIREMENTS = (
    "Output requirements:\n"
    "- Predict 8 future trajectory points\n"
    "- Each point format: (x:float, y:float, heading:float)\n"
    "- Use [PT, ...] to encapsulate the trajectory\n"
    "- Maintain numerical precision to 2 decimal places"
)

SYSTEM_PROMPT = (
    "You plan the motion of an autonomous car. From the inputs you receive, output the "
    "ego vehicle's trajectory for the next 4 seconds as 8 poses at 0.5 s intervals, in the "
    "ego rear-axle frame at the current time (x forward, y to the left, metres; heading in "
    "radians, counter-clockwise). The plan is tracked by an LQR controller in a non-reactive "
    "simulation and scored with the PDM score: it is zero on an at-fault collision (NC) or "
    "when the car leaves the drivable area (DAC); otherwise it rewards keeping a safe "
    "time-to-collision (TTC), making progress along the route (EP) and driving comfortably "
    "(C): PDMS = NC * DAC * (5 * TTC + 5 * EP + 2 * C) / 12."
)


@dataclasses.dataclass(frozen=True)
class PromptConfig:
    """How the single-turn prompt is written.

    perception: "camera" (item 1 names the front camera; MTDrive default, no image is
      attached), "image" (the same prompt, and its ``<image>`` placeholder holds the scene's
      front camera rendered by :func:`jax_drive.render.render_camera`: a vision-language
      policy sees it), "text" (item 1 holds a caption of the scene, for policies without
      vision) or "none".
    image_placeholder: start the prompt with ``<image>\\n`` (default True, as MTDrive;
      required by "image").
    system_prompt: prepend a system message describing the PDM score (default False).
    camera: the rendered camera of perception "image" (None: ``CameraConfig()``, 448 x 252).
    """

    perception: str = "camera"
    image_placeholder: bool = True
    system_prompt: bool = False
    camera: CameraConfig | None = None

    def __post_init__(self):
        one_of("perception", self.perception, PERCEPTIONS)
        if self.perception == "image" and not self.image_placeholder:
            raise ValueError("perception='image' needs the <image> placeholder (image_placeholder=True)")

    @property
    def uses_images(self) -> bool:
        """True when prompts carry rendered camera images (perception "image")."""
        return self.perception == "image"


TEXT_ONLY = PromptConfig(perception="text", image_placeholder=False)


def prompt_images(scenes, config: PromptConfig) -> list[list[np.ndarray]] | None:
    """Per scene the images its prompt holds, for a batched Scene with one leading dim S:
    S lists of one uint8 (H, W, 3) front-camera image (``config.camera``) when
    ``config.uses_images``, else None (the prompt is text only)."""
    if not config.uses_images:
        return None
    frames = np.asarray(jax.device_get(render_camera(scenes, config.camera or CameraConfig())))
    if frames.ndim != 4:
        raise ValueError(f"scenes must have exactly one batch dim, got images {frames.shape}")
    return [[frame] for frame in frames]


def history_points(history_poses: Any) -> np.ndarray:
    """The 4 prompt poses (4, 3) from the 16 logged history poses (16, 3)."""
    history_poses = np.asarray(history_poses, dtype=np.float64)
    if history_poses.shape != (NUM_HISTORY_STEPS, 3):
        raise ValueError(f"history_poses must be ({NUM_HISTORY_STEPS}, 3), got {history_poses.shape}")
    return history_poses[list(HISTORY_INDICES)]


def command_text(command: Any) -> str:
    """``GO STRAIGHT`` etc. for a :class:`Command` value; unknown values -> ``UNKNOWN``."""
    try:
        return COMMAND_TEXT[Command(int(command))]
    except ValueError:
        return COMMAND_TEXT[Command.UNKNOWN]


def history_text(history_poses: Any) -> str:
    """`` - t-3: (..) - t-2: (..) - t-1: (..) - t-0: (..)`` from (16, 3) history poses."""
    points = history_points(history_poses)
    n = len(points)
    return "".join(f" - t-{n - 1 - i}: {format_point(p)}" for i, p in enumerate(points))


def planning_prompt(
    history_poses: Any,
    command: Any,
    config: PromptConfig = PromptConfig(),
    scene_description: str | None = None,
) -> str:
    """The single-turn user prompt.

    Args:
      history_poses: (16, 3) ego history at -1.5 .. 0 s.
      command: a :class:`Command` value.
      config: prompt options.
      scene_description: caption text, required when ``config.perception == "text"``.
    """
    if config.perception in ("camera", "image"):
        item1 = CAMERA_ITEM
    elif config.perception == "text":
        if scene_description is None:
            raise ValueError("perception='text' needs a scene_description")
        item1 = TEXT_ITEM + "\n" + scene_description.rstrip("\n")
    else:
        item1 = NO_PERCEPTION_ITEM
    body = (
        f"{INTRO}\n{item1}\n"
        f"2. Historical motion context (last 4 timesteps):{history_text(history_poses)}\n"
        f"3. Active navigation command: [{command_text(command)}]\n"
        f"{OUTPUT_REQUIREMENTS}"
    )
    if config.image_placeholder:
        return f"{IMAGE_PLACEHOLDER}\n{body}"
    return body
