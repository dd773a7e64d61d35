"""The simulator's lane geometry against shapely (JAX in the core, NumPy in the
rule-based policies), off-road detection, occlusion (line of sight) and sensor range."""

import jax
import jax.numpy as jnp
import numpy as np
import shapely.geometry as sg
from hypothesis import given, settings, strategies as st

from jax_drive.coop.baselines import lane_projection
from jax_drive.geometry import box_corners, polyline_table, project_on_table
from jax_drive.sim import core, lanes as L, observe, layouts, scenarios as S
from jax_drive.sim.state import SimConfig

POLY = L.resample(L.join(L.straight([0, 0], [20, 0], 5), L.bezier([20, 0], [40, 0], [40, 20], 12)), 64)
LINE = sg.LineString(POLY)
_lane_coords = jax.jit(core.lane_coords)
_project = jax.jit(lambda table, xy: project_on_table(table, xy, extrapolate=True))
line_of_sight = jax.jit(observe.line_of_sight)


# The lateral offset is measured from the closest segment's line (a Frenet offset): equal to
# the Euclidean distance where the closest point is inside a segment, shorter by at most a
# factor cos(turn) where it is a vertex that turns the path by `turn` (shapely's distance is
# Euclidean). Measured on POLY: at most 10 degrees per vertex.
MAX_TURN = float(np.abs(np.diff(np.unwrap(np.arctan2(*np.diff(POLY, axis=0)[:, ::-1].T)))).max())


def _check_lateral(lateral: float, p) -> None:
    distance = LINE.distance(p)
    assert distance * np.cos(MAX_TURN) - 2e-2 <= abs(lateral) <= distance + 2e-2, (lateral, distance)


@settings(max_examples=40)
@given(st.floats(1.0, 39.0), st.floats(-5.0, 15.0))
def test_lane_projection_matches_shapely_in_both_backends(x, y):
    table = polyline_table(jnp.asarray(POLY, jnp.float32))
    arc, lat = _lane_coords(table, jnp.asarray([x, y], jnp.float32))
    p = sg.Point(x, y)
    np.testing.assert_allclose(float(arc), LINE.project(p), atol=2e-2)
    _check_lateral(float(lat), p)
    np.testing.assert_allclose(float(_project(table, jnp.asarray([x, y], jnp.float32)).distance),
                               LINE.distance(p), atol=2e-2)
    view = {"lane_table": polyline_table(POLY[None])}  # what a policy's view holds
    proj = lane_projection(view, 0, np.array([x, y]))
    np.testing.assert_allclose(float(proj.arc), LINE.project(p), atol=2e-2)
    _check_lateral(float(proj.lateral), p)


def test_lane_paths_are_uniformly_resampled():
    seg = np.linalg.norm(np.diff(POLY, axis=0), axis=1)
    np.testing.assert_allclose(seg, LINE.length / 63, rtol=1e-2)


def test_offroad_against_every_lane():
    cfg = SimConfig()
    b = layouts.Builder(cfg)
    lane = b.lane(L.straight([0, 0], [100, 0], 16))
    for arc in (10.0, 20.0, 30.0):
        b.add(layouts.Agent(lane=lane, arc=arc, speed=0.0))
    sc = b.build(timeout=10.0, accident_prone=False, scenario_id=0)
    st = core.reset(cfg, jax.random.key(0), sc)
    xy = st.x.at[:3].set(jnp.array([50.0, 50.0, 120.0])), st.y.at[:3].set(jnp.array([1.0, 3.0, 0.0]))
    st = st.replace(x=xy[0], y=xy[1])
    off = np.asarray(jax.jit(lambda s, q: core.offroad(cfg, s, q, core.tables(s, q)))(sc, st))
    # half width 1.75 + margin 0.5: 1 m to the side is on the road, 3 m is not, past the end is not
    assert off[:3].tolist() == [False, True, True]


def _scene(xs, ys, lengths, widths):
    xs, ys = jnp.asarray(xs, jnp.float32), jnp.asarray(ys, jnp.float32)
    corners = box_corners(xs, ys, jnp.zeros_like(xs), jnp.asarray(lengths), jnp.asarray(widths))
    return jnp.stack([xs, ys], -1), corners


def test_middle_truck_occludes_and_side_offset_reveals():
    # observer at x=0, truck at x=10 (10 m x 2.6 m), car at x=30, all on y=0
    centres, corners = _scene([0.0, 10.0, 30.0], [0.0, 0.0, 0.0], [4.6, 10.0, 4.6], [2.0, 2.6, 2.0])
    vis = np.asarray(line_of_sight(centres, corners, jnp.array([True, True, True])))
    assert vis[0, 1] and not vis[0, 2] and not vis[2, 0]
    # an absent truck does not block
    vis = np.asarray(line_of_sight(centres, corners, jnp.array([True, False, True])))
    assert vis[0, 2]
    # the far car moved 10 m sideways: visible past the truck
    centres, corners = _scene([0.0, 10.0, 30.0], [0.0, 0.0, 10.0], [4.6, 10.0, 4.6], [2.0, 2.6, 2.0])
    vis = np.asarray(line_of_sight(centres, corners, jnp.array([True, True, True])))
    assert vis[0, 2]


def test_visibility_respects_sensor_range():
    cfg = SimConfig()
    b = layouts.Builder(cfg)
    lane = b.lane(L.straight([0, 0], [300, 0]))
    b.add(layouts.Agent(lane=lane, arc=10.0, speed=0.0))
    b.add(layouts.Agent(lane=lane, arc=10.0 + cfg.sensor_range - 1.0, speed=0.0))
    b.add(layouts.Agent(lane=lane, arc=10.0 + cfg.sensor_range + 30.0, speed=0.0))
    sc = b.build(timeout=10.0, accident_prone=False, scenario_id=0)
    st = core.reset(cfg, jax.random.key(0), sc)
    vis = np.asarray(observe.visibility(cfg, sc, st))
    assert vis[0, 1] and not vis[0, 2] and not vis[0, 0]
    assert not vis[:, 3:].any()  # padding never visible
