"""The CARLA backend. Without a server: frames, route XML, lane tracing and the town
builder, anchors, spawn plans, the controller's pedals, every CARLA call checked against
the 0.9.16 client wheel (pinned in requirements-test.txt), and whole episodes on tests/carla_fake.py (a stand-in server
whose physics is the core's bicycle) compared with the JAX backend. With a server
(CARLA_HOST / CARLA_PORT reach one): one episode per layout, the PettingZoo API and the
Ray backend; skipped with the reason otherwise."""

from __future__ import annotations

import os
import socket

import jax
import numpy as np
import pytest

import carla_fake as F
from jax_drive.carla.env import CarlaEpisodeBatch, CarlaParallelEnv, pedals
from jax_drive.carla.frames import Anchor, to_carla, to_local, velocity_to_carla, velocity_to_local, wrap_degrees
from jax_drive.carla.routes import Route, ego_routes, read_routes, write_interdrive, write_routes
from jax_drive.carla.sites import LAYOUT, SITES, Site, SiteMismatch, build_on_town, find_anchor, site_of, trace_lane
from jax_drive.carla.spawn import CAR_BLUEPRINT, TRUCK_BLUEPRINT, spawn_plan
from jax_drive.carla.world import CARLA_API, CarlaWorld
from jax_drive.coop.baselines import make_policy
from jax_drive.coop.runner import run_episodes
from jax_drive.distributed.backends import BackendFailure, CarlaBackend, CarlaRunner
from jax_drive.distributed.episodes import EpisodeSpec
from jax_drive.geometry import polyline_table, project_on_table
from jax_drive.runinfo import InputError
from jax_drive.sim import core, layouts, scenarios as S
from jax_drive.sim.state import Behaviour, SimConfig

ANCHOR = Anchor("FakeTown", 120.0, -35.0, 30.0, z=0.2)
ANGLES = np.linspace(-np.pi, np.pi, 9)


# ------------------------------------------------------------------------------ frames
def test_frames_round_trip_and_handedness():
    rng = np.random.default_rng(0)
    xy, h = rng.normal(size=(50, 2)) * 100, rng.uniform(-np.pi, np.pi, 50)
    cxy, yaw = to_carla(ANCHOR, xy, h)
    back, h2 = to_local(ANCHOR, cxy, yaw)
    np.testing.assert_allclose(back, xy, atol=1e-9)
    np.testing.assert_allclose(np.cos(h2 - h), 1.0, atol=1e-12)
    # the origin goes to the anchor; local +x along the anchor's yaw; local +y (left) is to
    # the left of the anchor's heading in CARLA, i.e. at yaw - 90 degrees
    np.testing.assert_allclose(to_carla(ANCHOR, np.zeros(2)), [ANCHOR.x, ANCHOR.y], atol=1e-12)
    for local, yaw_offset in (([1.0, 0.0], 0.0), ([0.0, 1.0], -90.0)):
        d = to_carla(ANCHOR, np.array(local)) - [ANCHOR.x, ANCHOR.y]
        want = np.radians(ANCHOR.yaw + yaw_offset)
        np.testing.assert_allclose(d, [np.cos(want), np.sin(want)], atol=1e-12)
    # a heading along local +x has the anchor's yaw; velocities rotate like directions
    assert to_carla(ANCHOR, np.zeros(2), 0.0)[1] == pytest.approx(ANCHOR.yaw)
    v = np.array([3.0, -4.0])
    np.testing.assert_allclose(velocity_to_local(ANCHOR, velocity_to_carla(ANCHOR, v)), v, atol=1e-12)
    assert wrap_degrees(190.0) == pytest.approx(-170.0) and wrap_degrees(-180.0) == pytest.approx(-180.0)


