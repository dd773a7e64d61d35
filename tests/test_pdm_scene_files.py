"""Scene files (jax_drive.scenes.io): round trips, NAVSIM's layer and observation rules,
capacities read off the data, and clear errors for corrupted records."""

from __future__ import annotations

import copy
import json

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jax_drive.pdm import interpolate_poses, score_proposals
from jax_drive.pdm_reference import ReferenceScorer, scene_to_numpy
from jax_drive.scenes import builders, generate_scenes, io
from jax_drive.types import NUM_OBS_STEPS, AgentType, PolygonType
from pdm_scenes import straight_poses

UTM = np.array([512_345.678, 4_987_654.321, 2.2])  # a UTM-sized, rotated t0 pose


def _place(xy, origin=UTM):
    c, s = np.cos(origin[2]), np.sin(origin[2])
    xy = np.asarray(xy, np.float64)
    return np.stack([origin[0] + c * xy[..., 0] - s * xy[..., 1], origin[1] + s * xy[..., 0] + c * xy[..., 1]], -1)


def small_record(token="scene-a") -> dict:
    """A minimal valid record at UTM coordinates: a 2-lane road and a car ahead at 0.1 s."""
    road = builders.rectangle(-50, 150, -1.75, 5.25)
    lane0, lane1 = builders.rectangle(-50, 150, -1.75, 1.75), builders.rectangle(-50, 150, 1.75, 5.25)
    frames = []
    for k in range(NUM_OBS_STEPS):
        x, y = _place([30.0 + 5.0 * 0.1 * k, 0.1])
        frames.append([{"token": "car", "type": "vehicle", "x": float(x), "y": float(y), "heading": float(UTM[2]),
                        "length": 4.5, "width": 2.0, "height": 1.6,
                        "vx": 5.0 * np.cos(UTM[2]), "vy": 5.0 * np.sin(UTM[2])}])
    return {
        "token": token,
        "ego": {"pose": UTM.tolist(), "velocity": [8.0, 0.0], "acceleration": [0.0, 0.0]},
        "observation": {"dt": 0.1, "frames": frames},
        "map": {"polygons": [
            {"id": "rb", "layer": "ROADBLOCK", "exterior": _place(road).tolist()},
            {"id": "l0", "layer": "LANE", "exterior": _place(lane0).tolist(),
             "centerline": _place([[-50, 0], [150, 0]]).tolist()},
            {"id": "l1", "layer": "LANE", "exterior": _place(lane1).tolist()},
            {"id": "xw", "layer": "CROSSWALK", "exterior": _place(builders.rectangle(20, 24, -2, 6)).tolist()}],
            "route_lane_ids": ["l0"], "route": _place(np.stack([np.linspace(-50, 150, 21), np.zeros(21)], -1)).tolist()},
        "command": "GO STRAIGHT",
    }


# ------------------------------------------------------------------ round trips
def test_utm_offset_rotated_round_trip_scores_identically(tmp_path):
    """Generated scenes written at UTM-sized, rotated poses and read back score exactly as
    the originals (the acceptance check of the format's float64 path)."""
    scenes = generate_scenes(jax.random.PRNGKey(4), 4)
    rng = np.random.default_rng(0)
    origins = np.stack([rng.uniform(2e5, 8e5, 4), rng.uniform(4e6, 5e6, 4), rng.uniform(-np.pi, np.pi, 4)], -1)
    expert = np.asarray(scenes.expert)
    reference = np.asarray(interpolate_poses(scenes, scenes.expert, 0.5))[:, 1:]
    records = [io.scene_record(jax.tree.map(lambda a: a[i], scenes), origins[i], f"tok-{i}", reference[i])
               for i in range(4)]
    path = io.write_scene_file(tmp_path / "scenes.json.gz", records)
    loaded = io.load_scenes(path)
    assert loaded.tokens == ("tok-0", "tok-1", "tok-2", "tok-3")
    np.testing.assert_array_equal(loaded.origins, origins)
    assert loaded.has_reference.all()
    np.testing.assert_allclose(loaded.references, reference, atol=1e-5)
    assert all(not n for n in loaded.notes)  # history, expert and sizes all came from the file
    back = loaded.build(sizes=builders.SceneSizes())  # the generator's layout: same shapes
    props = expert[:, None] * np.array([1.0, 0.6, 1.4])[None, :, None, None]
    a = score_proposals(scenes, props, reference)
    b = score_proposals(back, props, loaded.references)
    for name in ("nc", "dac", "ddc", "ttc", "comfort", "tlc", "lk", "hc", "ttc_v2"):
        np.testing.assert_array_equal(np.asarray(getattr(b, name)), np.asarray(getattr(a, name)), err_msg=name)
    for name in ("ep", "pdms", "epdms", "progress"):
        np.testing.assert_allclose(np.asarray(getattr(b, name)), np.asarray(getattr(a, name)), atol=1e-5, err_msg=name)


