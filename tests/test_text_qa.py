"""PDM-understanding QA: balance, labels against shapely and against the scorer, text."""

import re

import jax
import numpy as np
import pytest
from shapely.geometry import Point, Polygon
from shapely.ops import unary_union

from pdm_scenes import notch_spec

from jax_drive.scenes import LaneSpec, add_agent, add_static, stack_scenes, straight_road
from jax_drive.text import qa
from jax_drive.text.codec import parse_trajectory
from jax_drive.text.prompts import PromptConfig
from jax_drive.types import AgentType, VehicleParameters

PER_CLASS = 6
CONFIG = qa.QAConfig(per_class=PER_CLASS, num_candidates=96)
EGO = VehicleParameters()


def _busy_spec():
    spec = straight_road(num_lanes=3, ego_lane=1, ego_speed=10.0)
    add_agent(spec, 20.0, 0.2, speed=6.0)
    add_agent(spec, 35.0, 3.6, speed=0.0)
    add_agent(spec, 30.0, -6.0, heading=np.pi / 2 + 0.05, speed=1.4, length=0.6, width=0.6,
              agent_type=int(AgentType.PEDESTRIAN))
    add_static(spec, 15.0, -5.0, agent_type=int(AgentType.BARRIER))
    return spec


@pytest.fixture(scope="module")
def scenes():
    empty = straight_road(num_lanes=2, ego_lane=0, ego_speed=5.0)
    connector = np.array([[30.0, -1.75], [40.0, -1.75], [40.0, 1.75], [30.0, 1.75]])
    empty.lanes.append(LaneSpec(connector, np.array([[30.0, 0.0], [40.0, 0.0]]), kind=1, on_route=True, red_light=True))
    return stack_scenes([_busy_spec().build(0), notch_spec().build(1), empty.build(2)])


@pytest.fixture(scope="module")
def candidates(scenes):
    return jax.device_get(qa.qa_candidates(jax.random.PRNGKey(0), scenes, CONFIG))


def _host_scene(scenes, i):
    return jax.tree.map(lambda a: np.asarray(a)[i], jax.device_get(scenes))


def _ego_polygon(pose):
    x, y, h = (float(v) for v in pose)
    c = np.array([x, y]) + EGO.rear_axle_to_center * np.array([np.cos(h), np.sin(h)])
    return _box_polygon(c[0], c[1], h, EGO.length, EGO.width)


def _box_polygon(x, y, h, length, width):
    f, l_ = np.array([np.cos(h), np.sin(h)]), np.array([-np.sin(h), np.cos(h)])
    c = np.array([x, y])
    pts = [c + s1 * length / 2 * f + s2 * width / 2 * l_ for s1, s2 in ((1, 1), (-1, 1), (-1, -1), (1, -1))]
    return Polygon(pts)


def _ego_corners(pose):
    return list(_ego_polygon(pose).exterior.coords)[:4]


def test_balanced_and_shaped(candidates):
    b = 3
    q = 2 * PER_CLASS
    for m in qa.METRICS:
        assert candidates[f"{m}_pose"].shape == (b, q, 3)
        keep, label = candidates[f"{m}_keep"], candidates[f"{m}_label"]
        # Yes items first, then No items; kept ones carry that label.
        assert np.all(label[:, :PER_CLASS][keep[:, :PER_CLASS]])
        assert not np.any(label[:, PER_CLASS:][keep[:, PER_CLASS:]])
        # Every (scene, metric) is balanced.
        np.testing.assert_array_equal(keep[:, :PER_CLASS].sum(-1), keep[:, PER_CLASS:].sum(-1))
    # Scene 0 (busy road) yields full, balanced sets for every metric.
    for m in qa.METRICS:
        assert candidates[f"{m}_keep"][0].all(), m
    # Scene 2 has no objects: no NC / TTC questions, DAC still balanced.
    assert not candidates["nc_keep"][2].any() and not candidates["ttc_keep"][2].any()
    assert candidates["dac_keep"][2].all()


def test_dac_labels_match_shapely(scenes, candidates):
    for i in range(3):
        s = _host_scene(scenes, i)
        polys = [Polygon(v) for v, ok in zip(s.map.drivable.vertices, s.map.drivable.valid) if ok]
        area = unary_union(polys)
        for pose, label, keep in zip(candidates["dac_pose"][i], candidates["dac_label"][i], candidates["dac_keep"][i]):
            if keep:
                expected = all(area.covers(Point(c)) for c in _ego_corners(pose))
                assert bool(label) == expected, (i, pose)