def test_frames_agree_with_the_carla_client_types():
    import carla  # the 0.9.16 client wheel of the test install
    from jax_drive.carla.frames import carla_transform

    for h in ANGLES:
        t = carla_transform(ANCHOR, np.array([10.0, -2.0]), float(h))
        fwd = t.get_forward_vector()
        step = to_carla(ANCHOR, np.array([10.0 + np.cos(h), -2.0 + np.sin(h)])) - [t.location.x, t.location.y]
        np.testing.assert_allclose([fwd.x, fwd.y], step, atol=1e-5)  # CARLA's forward = our heading
        assert t.location.z == pytest.approx(ANCHOR.z)
    assert isinstance(t, carla.Transform)


def test_every_carla_call_exists_in_the_client_wheel():
    import carla
    missing = []
    for name in CARLA_API:
        obj = carla
        for part in name.split("."):
            if not hasattr(obj, part):
                missing.append(name)
                break
            obj = getattr(obj, part)
    assert not missing, f"not in carla {getattr(carla, '__version__', '0.9.16')}: {missing}"


# ------------------------------------------------------------------------------ routes
def test_route_xml_round_trip_and_leaderboard_2_positions(tmp_path):
    route = Route("7", "Town05", np.array([[1.0, 2.0, 0.5], [3.5, 2.0, 0.5], [3.5, 6.0, 0.4]]),
                  np.array([0.0, 90.0, 90.0]))
    path = write_routes(tmp_path / "r.xml", [route])
    (back,) = read_routes(path)
    assert (back.id, back.town) == ("7", "Town05")
    np.testing.assert_allclose(back.points, route.points, atol=1e-3)
    np.testing.assert_allclose(back.yaw, route.yaw, atol=1e-6)
    assert back.length == pytest.approx(6.5, abs=1e-3)
    v2 = tmp_path / "v2.xml"
    v2.write_text('<routes><route id="0" town="Town06"><waypoints><position x="0" y="0" z="0"/>'
                  '<position x="0" y="10" z="0"/></waypoints></route></routes>')
    (r2,) = read_routes(v2)
    np.testing.assert_allclose(r2.yaw, [90.0, 90.0])  # the direction of travel
    bad = {"notxml.xml": "<routes", "root.xml": "<route/>", "one.xml": '<routes><route><waypoint x="1" y="2"/></route></routes>',
           "nan.xml": '<routes><route><waypoint x="a" y="2"/><waypoint x="1" y="2"/></route></routes>',
           "empty.xml": "<routes/>"}
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(InputError):
            read_routes(tmp_path / name)


def test_ego_routes_follow_the_goal_lanes(tmp_path):
    key = jax.random.key(3)
    sc = S.build("lm_highway_merge", key)
    routes = ego_routes(sc, ANCHOR)
    egos = np.flatnonzero(np.asarray(sc.valid) & np.asarray(sc.reward) & (np.asarray(sc.behaviour) == Behaviour.POLICY))
    assert len(routes) == len(egos) == 3
    for route, i in zip(routes, egos):
        local, _ = to_local(ANCHOR, route.points[:, :2], route.yaw)
        # ends at the goal, starts level with the ego; as long as its planned route
        assert route.length == pytest.approx(float(sc.route_length[i]), abs=2.0)
        goal_lane = int(sc.goal_lane[i])
        end_arc = float(core.lane_coords(polyline_table(sc.lanes.points[goal_lane]), local[-1])[0])
        assert end_arc == pytest.approx(float(sc.goal_arc[i]), abs=0.05)
    files = write_interdrive(tmp_path, "r1_town06_merge", routes)
    assert [os.path.basename(f) for f in files] == [f"r1_town06_merge_{k}.xml" for k in range(3)]
    assert read_routes(files[2])[0].points.shape == routes[2].points.shape