def test_small_record_loads_with_navsim_layer_rules():
    f = io.load_scenes([small_record()])
    assert f.dropped_layers == {"CROSSWALK": 1}
    spec = f.specs[0]
    assert [p.kind for p in spec.drivable] == [int(PolygonType.ROADBLOCK)]
    assert [lane.on_route for lane in spec.lanes] == [True, False]
    assert spec.lanes[1].centerline is None  # no centreline in the file: padded as invalid
    scene = f.build()
    assert not bool(scene.map.lane_centerline_valid[0, 1].any())
    # The car 30 m ahead, ego frame, float64 -> float32 without UTM-sized rounding.
    np.testing.assert_allclose(float(scene.agents.x[0, 0, 0]), 30.0, atol=1e-6)
    np.testing.assert_allclose(float(scene.agents.y[0, 0, 0]), 0.1, atol=1e-6)
    np.testing.assert_allclose(float(scene.agents.vx[0, 0, 0]), 5.0, atol=1e-6)
    np.testing.assert_allclose(np.asarray(scene.map.lanes.vertices[0, 0, :4]),
                               builders.rectangle(-50, 150, -1.75, 1.75)[[0, 1, 2, 3]], atol=1e-6)
    assert "no history" in f.notes[0][0] and "no expert" in f.notes[0][1]


def test_open_ring_at_utm_coordinates_keeps_all_vertices():
    """np.allclose's relative tolerance (~50 m at y = 5e6) once turned an open 60 x 3.5 m
    rectangle at UTM coordinates into a triangle."""
    rect = _place(builders.rectangle(0, 60, 0, 3.5))
    assert len(builders.ring_layout(rect)) == 4
    assert len(builders.ring_layout(np.concatenate([rect, rect[:1]]))) == 4  # explicitly closed
    rec = small_record()
    rec["map"]["polygons"][1]["exterior"] = rect.tolist()
    scene = io.load_scenes([rec]).build()
    lane = np.asarray(scene.map.lanes.vertices[0, 0])
    assert len(np.unique(lane.round(4), axis=0)) == 4


def test_polygon_hole_is_not_drivable_in_both_scorers():
    """A hole in the roadblock over the left lane: changing into it fails DAC, keeping
    the lane does not, in the JAX scorer and in the shapely reference."""
    spec = builders.straight_road(num_lanes=2, ego_lane=0, ego_speed=8.0)
    island = builders.rectangle(10, 40, 2.0, 5.0)
    spec.drivable[0].holes = [island]
    sizes = builders.SceneSizes(drivable_vertices=16)
    scene = spec.build(sizes=sizes)
    exterior, holes = builders.polygon_rings(np.asarray(scene.map.drivable.vertices[0], np.float64))
    assert len(exterior) == 4 and len(holes) == 1 and len(holes[0]) == 4
    into, keep = straight_poses(8.0, lateral=3.5), straight_poses(8.0)
    reference = straight_poses(8.0, num=40, dt=0.1)
    r = score_proposals(scene, np.stack([into, keep]), reference)
    assert np.asarray(r.dac).tolist() == [0.0, 1.0]
    ref = ReferenceScorer(scene_to_numpy(scene))
    assert [ref.score(p, reference)["dac"] for p in (into, keep)] == [0.0, 1.0]
    # Without the hole the lane change is fine.
    spec.drivable[0].holes = []
    assert float(score_proposals(spec.build(sizes=sizes), into[None], reference).dac[0]) == 1.0