def test_nc_labels_match_shapely(scenes, candidates):
    checked = 0
    for i in range(3):
        s = _host_scene(scenes, i)
        for j in np.flatnonzero(candidates["nc_keep"][i]):
            pose, box = candidates["nc_pose"][i, j], candidates["nc_box"][i, j]
            a, t = candidates["nc_object"][i, j], candidates["nc_step"][i, j]
            # The box in the question is the object's logged box at that step.
            np.testing.assert_allclose(box[[0, 1, 6]], [s.agents.x[a, t], s.agents.y[a, t], s.agents.heading[a, t]], atol=0.006)
            other = _box_polygon(box[0], box[1], box[6], box[3], box[4])
            assert bool(candidates["nc_label"][i, j]) == _ego_polygon(pose).intersects(other)
            checked += 1
    assert checked >= 2 * PER_CLASS


def test_ttc_labels_match_shapely(scenes, candidates):
    checked = 0
    for i in range(3):
        s = _host_scene(scenes, i)
        for j in np.flatnonzero(candidates["ttc_keep"][i]):
            pose, speed = candidates["ttc_pose"][i, j], float(candidates["ttc_speed"][i, j])
            a, t = candidates["ttc_object"][i, j], int(candidates["ttc_step"][i, j])
            h = float(pose[2])
            direction = np.array([np.cos(h), np.sin(h)])
            hit = False
            for d in CONFIG.ttc_frames:
                if t + d > 50 or not s.agents.valid[a, t + d]:
                    continue
                moved = np.concatenate([pose[:2] + speed * d * 0.1 * direction, [h]])
                box = np.round([s.agents.x[a, t + d], s.agents.y[a, t + d], s.agents.heading[a, t + d]], 2)
                other = _box_polygon(box[0], box[1], box[2], round(float(s.agents.length[a]), 2), round(float(s.agents.width[a]), 2))
                hit |= _ego_polygon(moved).intersects(other)
            centre = pose[:2] + EGO.rear_axle_to_center * direction
            rel = np.round([s.agents.x[a, t], s.agents.y[a, t]], 2) - centre
            angle = np.degrees(np.arccos(np.clip(rel @ direction / np.linalg.norm(rel), -1, 1)))
            unsafe = hit and angle < CONFIG.ahead_angle_deg
            assert bool(candidates["ttc_label"][i, j]) == (not unsafe), (i, j)
            checked += 1
    assert checked >= 2 * PER_CLASS


SEED_DAC_QUESTION = (
    "<image>\nYou are a vehicle trajectory prediction model for an autonomous driving system. One of your "
    "key metrics is Drivable Area Compliance (DAC), which assesses whether trajectory points remain within "
    "the drivable area. Given a trajectory prediction point and a front-view image, where trajectory point "
    "is formatted as (x: float, y: float, heading: float), your task is to identify if the given trajectory "
    "point stays within the drivable area.\nTrajectory point is (+24.87, 0.0, 0.0).\nOutput Requirements:\n"
    "Format: Yes or No\nMaintain numerical precision to two decimal places."
)


def test_dac_question_matches_seed():
    assert qa.dac_question([24.87, 0.0, 0.001]) == SEED_DAC_QUESTION
    text_only = qa.dac_question([1, 2, 0], PromptConfig(perception="text", image_placeholder=False), "- Ego: x")
    assert not text_only.startswith("<image>") and "a scene description" in text_only and "- Ego: x" in text_only
    with pytest.raises(ValueError):
        qa.dac_question([1, 2, 0], PromptConfig(perception="text"))