# --------------------------------------------------------------------- sites and towns
def town_from_scenario(name: str, key, anchor: Anchor = ANCHOR, junction: bool = False) -> F.Town:
    """A fake town whose lanes are the scenario's own paths (opposite-lane copies dropped:
    the overtake path must be traced against the real lane's direction)."""
    sc = S.build(name, key)
    valid, label = np.asarray(sc.lanes.valid), np.asarray(sc.lanes.label)
    keep = [k for k in np.flatnonzero(valid) if label[k] >= 0]
    index = {k: i for i, k in enumerate(keep)}
    lanes = [dict(points=to_carla(anchor, np.asarray(sc.lanes.points[k], np.float64)), width=float(sc.lanes.width[k]),
                  lane_id=-1, left=index.get(int(sc.lanes.left[k])), right=index.get(int(sc.lanes.right[k])))
             for k in keep]
    return F.Town(anchor.town, lanes, (to_carla(anchor, np.zeros(2)), layouts.STOP) if junction else None)


@pytest.mark.parametrize("name", ["tv_overtake_perception", "tv_red_light", "lm_left_right", "tv_highway_exit",
                                  "lc_highway_change"])
def test_town_builder_on_the_scenarios_own_roads_reproduces_it(name):
    """Placed, traced along the town's waypoints (branches picked at the junction, the
    overtake traced backwards along the oncoming lane) and brought back, a scenario's
    lanes and agents come out where the plain builder puts them."""
    key = jax.random.fold_in(jax.random.key(1), 2)
    town = town_from_scenario(name, key, junction=LAYOUT[name] == "junction")
    trace = lambda pts: trace_lane(town, pts, location=F.Location)  # noqa: E731
    built = build_on_town(name, key, ANCHOR, trace, accident_prone=True)
    plain = S.build(name, key, accident_prone=True)
    valid = np.asarray(plain.valid)
    assert np.array_equal(np.asarray(built.valid), valid)
    # agents timed to a conflict point move by up to about one lane-point spacing (the
    # builders find conflict points among the 64 resampled points of each lane)
    for field, tol in (("x", 1.5), ("y", 1.5), ("route_length", 2.5), ("speed", 1e-6)):
        np.testing.assert_allclose(np.asarray(getattr(built, field))[valid], np.asarray(getattr(plain, field))[valid],
                                   atol=tol, err_msg=field)
    np.testing.assert_allclose(np.cos(np.asarray(built.heading) - np.asarray(plain.heading))[valid], 1.0, atol=1e-3)
    for k in np.flatnonzero(np.asarray(plain.lanes.valid)):
        ref = polyline_table(np.asarray(plain.lanes.points[k], np.float64))
        pts = np.asarray(built.lanes.points[k], np.float64)
        off_path = float(np.abs(np.asarray(project_on_table(ref, pts).lateral)).max())
        assert off_path < 0.3, off_path  # the same path, up to the chords of 2 m steps in the turns
        assert float(polyline_table(pts).seg_len.sum()) == pytest.approx(float(ref.seg_len.sum()), abs=2.0)


def test_town_builder_rejects_a_town_without_the_road():
    key = jax.random.key(0)
    town = town_from_scenario("tv_highway_exit", key)  # a highway: no junction, no two-way road
    with pytest.raises(SiteMismatch, match="from the nearest town lane|ends after"):
        build_on_town("tv_red_light", key, ANCHOR, lambda pts: trace_lane(town, pts, location=F.Location))


def _intersection_town(anchor: Anchor) -> F.Town:
    lanes = [dict(points=to_carla(anchor, layouts.intersection_path(a, t)), width=3.5, lane_id=-1, left=None, right=None)
             for a in "WSEN" for t in ("straight", "left", "right")]
    return F.Town(anchor.town, lanes, (to_carla(anchor, np.zeros(2)), layouts.STOP))