def test_capacities_come_from_the_data_and_group_by_bucket():
    big = small_record("big")
    for k, boxes in enumerate(big["observation"]["frames"]):
        for n in range(40):
            x, y = _place([60.0 + 6.0 * n, 3.5])
            boxes.append({"token": f"parked-{n}", "type": "vehicle", "x": float(x), "y": float(y),
                          "heading": float(UTM[2]), "length": 4.5, "width": 2.0, "height": 1.5})
    ring = np.stack([np.linspace(-50, 150, 70), np.full(70, -1.75)], -1)
    ring = np.concatenate([ring, [[150, 5.25], [-50, 5.25]]])
    big["map"]["polygons"][0]["exterior"] = _place(ring).tolist()  # 72 vertices
    f = io.load_scenes([small_record("small"), big])
    sizes = f.sizes()
    assert sizes[0].num_agents == 8 and sizes[1].num_agents == 64  # 41 objects, bucketed
    assert sizes[1].drivable_vertices == 128  # 72 vertices, not truncated
    groups = f.groups()
    assert [g[0].tolist() for g in groups] == [[0], [1]]
    scene = f.build([1], groups[1][1])
    assert int(np.asarray(scene.agents.valid).any(-1).sum()) == 41


def test_half_second_observation_is_interpolated_like_navsims_metric_cache():
    rec = small_record()
    frames = []
    for k in range(11):  # 0 .. 5 s at 0.5 s
        x, y = _place([20.0 + 2.0 * k, 0.1])
        boxes = [{"token": "walker", "type": "pedestrian", "x": float(x), "y": float(y), "heading": float(UTM[2]),
                  "length": 0.5, "width": 0.5, "height": 1.8}] if 2 <= k <= 6 else []
        if k == 0:
            cx, cy = _place([40.0, 4.0])
            boxes.append({"token": "cone", "type": "traffic_cone", "x": float(cx), "y": float(cy),
                          "heading": 0.0, "length": 0.5, "width": 0.5, "height": 0.8})
        frames.append(boxes)
    rec["observation"] = {"dt": 0.5, "frames": frames}
    rec["map"]["traffic_lights"] = [{"lane_id": "l1", "red": [k < 4 for k in range(11)]}]
    scene = io.load_scenes([rec]).build()
    valid = np.asarray(scene.agents.valid[0])
    x = np.asarray(scene.agents.x[0])
    cone, walker = 0, 1  # in order of first appearance
    assert valid[walker].tolist() == [10 <= k <= 30 for k in range(NUM_OBS_STEPS)]  # 1.0 .. 3.0 s
    np.testing.assert_allclose(x[walker, 10:31], 24.0 + 0.4 * np.arange(21), atol=1e-5)
    assert valid[cone].all()  # annotated once: stands in every frame
    assert int(scene.agents.agent_type[0, cone]) == int(AgentType.TRAFFIC_CONE)
    red = np.asarray(scene.map.red_light[0, 1])
    assert red[:20].all() and not red[20:].any()  # red until 2.0 s (held between annotations)


def test_trajectories_at_any_spacing_are_resampled():
    rec = small_record()
    t = np.arange(1, 17) * 0.25  # 0.25 s spacing, 4 s
    ego_frame = np.stack([8.0 * t, 0.02 * t**2, np.arctan2(0.04 * t, 8.0)], -1)
    glob = np.concatenate([_place(ego_frame[:, :2]), ego_frame[:, 2:] + UTM[2]], -1)
    rec["expert"] = {"dt": 0.25, "poses": glob.tolist()}
    rec["pdm_closed"] = {"dt": 0.25, "poses": glob.tolist()}
    f = io.load_scenes([rec])
    np.testing.assert_allclose(f.specs[0].expert, ego_frame[1::2], atol=1e-9)
    ref = f.references[0]
    np.testing.assert_allclose(ref[1::2, :2], np.stack([8.0 * np.arange(1, 21) * 0.2,
                                                        0.02 * (np.arange(1, 21) * 0.2) ** 2], -1), atol=2e-3)
    short = copy.deepcopy(rec)
    short["pdm_closed"]["poses"] = glob[:12].tolist()  # 3 s
    with pytest.raises(io.SceneFileError, match=r"scenes\[0\] \(token 'scene-a'\): pdm_closed.poses: .*need 4 s"):
        io.load_scenes([short])


def test_first_appearance_size_and_type_changes_are_noted():
    rec = small_record()
    rec["observation"]["frames"][20][0]["length"] = 4.8
    rec["observation"]["frames"][30][0]["type"] = "bicycle"
    f = io.load_scenes([rec])
    notes = " ".join(f.notes[0])
    assert "type changes" in notes and "box size changes by up to 0.3 m" in notes
    scene = f.build()
    assert float(scene.agents.length[0, 0]) == 4.5 and int(scene.agents.agent_type[0, 0]) == int(AgentType.VEHICLE)


