"""PDM Agent feedback text: hand-written expected messages, pure and through the scorer."""

import jax
import numpy as np
import pytest

from pdm_scenes import notch_spec

from jax_drive.scenes import straight_road
from jax_drive.text import feedback as F
from jax_drive.types import AgentType

LEGEND = (
    "The format for describing these objects is: (x, y, z, l, w, h, heading, name). Where x, y, z "
    "are the center coordinates of the object in ego-coordinate system, l, w, h are length, width, "
    "height of the bounding box, heading is the object heading, and name is the object class name. "
    "The specific trajectory points and their corresponding objects are as follows:\n"
)
HEADER = (
    "This was your previous trajectory prediction. Analyze this trajectory data and propose a "
    "revised prediction. Consider the following identified issues:\n"
)
FOOTER = "Based on these issues, provide an improved trajectory prediction."

# MTDrive appendix A.1, verbatim (with its single TTC issue).
SEED_FEEDBACK = (
    HEADER + "1. The TTC metric reveals that certain trajectory points fail to maintain a safe distance "
    "from surrounding objects. " + LEGEND
    + "Trajectory Point 1: (+21.73, 0.0, 0.0) with Objects: (34.14, -0.85, 1.59, 10.26, 2.95, 4.39, -0.02, vehicle).\n"
    + FOOTER
)


def test_seed_ttc_example_reproduced():
    poses = np.stack([np.arange(1, 9) * 3.104, np.zeros(8), np.zeros(8)], -1)
    poses[6, 0] = 21.73
    v = F.PointViolations.empty()
    ttc_point = np.zeros(8, bool)
    ttc_point[6] = True
    box = np.zeros((8, 7))
    box[6] = [34.14, -0.85, 1.59, 10.26, 2.95, 4.39, -0.02]
    obj = -np.ones(8, np.int32)
    obj[6] = 4
    cls = -np.ones(8, np.int32)
    cls[6] = int(AgentType.VEHICLE)
    v = F.PointViolations(**{**v.__dict__, "ttc_point": ttc_point, "ttc_box": box, "ttc_object": obj, "ttc_class": cls})
    assert F.feedback_message(poses, v) == SEED_FEEDBACK


def test_empty_feedback_when_nothing_violated():
    assert F.feedback_message(np.zeros((8, 3)), F.PointViolations.empty()) == ""
    assert not F.PointViolations.empty().any


def test_all_kinds_numbering_and_missing_object():
    poses = np.stack([np.arange(1, 9) * 2.0, np.zeros(8), np.zeros(8)], -1)
    e = F.PointViolations.empty()
    dac = np.zeros(8, bool)
    dac[[5, 7]] = True
    nc = np.zeros(8, bool)
    nc[2] = True
    nc_obj = -np.ones(8, np.int32)  # a flagged point without an object index
    v = F.PointViolations(**{**e.__dict__, "dac_point": dac, "nc_point": nc, "nc_object": nc_obj})
    expected = (
        HEADER
        + "1. The NC metric reveals that certain trajectory points collide with surrounding objects. "
        + LEGEND + "Trajectory Point 1: (+6.00, 0.0, 0.0).\n"
        + "2. The DAC metric reveals that certain trajectory points fall outside the drivable area. "
        "The specific trajectory points are as follows:\n"
        "Trajectory Point 1: (+12.00, 0.0, 0.0).\nTrajectory Point 2: (+16.00, 0.0, 0.0).\n" + FOOTER
    )
    assert F.feedback_message(poses, v) == expected
    assert "EP" not in expected and "progress" not in expected.lower()
    with pytest.raises(ValueError):
        F.feedback_message(np.zeros((7, 3)), v)


def test_box_format_and_unknown_class():
    assert F.format_box([1.234, -0.001, 0, 4.5, 2, 1.6, -3.14159], 1) == (
        "(1.23, 0.00, 0.00, 4.50, 2.00, 1.60, -3.14, pedestrian)"
    )
    assert F.format_box(np.zeros(7), -1).endswith("object)")


def _hand_scene():
    """One scene with one NC, one DAC and one TTC violation for the proposal below.

    Single lane y in [-1.75, 1.75]; the drivable area has a notch x in [10.6, 11.0],
    y > 1.0. The proposal drives 4 m/s for 2 s to x = 8 m and stops there.
    * NC: a cone beside the rear axle at t0 (stopped track, at fault, class cone -> 0.5),
      overlapping during steps 0..3 -> pose 0; TTC ignores it (it is beside, not ahead).
    * DAC: the front-left corner (y = 1.15) is in the notch only at step 17 -> pose 3.
    * TTC: a parked car ahead (rear edge at x = 14.65); the ego box projected 0.9 s ahead
      at 4 m/s reaches it at steps 18..19(..20) -> pose 3; the real ego stops with its
      front at 12.05 m, so no collision.
    """
    return notch_spec().build()


HAND_PROPOSAL = np.array([[2, 0, 0], [4, 0, 0], [6, 0, 0], [8, 0, 0], [8, 0, 0], [8, 0, 0], [8, 0, 0], [8, 0, 0]], float)

HAND_EXPECTED = (
    HEADER
    + "1. The NC metric reveals that certain trajectory points collide with surrounding objects. " + LEGEND
    + "Trajectory Point 1: (+2.00, 0.0, 0.0) with Objects: (0.00, 1.30, 0.00, 0.50, 0.50, 0.80, 0.00, traffic_cone).\n"
    + "2. The DAC metric reveals that certain trajectory points fall outside the drivable area. "
    "The specific trajectory points are as follows:\nTrajectory Point 1: (+8.00, 0.0, 0.0).\n"
    + "3. The TTC metric reveals that certain trajectory points fail to maintain a safe distance from "
    "surrounding objects. " + LEGEND
    + "Trajectory Point 1: (+8.00, 0.0, 0.0) with Objects: (16.90, 0.30, 0.00, 4.50, 2.00, 1.60, 0.00, vehicle).\n"
    + FOOTER
)


def test_hand_built_scene_through_the_scorer():
    from jax_drive.pdm import PDMConfig, score_proposals

    scene = _hand_scene()
    reference = np.stack([np.arange(1, 41) * 0.4, np.zeros(40), np.zeros(40)], -1)
    config = PDMConfig(simulate=False)
    result = jax.device_get(score_proposals(scene, HAND_PROPOSAL[None], reference, config))
    assert float(result.nc[0]) == 0.5 and float(result.dac[0]) == 0.0 and float(result.ttc[0]) == 0.0
    messages = F.feedback_messages(HAND_PROPOSAL[None], result.violations)
    assert messages == [HAND_EXPECTED]
    # The same proposal without the obstacles and on the plain road: empty feedback.
    clean = straight_road(num_lanes=1, ego_lane=0, ego_speed=4.0).build()
    result = jax.device_get(score_proposals(clean, HAND_PROPOSAL[None], reference, config))
    assert F.feedback_messages(HAND_PROPOSAL[None], result.violations) == [""]