def test_find_anchor_on_fake_towns():
    junction = find_anchor(_intersection_town(ANCHOR), Site("FakeTown", "junction"), location=F.Location)
    assert (junction.x, junction.y) == pytest.approx((ANCHOR.x, ANCHOR.y), abs=1e-6)
    assert np.cos(np.radians(4 * (junction.yaw - ANCHOR.yaw))) == pytest.approx(1.0)  # one of the four approaches
    # a highway: two same-direction lanes; the anchor is on the right-most, along it
    hw = [dict(points=to_carla(ANCHOR, np.array([[-100.0, y], [100.0, y]])), width=3.5, lane_id=-1, left=None,
               right=None) for y in (0.0, 3.5)]
    hw[0]["left"], hw[1]["right"] = 1, 0
    hwa = find_anchor(F.Town("FakeTown", hw), Site("FakeTown", "highway", near=tuple(to_carla(ANCHOR, [5.0, 3.0]))),
                      location=F.Location)
    np.testing.assert_allclose(to_local(ANCHOR, [hwa.x, hwa.y]), [5.0, 0.0], atol=1e-6)
    assert hwa.yaw == pytest.approx(ANCHOR.yaw)
    # a two-way road: the origin on the centre line
    tw = [dict(points=to_carla(ANCHOR, np.array([[-100.0, -1.75], [100.0, -1.75]])), width=3.5, lane_id=-1, left=1,
               right=None),
          dict(points=to_carla(ANCHOR, np.array([[100.0, 1.75], [-100.0, 1.75]])), width=3.5, lane_id=1, left=0,
               right=None)]
    twa = find_anchor(F.Town("FakeTown", tw), Site("FakeTown", "two_way", near=tuple(to_carla(ANCHOR, [0.0, -2.0]))),
                      location=F.Location)
    np.testing.assert_allclose(to_local(ANCHOR, [twa.x, twa.y]), [0.0, 0.0], atol=1e-6)
    with pytest.raises(SiteMismatch):
        find_anchor(F.Town("FakeTown", hw), Site("FakeTown", "two_way", near=(ANCHOR.x, ANCHOR.y)), location=F.Location)
    with pytest.raises(SiteMismatch):
        find_anchor(F.Town("FakeTown", tw), Site("FakeTown", "junction"), location=F.Location)


def test_every_scenario_has_a_site_on_towns_05_06_07():
    assert set(LAYOUT) == set(S.SCENARIOS)
    assert {SITES[k].town for k in LAYOUT.values()} == {"Town05", "Town06", "Town07"}
    assert site_of("tv_red_light").town == "Town05" and site_of("lm_highway_merge").town == "Town06"
    assert site_of("ic_opposite_lane").town == "Town07"
    with pytest.raises(ValueError):
        site_of("no_such")


# ------------------------------------------------------------------------------- spawn
def test_spawn_plan_drivers_blueprints_and_velocities():
    key = jax.random.key(5)
    sc = S.build("tv_overtake_perception", key, accident_prone=True, background=True)
    plan = spawn_plan(sc, ANCHOR)
    valid = np.flatnonzero(np.asarray(sc.valid))
    assert [p.slot for p in plan] == list(valid)
    by_vid = {p.vehicle_id: p for p in plan}
    ego, truck, oncoming = by_vid[197], by_vid[199], by_vid[198]
    assert (ego.driver, ego.role_name, ego.blueprint) == ("policy", "hero", CAR_BLUEPRINT)
    assert (truck.driver, truck.blueprint, truck.velocity) == ("parked", TRUCK_BLUEPRINT, (0.0, 0.0))
    assert oncoming.driver == "traffic_manager" and len(oncoming.path) > 10
    i = oncoming.slot
    speed = float(sc.speed[i])
    assert np.hypot(*oncoming.velocity) == pytest.approx(speed, rel=1e-6)
    # the velocity points along its CARLA yaw; its path runs ahead of it along its lane
    assert np.degrees(np.arctan2(oncoming.velocity[1], oncoming.velocity[0])) == pytest.approx(
        wrap_degrees(oncoming.yaw), abs=1e-4)
    first = oncoming.path[0] - [oncoming.x, oncoming.y]
    assert np.dot(first, oncoming.velocity) > 0
    assert ego.z == pytest.approx(ANCHOR.z + 0.5)
    assert all(p.obeys_lights for p in plan)