def test_file_level_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "jax-drive-scenes", "version": 1, "scenes": [{"token": NaN}]}')
    with pytest.raises(io.SceneFileError, match="NaN is not allowed"):
        io.load_scenes(bad)
    bad.write_text(json.dumps({"format": "jax-drive-scenes", "version": 2, "scenes": []}))
    with pytest.raises(io.SceneFileError, match="version"):
        io.load_scenes(bad)
    bad.write_text("{")
    with pytest.raises(io.SceneFileError, match="invalid JSON"):
        io.load_scenes(bad)
    with pytest.raises(io.SceneFileError, match="no such file"):
        io.load_scenes(tmp_path / "missing.json")
    with pytest.raises(io.SceneFileError, match=r"scenes\[1\]: token: 'scene-a' already used by scenes\[0\]"):
        io.load_scenes([small_record(), small_record()])


# ------------------------------------------------------------------ corruptions
def _set(record, path, value):
    node = record
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def _delete(record, path):
    node = record
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]


# (path in the record, the field name the error must carry, a replacement that is invalid)
CORRUPTIONS = [
    (("token",), "token", ""),
    (("ego", "pose"), "ego.pose", [1.0, 2.0]),
    (("ego", "pose"), "ego.pose", [1.0, float("nan"), 0.0]),
    (("ego", "velocity"), "ego.velocity", "fast"),
    (("ego", "acceleration"), "ego.acceleration", [0.0, float("inf")]),
    (("ego", "steering_angle"), "ego.steering_angle", True),
    (("observation", "dt"), "observation.dt", 0.2),
    (("observation", "frames"), "observation.frames", [[]] * 30),
    (("observation", "frames", 3, 0, "length"), "observation.frames[3][0].length", -1.0),
    (("observation", "frames", 3, 0, "type"), "observation.frames[3][0].type", "spaceship"),
    (("observation", "frames", 3, 0, "x"), "observation.frames[3][0].x", None),
    (("observation", "frames", 3, 0, "token"), "observation.frames[3][0].token", ["car"]),
    (("observation", "frames", 3), "observation.frames[3]", {"car": 1}),
    (("map", "polygons", 0, "layer"), "map.polygons[0].layer", "MOON"),
    (("map", "polygons", 0, "exterior"), "map.polygons[0].exterior", [[0.0, 0.0], [1.0, 1.0]]),
    (("map", "polygons", 0, "exterior"), "map.polygons[0].exterior", [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]),
    (("map", "polygons", 1, "holes"), "map.polygons[1].holes", [[[0.0, 0.0], [1.0]]]),
    (("map", "polygons", 2, "id"), "map.polygons[2].id", "l0"),
    (("map", "route"), "map.route", [[0.0, 0.0]]),
    (("map", "route_lane_ids"), "map.route_lane_ids", "l0"),
    (("map", "speed_limit"), "map.speed_limit", 0.0),
    (("map", "traffic_lights"), "map.traffic_lights[0].lane_id", [{"lane_id": "nowhere", "red": True}]),
    (("map", "traffic_lights"), "map.traffic_lights[0].red", [{"lane_id": "l0", "red": [True] * 3}]),
    (("map", "traffic_lights"), "map.traffic_lights", 7),
    (("command",), "command", ["GO STRAIGHT"]),
    (("expert",), "expert.dt", {"dt": -0.5, "poses": [[0.0, 0.0, 0.0]] * 8}),
    (("pdm_closed",), "pdm_closed.poses", {"dt": 0.1, "poses": [[0.0, 0.0]] * 40}),
    (("ego", "history"), "ego.history.poses", {"dt": 0.1, "poses": [[0.0, 0.0, 0.0]] * 16,
                                               "velocity": [[0.0, 0.0]] * 16, "acceleration": [[0.0, 0.0]] * 16}),
]
REQUIRED = [(("token",), "token"), (("ego",), "ego"), (("ego", "pose"), "ego.pose"),
            (("observation", "frames"), "observation.frames"), (("map", "route"), "map.route"),
            (("map", "polygons", 0, "exterior"), "map.polygons[0].exterior"),
            (("observation", "frames", 5, 0, "heading"), "observation.frames[5][0].heading")]


@pytest.mark.parametrize("path, field, value", CORRUPTIONS, ids=[c[1] for c in CORRUPTIONS])
def test_corrupted_field_gives_an_error_naming_scene_and_field(path, field, value):
    records = [small_record(f"scene-{i}") for i in range(3)]
    _set(records[1], path, value)
    with pytest.raises(io.SceneFileError) as err:
        io.load_scenes(records)
    message = str(err.value)
    assert "scenes[1]" in message and (field == "token" or "(token 'scene-1')" in message), message
    assert f": {field}" in message, message