def test_items_text_agrees_with_labels(candidates):
    items = qa.qa_items(candidates, 0)
    assert len(items) == 3 * 2 * PER_CLASS
    for item in items:
        assert item["answer"] == ("Yes." if item["label"] else "No.")
        match = re.search(r"Trajectory point is (\([^)]*\))", item["question"])
        parsed = parse_trajectory("[PT, " + ", ".join([match.group(1)] * 8) + "]")
        assert parsed.ok
    # The written point is exactly the labelled pose.
    dac = [it for it in items if it["metric"] == "dac"]
    point = re.search(r"Trajectory point is (\([^)]*\))", dac[0]["question"]).group(1)
    parsed = parse_trajectory("[PT, " + ", ".join([point] * 8) + "]").poses[0]
    np.testing.assert_allclose(parsed, candidates["dac_pose"][0, 0], atol=1e-5)
    for metric in ("nc", "ttc"):
        assert any(metric.upper() in it["question"] for it in items if it["metric"] == metric)


def test_dac_geometry_equals_scorer_mask():
    """QA's in_drivable on the interpolated states reproduces the scorer's dac_point."""
    from jax_drive.pdm import PDMConfig, interpolate_poses, score_proposals

    scene = notch_spec().build()
    config = PDMConfig(simulate=False)
    reference = np.stack([np.arange(1, 41) * 0.4, np.zeros(40), np.zeros(40)], -1)
    rng = np.random.default_rng(0)
    in_drivable = jax.jit(qa.in_drivable)
    interpolate = jax.jit(interpolate_poses, static_argnums=2)
    flagged_any = 0
    for _ in range(8):
        x = np.cumsum(rng.uniform(0.5, 3.0, 8))
        y = np.cumsum(rng.normal(0.0, 0.35, 8))
        h = np.arctan2(np.diff(np.concatenate([[0.0], y])), np.diff(np.concatenate([[0.0], x])))
        proposal = np.stack([x, y, h], -1)[None]
        result = jax.device_get(score_proposals(scene, proposal, reference, config))
        states = np.asarray(interpolate(scene, proposal, 0.5))[0]  # (41, 3)
        inside = np.asarray(in_drivable(states, scene.map.drivable.vertices[None], scene.map.drivable.valid[None]))
        pose_inside = np.asarray(
            in_drivable(proposal[0], scene.map.drivable.vertices[None], scene.map.drivable.valid[None])
        )  # the QA label of each output pose
        np.testing.assert_allclose(states[5::5], proposal[0], atol=1e-4)
        for k in range(8):
            window = list(range(5 * k + 1, 5 * k + 6)) + ([0] if k == 0 else [])
            assert bool(result.violations.dac_point[0, k]) == bool(np.any(~inside[window])), k
            # The QA label of pose k itself implies the scorer's flag.
            if not pose_inside[k]:
                assert bool(result.violations.dac_point[0, k])
        flagged_any += int(result.violations.dac_point.any())
    assert flagged_any >= 2


def test_captions_describe_objects_and_road(scenes):
    from jax_drive.text.caption import CaptionConfig, caption_scenes, map_facts

    captions = caption_scenes(scenes)
    busy, notch, empty = captions
    # Objects nearest first, written as (x, y, z, l, w, h, heading, name) boxes with speeds.
    lines = [line for line in busy.splitlines() if line.startswith("  (")]
    assert [line.split(", ")[7].split(")")[0] for line in lines] == ["barrier", "vehicle", "pedestrian", "vehicle"]
    assert lines[1].startswith("  (20.00, 0.20,") and lines[1].endswith("at 6.00 m/s")
    assert "No objects within 50 m." in empty and "speed 5.00 m/s" in empty
    facts = jax.device_get(map_facts(scenes, CaptionConfig()))
    # Busy road: 3 lanes of 3.5 m, the ego in the middle one -> 5.25 m each side (lower bound).
    assert np.all((facts["left_extent"][0] >= 5.0) & (facts["left_extent"][0] <= 5.25))
    assert np.all((facts["right_extent"][0] >= 5.0) & (facts["right_extent"][0] <= 5.25))
    # Two-lane road, ego in the right lane: 1.75 m right, 5.25 m left.
    assert np.all((facts["right_extent"][2] >= 1.5) & (facts["right_extent"][2] <= 1.75))
    assert np.all((facts["left_extent"][2] >= 5.0) & (facts["left_extent"][2] <= 5.25))
    assert facts["station_valid"].all() and facts["station_on_road"].all()
    assert "No red traffic light" in busy
    assert "Red traffic light on the route 30.00 m ahead." in empty
    np.testing.assert_allclose(facts["station_pose"][0, :, 0], [0, 10, 20, 30, 40], atol=1e-3)