def test_pedals_recover_the_controller_output():
    cfg = SimConfig()
    speed = np.array([0.0, 5.0, 9.0, 3.0])
    throttle = np.array([0.75, 0.3, 0.0, 0.1])
    brake = np.array([False, False, True, False])
    accel = np.where(brake, -cfg.brake_decel, throttle / 0.75 * cfg.throttle_accel) - cfg.drag * speed
    t, b, s = pedals(cfg, accel, speed, np.array([0.3, -2.0, 0.0, -0.5]))
    np.testing.assert_allclose(t, np.where(brake, 0.0, throttle), atol=1e-12)
    np.testing.assert_array_equal(b, brake.astype(float))
    np.testing.assert_allclose(s, [0.3, -1.0, 0.0, -0.5])


# ---------------------------------------------------------------- episodes on the fake
def _fake_world(name, key):
    town = town_from_scenario(name, key, junction=LAYOUT[name] == "junction")
    server = F.Server({"FakeTown": town}, "FakeTown")
    carla = F.module(server)
    return server, CarlaWorld(carla.Client("localhost", 2000), carla, tm_port=8123)


@pytest.mark.parametrize("name,policy", [("tv_overtake_perception", "rule_based"),
                                         ("tv_overtake_negotiation", "rule_based"),
                                         ("tv_overtake_perception", "silent")])
def test_episodes_on_the_stand_in_server_match_the_jax_backend(name, policy):
    """Same controller, same bicycle physics: the CARLA backend (runner, mirror, events,
    sensors, messages, metrics) reproduces the JAX backend's outcomes and timings."""
    key = jax.random.fold_in(jax.random.key(0), 0)
    server, world = _fake_world(name, key)
    site = Site("FakeTown", LAYOUT[name], anchor=ANCHOR)
    pol = make_policy(policy)
    for accident_prone in (True, False):
        batch = CarlaEpisodeBatch(world, name, key, accident_prone, site=site)
        (got,), _ = run_episodes(None, (), accident_prone=None, policy=pol, batch=batch)
        (want,), _ = run_episodes(name, [key], accident_prone=[accident_prone], policy=pol)
        assert [(o.vehicle_id, o.outcome, o.collided_with) for o in got.outcomes] == [
            (o.vehicle_id, o.outcome, o.collided_with) for o in want.outcomes]
        assert [o.time for o in got.outcomes] == pytest.approx([o.time for o in want.outcomes], abs=0.051)
        assert [o.progress for o in got.outcomes] == pytest.approx([o.progress for o in want.outcomes], abs=0.5)
        assert got.end_time == pytest.approx(want.end_time, abs=0.051)
        assert got.metrics == pytest.approx(want.metrics)
        assert (got.messages_sent, got.bytes_sent) == (want.messages_sent, want.bytes_sent)
    # synchronous at 20 Hz with the Traffic Manager synchronous on its own port
    w = server.world
    assert w.settings.synchronous_mode and w.settings.fixed_delta_seconds == pytest.approx(0.05)
    assert server.tms[8123].sync and set(server.tms) == {8123}
    assert server.loads == 0  # the town was already loaded: never reloaded between episodes
    world.close()
    assert not w.settings.synchronous_mode and not server.tms[8123].sync
    assert not any(v.alive for v in w.vehicles.values()) and not w.sensors


def test_silent_accident_prone_collision_is_seen_by_the_sensors():
    name = "tv_overtake_perception"
    key = jax.random.fold_in(jax.random.key(0), 0)
    server, world = _fake_world(name, key)
    contacts = []
    pop = world.pop_collisions

    def spy():
        got = pop()
        contacts.extend(got)
        return got

    world.pop_collisions = spy
    batch = CarlaEpisodeBatch(world, name, key, True, site=Site("FakeTown", "two_way", anchor=ANCHOR))
    (res,), _ = run_episodes(None, (), accident_prone=None, policy=make_policy("silent"), batch=batch)
    assert [o.outcome for o in res.outcomes] == ["collision"]
    ego = res.outcomes[0].index
    assert any(slot == ego for slot, _ in contacts)