@pytest.mark.parametrize("path, field", REQUIRED, ids=[r[1] for r in REQUIRED])
def test_missing_field_gives_an_error_naming_it(path, field):
    record = small_record()
    _delete(record, path)
    with pytest.raises(io.SceneFileError) as err:
        io.load_scenes([record])
    assert f"{field}: missing" in str(err.value), str(err.value)


def _is_numbers(node) -> bool:
    return isinstance(node, list) and bool(node) and all(
        isinstance(v, (int, float)) or (isinstance(v, list) and all(isinstance(u, (int, float)) for u in v))
        for v in node)


def _paths(node, prefix=()):
    """Every path into a record; numeric arrays are leaves."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list) and not _is_numbers(node):
        for i, value in enumerate(node):
            yield from _paths(value, prefix + (i,))


def _field(path) -> str:
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else key)
    return out


RECORD_PATHS = [p for p in _paths(small_record()) if p and p[0] != "token"]
JUNK = {"number": [None, "7", float("nan"), float("inf"), True, [1.0]],
        "string": [None, "", 7.5, [], {}],
        "container": [None, "x", 3.0, True]}


def _kind(value) -> str:
    if isinstance(value, (dict, list)):
        return "container"
    return "string" if isinstance(value, str) else "number"


@settings(max_examples=150)
@given(data=st.data())
def test_random_corruptions_raise_a_scene_file_error_naming_the_field(data):
    """Any field replaced by a value of the wrong kind (or NaN / inf / empty) is rejected
    with a SceneFileError naming that field or its container; nothing else is raised and
    nothing loads."""
    path = data.draw(st.sampled_from(RECORD_PATHS), label="path")
    record = small_record()
    node = record
    for key in path:
        node = node[key]
    junk = data.draw(st.sampled_from(JUNK[_kind(node)]), label="junk")
    if junk == [] and path[-1] == "holes":
        junk = None  # an empty hole list is valid
    _set(record, path, junk)
    with pytest.raises(io.SceneFileError) as err:
        io.load_scenes([record])
    message = str(err.value)
    parent = _field(path[:-1]) if isinstance(path[-1], int) else _field(path)
    assert "scenes[0] (token 'scene-a')" in message, message
    assert parent.split("[")[0] in message, (parent, message)


def test_record_of_a_hand_built_scene_round_trips_holes_lights_and_history():
    spec = builders.straight_road(num_lanes=2, ego_lane=0, ego_speed=6.0, ego_accel=-0.5)
    spec.drivable[0].holes = [builders.rectangle(60, 70, 3.0, 4.0)]
    spec.lanes[0].red_light = np.arange(NUM_OBS_STEPS) >= 5
    builders.add_agent(spec, x=25.0, y=3.5, speed=4.0)
    sizes = builders.SceneSizes(drivable_vertices=16)
    scene = spec.build(sizes=sizes)
    record = io.scene_record(scene, UTM, "hand")
    back = io.load_scenes([json.loads(json.dumps(record))]).build(sizes=sizes)
    np.testing.assert_array_equal(np.asarray(back.map.red_light[0]), np.asarray(scene.map.red_light))
    np.testing.assert_allclose(np.asarray(back.map.drivable.vertices[0]), np.asarray(scene.map.drivable.vertices),
                               atol=2e-5)
    np.testing.assert_allclose(np.asarray(back.ego.history_poses[0]), np.asarray(scene.ego.history_poses), atol=2e-5)
    np.testing.assert_allclose(np.asarray(back.ego.history_acceleration[0]),
                               np.asarray(scene.ego.history_acceleration), atol=1e-6)
    np.testing.assert_allclose(np.asarray(back.agents.x[0, 0]), np.asarray(scene.agents.x[0]), atol=2e-5)


def test_data_build_reads_a_scene_file(tmp_path, capsys):
    """`jax-drive data build --scenes-file` writes one record per scene with its token."""
    from jax_drive.cli import main

    path = io.write_scene_file(tmp_path / "s.json", [small_record("first"), small_record("second")])
    out = tmp_path / "single.jsonl"
    assert main(["data", "build", "--kind", "single", "--scenes-file", str(path), "--out", str(out),
                 "--no-progress"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["scene_id"], r["meta"]["token"]) for r in records] == [(0, "first"), (1, "second")]
    assert "GO STRAIGHT" in records[0]["messages"][0]["content"] + records[0]["messages"][-2]["content"]
    assert main(["data", "build", "--kind", "single", "--scenes-file", str(path), "--scenes", "2", "--out", str(out)]) == 2
    assert "either --scenes N" in capsys.readouterr().err


EXAMPLES = __import__("pathlib").Path(__file__).resolve().parents[1] / "examples" / "scenes"


def test_example_scene_file_is_what_its_script_writes(tmp_path):
    """examples/scenes/*: the committed files equal a fresh run of make_example_scenes.py
    (their scores are checked against the hand-derived expectations in
    tests/test_cli_score.py::test_cli_scores_the_example_scene_file)."""
    import sys

    sys.path.insert(0, str(EXAMPLES))
    try:
        import make_example_scenes
    finally:
        sys.path.remove(str(EXAMPLES))
    assert make_example_scenes.main(["--out-dir", str(tmp_path)]) == 0
    assert io.read_scene_file(tmp_path / "example_scenes.json.gz") == io.read_scene_file(
        EXAMPLES / "example_scenes.json.gz")
    for name in ("example_trajectories.jsonl", "example_expected.json"):
        assert (tmp_path / name).read_text() == (EXAMPLES / name).read_text(), name
    assert len(io.load_scenes(EXAMPLES / "example_scenes.json.gz")) == 20


# ---------------------------------------------------------------------------------------
# the loader's bulk paths agree with the checked, one-at-a-time ones


def _np_interp_resample(poses, dt, times):
    """resample_poses written with np.interp, one trajectory at a time (the reference)."""
    knots = np.concatenate([np.zeros((1, 3)), poses], 0)
    knot_t = np.arange(len(knots)) * dt
    heading = np.unwrap(knots[:, 2])
    out = np.stack([np.interp(times, knot_t, knots[:, 0]), np.interp(times, knot_t, knots[:, 1]),
                    np.interp(times, knot_t, heading)], -1)
    out[:, 2] = (out[:, 2] + np.pi) % (2 * np.pi) - np.pi
    return out


@pytest.mark.parametrize("dt, steps, times", [
    (0.5, 8, (np.arange(8) + 1) * 0.5),                    # knots at the query times
    (0.3, 14, (np.arange(8) + 1) * 0.5),                   # queries between knots
    (0.1, 40, (np.arange(40) + 1) * 0.1),
    (0.5, 8, np.append((np.arange(7) + 1) * 0.5, 4.0 + 1e-10)),  # just past the last knot
])
def test_batched_resampling_is_np_interp_bit_for_bit(dt, steps, times):
    from jax_drive.scenes.parse import resample_poses

    poses = np.random.default_rng(steps).normal(size=(16, steps, 3)) * [20.0, 4.0, 2.5]
    batched = resample_poses(poses, dt, times)
    assert batched.shape == (16, len(times), 3)
    for row, p in zip(batched, poses):
        np.testing.assert_array_equal(row, _np_interp_resample(p, dt, times))


def test_signed_area_at_utm_coordinates():
    """The shoelace sum of UTM-sized products cancels to ~1e-3 m^2 of noise; measured from
    the first vertex it stays exact enough for the zero-area and orientation checks."""
    origin = np.array([512345.678, 4987654.321])
    collinear = origin + np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
    assert abs(builders.signed_area(collinear)) < 1e-9
    square = origin + np.array([[0.0, 0.0], [2.0, 0.0], [2.0, 1.0], [0.0, 1.0]])
    assert builders.signed_area(square) == pytest.approx(2.0, abs=1e-6)
    assert builders.signed_area(square[::-1]) == pytest.approx(-2.0, abs=1e-6)


def test_fast_box_reader_matches_the_checked_one():
    from jax_drive.scenes.parse import _checked_boxes, _fast_boxes, _Where

    frames = json.loads(json.dumps(small_record()))["observation"]["frames"]  # as read from a file
    for box in frames[3]:  # optional fields absent in one frame: their default 0
        for key in ("vx", "vy", "z"):
            box.pop(key, None)
    fast, checked = _fast_boxes(frames), _checked_boxes(frames, _Where("<test>", 0))
    assert fast is not None
    assert fast[:3] == checked[:3]
    np.testing.assert_array_equal(fast[3], checked[3])
    frames[2][0]["x"] = True  # a bool is not a number: the fast path gives up, the checked one names it
    assert _fast_boxes(frames) is None
