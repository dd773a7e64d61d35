"""PDM Agent feedback: the follow-up user message of MTDrive's multi-turn loop.

From the scorer's per-point :class:`jax_drive.pdm.Violations` of one proposal, write the
message in the style of MTDrive's appendix A.1::

    This was your previous trajectory prediction. Analyze this trajectory data and propose
    a revised prediction. Consider the following identified issues:
    1. The TTC metric reveals that certain trajectory points fail to maintain a safe
    distance from surrounding objects. The format for describing these objects is: (x, y,
    z, l, w, h, heading, name). Where ... The specific trajectory points and their
    corresponding objects are as follows:
    Trajectory Point 1: (+21.73, 0.0, 0.0) with Objects: (34.14, -0.85, 1.59, 10.26, 2.95, 4.39, -0.02, vehicle).
    Based on these issues, provide an improved trajectory prediction.

(one line per paragraph above; the real message breaks lines only before each issue,
each trajectory point and the closing sentence.)

Rules:
* issues are numbered 1, 2, ... in the order NC, DAC, TTC, and only violated metrics
  appear; EP and comfort are never mentioned (EP would reveal the expert trajectory);
* within an issue, violating output poses are listed in time order and numbered from 1;
  each is written with the trajectory codec's format (the pose the model wrote);
* for NC and TTC each point carries the object's 3-D box ``(x, y, z, l, w, h, heading,
  name)`` in the ego frame at t0 at the step of the event, numbers written ``{:.2f}``;
  a point whose object index is -1 is listed without ``with Objects``;
* nothing violated -> the empty string (the rollout then stops).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from jax_drive.text.codec import format_point
from jax_drive.types import AGENT_TYPE_NAMES, NUM_OUTPUT_POSES, AgentType

HEADER = (
    "This was your previous trajectory prediction. Analyze this trajectory data and "
    "propose a revised prediction. Consider the following identified issues:\n"
)
FOOTER = "Based on these issues, provide an improved trajectory prediction."
# The user message after an answer that holds no usable trajectory (the rollout's
# format feedback, and the feedback turn of SFT recovery samples).
FORMAT_FEEDBACK = (
    "Your previous answer could not be used: it did not contain a valid trajectory. "
    "Output exactly 8 trajectory points, each formatted as (x:float, y:float, heading:float), "
    "inside [PT, ...], with 2 decimal places, for example: Here is the planning trajectory "
    "[PT, (+2.50, 0.0, 0.0), ...]."
)
BOX_LEGEND = (
    "The format for describing these objects is: (x, y, z, l, w, h, heading, name). Where "
    "x, y, z are the center coordinates of the object in ego-coordinate system, l, w, h are "
    "length, width, height of the bounding box, heading is the object heading, and name is "
    "the object class name. The specific trajectory points and their corresponding objects "
    "are as follows:\n"
)
NC_ISSUE = "The NC metric reveals that certain trajectory points collide with surrounding objects. "
TTC_ISSUE = (
    "The TTC metric reveals that certain trajectory points fail to maintain a safe distance "
    "from surrounding objects. "
)
DAC_ISSUE = (
    "The DAC metric reveals that certain trajectory points fall outside the drivable area. "
    "The specific trajectory points are as follows:\n"
)


@dataclasses.dataclass(frozen=True)
class PointViolations:
    """Numpy view of one proposal's violations (K = 8 output poses).

    Fields: dac_point, nc_point, ttc_point (K,) bool; nc_object, ttc_object (K,) int
    (-1 none); nc_box, ttc_box (K, 7) [x, y, z, length, width, height, heading];
    nc_class, ttc_class (K,) int :class:`AgentType`.
    """

    dac_point: np.ndarray
    nc_point: np.ndarray
    nc_object: np.ndarray
    nc_box: np.ndarray
    nc_class: np.ndarray
    ttc_point: np.ndarray
    ttc_object: np.ndarray
    ttc_box: np.ndarray
    ttc_class: np.ndarray

    @property
    def any(self) -> bool:
        return bool(self.dac_point.any() or self.nc_point.any() or self.ttc_point.any())

    @classmethod
    def empty(cls, k: int = NUM_OUTPUT_POSES) -> "PointViolations":
        no = np.zeros((k,), bool)
        none = -np.ones((k,), np.int32)
        box = np.zeros((k, 7), np.float64)
        return cls(no, no, none, box, none, no, none, box, none)


_FIELDS = [f.name for f in dataclasses.fields(PointViolations)]


def violations_to_numpy(violations: Any) -> dict[str, np.ndarray]:
    """Pulls the violation fields of a (batched) scorer ``Violations`` to host numpy."""
    return {name: np.asarray(jax.device_get(getattr(violations, name))) for name in _FIELDS}


def select(arrays: dict[str, np.ndarray], index: Any) -> PointViolations:
    """The violations of one proposal: ``arrays[name][index]`` must have shape (K, ...)."""
    return PointViolations(**{name: np.asarray(arrays[name][index]) for name in _FIELDS})


def _num(value: float) -> str:
    return f"{round(float(value), 2) + 0.0:.2f}"


def class_name(agent_type: Any) -> str:
    try:
        return AGENT_TYPE_NAMES[AgentType(int(agent_type))]
    except ValueError:
        return "object"


def format_box(box: Any, agent_type: Any) -> str:
    """``(x, y, z, l, w, h, heading, name)`` from a (7,) box and a class id."""
    box = np.asarray(box, dtype=np.float64)
    if box.shape != (7,):
        raise ValueError(f"a box must have shape (7,), got {box.shape}")
    return "(" + ", ".join(_num(v) for v in box) + f", {class_name(agent_type)})"


def _object_lines(poses: np.ndarray, flags, objects, boxes, classes) -> str:
    lines = []
    for k in np.flatnonzero(flags):
        line = f"Trajectory Point {len(lines) + 1}: {format_point(poses[k])}"
        if int(objects[k]) >= 0:
            line += f" with Objects: {format_box(boxes[k], classes[k])}"
        lines.append(line + ".\n")
    return "".join(lines)


def feedback_message(poses: Any, violations: PointViolations) -> str:
    """The PDM Agent's feedback for one proposal, or "" when nothing is violated.

    Args:
      poses: (K, 3) the proposal the model wrote (K = 8).
      violations: its :class:`PointViolations`.
    """
    poses = np.asarray(poses, dtype=np.float64)
    if poses.ndim != 2 or poses.shape[1] != 3 or poses.shape[0] != violations.dac_point.shape[0]:
        raise ValueError(f"poses must be (K, 3) matching the violations, got {poses.shape}")
    v = violations
    issues = []
    if v.nc_point.any():
        issues.append(NC_ISSUE + BOX_LEGEND + _object_lines(poses, v.nc_point, v.nc_object, v.nc_box, v.nc_class))
    if v.dac_point.any():
        lines = "".join(
            f"Trajectory Point {i + 1}: {format_point(poses[k])}.\n"
            for i, k in enumerate(np.flatnonzero(v.dac_point))
        )
        issues.append(DAC_ISSUE + lines)
    if v.ttc_point.any():
        issues.append(
            TTC_ISSUE + BOX_LEGEND + _object_lines(poses, v.ttc_point, v.ttc_object, v.ttc_box, v.ttc_class)
        )
    if not issues:
        return ""
    return HEADER + "".join(f"{i + 1}. {text}" for i, text in enumerate(issues)) + FOOTER


def feedback_messages(poses: Any, violations: Any) -> list[str]:
    """Feedback for N proposals.

    Args:
      poses: (N, K, 3).
      violations: scorer ``Violations`` with fields shaped (N, K, ...) (or the dict of
        :func:`violations_to_numpy`).
    Returns: N strings ("" where nothing is violated).
    """
    arrays = violations if isinstance(violations, dict) else violations_to_numpy(violations)
    poses = np.asarray(poses, dtype=np.float64)
    return [feedback_message(poses[i], select(arrays, i)) for i in range(poses.shape[0])]