def test_pettingzoo_api_on_the_stand_in_server():
    from pettingzoo.test import parallel_api_test

    name = "tv_overtake_perception"
    server, world = _fake_world(name, jax.random.key(0))

    class Env(CarlaParallelEnv):  # the stand-in town is the scenario's own: pin the site
        def _new_batch(self, key, accident_prone):
            return CarlaEpisodeBatch(self.world, self.scenario, key, accident_prone,
                                     site=Site("FakeTown", "two_way", anchor=ANCHOR), cfg=self.cfg)

    env = Env(world, name, accident_prone=True)
    parallel_api_test(env, num_cycles=6)
    obs, infos = env.reset(seed=0)
    (agent,) = [a for a in env.agents if infos[a]["vehicle_id"] == 197]
    assert infos[agent]["caption"].startswith("You are Vehicle 197")
    env.close()
    world.close()


def test_runner_turns_a_lost_server_into_backend_failure(monkeypatch):
    from jax_drive.carla import sites

    name = "tv_overtake_perception"
    key = jax.random.fold_in(jax.random.key(0), 0)
    server = F.Server({"FakeTown": town_from_scenario(name, key)}, "FakeTown")
    monkeypatch.setitem(sites.SITES, "two_way", Site("FakeTown", "two_way", anchor=ANCHOR))
    runner = CarlaRunner(CarlaBackend(port=2000, tm_port=8000), connect_timeout_s=0.0, carla=F.module(server))
    spec = EpisodeSpec(name, 0, 0, True)
    decisions = []

    def crash_after_three(d):
        decisions.append(d)
        if d == 3:
            server.crash()

    with pytest.raises(BackendFailure, match="lost the server"):
        runner.run([spec], progress=crash_after_three)
    assert runner.world is None and decisions[-1] == 3
    with pytest.raises(BackendFailure, match="does not answer"):
        runner.run([spec])


# ------------------------------------------------------------------ a real CARLA server
def _live_server() -> tuple[str, int] | None:
    host, port = os.environ.get("CARLA_HOST"), os.environ.get("CARLA_PORT")
    if not host or not port:
        return None
    try:
        with socket.create_connection((host, int(port)), timeout=3):
            return host, int(port)
    except OSError:
        return None


LIVE = _live_server()
needs_server = pytest.mark.skipif(LIVE is None, reason="no CARLA server: set CARLA_HOST and CARLA_PORT to one that "
                                                       "answers (e.g. `jax-drive scale-out carla-pool --once`)")


@pytest.mark.server
@needs_server
@pytest.mark.parametrize("name", ["tv_red_light", "tv_highway_merge", "tv_overtake_perception"])
def test_live_one_episode_per_layout(name):
    import carla
    client = carla.Client(*LIVE)
    client.set_timeout(60.0)
    world = CarlaWorld(client, carla, tm_port=int(os.environ.get("CARLA_TM_PORT", "8000")))
    try:
        batch = CarlaEpisodeBatch(world, name, jax.random.key(0), True, max_time=10.0)
        (res,), _ = run_episodes(None, (), accident_prone=None, policy=make_policy("rule_based"), batch=batch)
        assert res.outcomes and res.end_time > 0 and set(res.metrics) >= {"CR", "SR", "TR"}
        assert world.world.get_settings().synchronous_mode
    finally:
        world.close()
    assert not client.get_world().get_settings().synchronous_mode


@pytest.mark.server
@needs_server
def test_live_pettingzoo_api():
    import carla
    from pettingzoo.test import parallel_api_test

    client = carla.Client(*LIVE)
    client.set_timeout(60.0)
    world = CarlaWorld(client, carla, tm_port=int(os.environ.get("CARLA_TM_PORT", "8000")))
    try:
        parallel_api_test(CarlaParallelEnv(world, "tv_overtake_perception"), num_cycles=4)
    finally:
        world.close()
