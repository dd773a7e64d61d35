"""Scenario library: the six TalkingVehicles scenarios and the ten InterDrive types as
data in the generic :class:`~jax_drive.sim.state.Scenario` representation.

Every builder is ``build(name, key, accident_prone=..., background=...)`` and returns a
padded, unbatched Scenario; randomness comes only from ``key`` (NumPy generator seeded
from the key's bits). Accident-prone configurations time the potential colliders so that
drivers who neither look nor talk (the silent baseline) meet them at the conflict point;
safe configurations shift them by several seconds (or let the runner obey its light).

Layouts (world frame, metres, right-hand traffic, lane width 3.5 m):
  * two-way road along x (overtakes, opposite lane);
  * four-way intersection at the origin (approach lanes 1.75 / 5.25 m right of the
    centre line, stop lines 8 m from the centre);
  * highway along x with an on-ramp, an off-ramp or three lanes.
"""

from __future__ import annotations

from jax_drive.names import INTERDRIVE_SCENARIOS, TALKING_VEHICLES_SCENARIOS
from jax_drive.sim import lanes as L
from jax_drive.sim.layouts import (
    Agent,
    Builder,
    LANE_W,
    STOP,
    TRUCK,
    add_followers,
    conflict_arcs,
    focal_agent,
    intersection_path,
    rng_from_key,
    start_offset,
    timed_arc,
)
from jax_drive.sim.state import Behaviour, Role, Scenario, SimConfig
from jax_drive.sim.variations import scale_world, variation_scale

TALKING_VEHICLES = TALKING_VEHICLES_SCENARIOS  # the names live in jax_drive.names (no JAX there)
INTERDRIVE = INTERDRIVE_SCENARIOS
SCENARIOS = TALKING_VEHICLES + INTERDRIVE


def family(name: str) -> str:
    """'talking_vehicles' or 'interdrive'."""
    if name in TALKING_VEHICLES:
        return "talking_vehicles"
    if name in INTERDRIVE:
        return "interdrive"
    raise ValueError(f"unknown scenario {name!r}; choose one of {', '.join(SCENARIOS)}")


# --------------------------------------------------------------------- two-way road
def _two_way(b: Builder) -> tuple[int, int, int]:
    eb = b.lane(L.straight([-40, -1.75], [200, -1.75]), label=1)
    opp = b.lane(L.straight([-40, 1.75], [200, 1.75]), label=-1, maneuver=3)
    wb = b.lane(L.straight([200, 1.75], [-40, 1.75]), label=1)
    b.neighbours(eb, left=opp)
    b.neighbours(opp, right=eb)
    return eb, opp, wb


def _overtake(b: Builder, rng, accident_prone: bool, negotiation: bool, background: bool, egos_vid=(197, 198, 199)):
    eb, opp, wb = _two_way(b)
    truck_x = 45.0 + rng.uniform(-3, 3)
    car_v = 7.0
    # car1 behind the truck, task: pass it and reach x = 120 in its own lane.
    b.add(focal_agent(eb, 40.0 + rng.uniform(-2, 2), car_v, egos_vid[0], cruise=8.0, goal_arc=b.arc(eb, (120, -1.75)),
                 lc_arc=0.0))
    truck = Agent(lane=eb, arc=b.arc(eb, (truck_x, -1.75)), speed=0.0, behaviour=Behaviour.STOPPED, size=TRUCK,
                   vid=egos_vid[2], cruise=0.0)
    if not negotiation:  # the stopped truck is focal (talks, not reward-eligible)
        truck.role, truck.transceiver = Role.FOCAL, True
    b.add(truck)
    # The overtaker pulls out ~1 s after stopping behind the truck and spends ~3 s beside it.
    t_meet = 6.5 + rng.uniform(-0.3, 0.3)
    v2 = 9.0 + rng.uniform(-0.5, 0.5)
    meet_arc = b.arc(wb, (truck_x, 1.75))
    if accident_prone:
        arc2 = timed_arc(meet_arc, v2, t_meet)
    else:
        arc2 = timed_arc(meet_arc, v2, float(rng.uniform(0.5, 1.5)))  # passes the truck early
    if negotiation:
        b.add(focal_agent(wb, arc2, v2, egos_vid[1], cruise=v2))
    else:
        b.add(Agent(lane=wb, arc=arc2, speed=v2, cruise=v2, role=Role.COLLIDER, vid=egos_vid[1]))
    if background:
        add_followers(b, wb, arc2, v2, 2, rng, spacing=(40.0, 60.0))
    return eb


def tv_overtake_perception(b, rng, accident_prone, background):
    _overtake(b, rng, accident_prone, negotiation=False, background=background)
    return 30.0


def tv_overtake_negotiation(b, rng, accident_prone, background):
    _overtake(b, rng, accident_prone, negotiation=True, background=background)
    return 30.0


def ic_opposite_lane(b, rng, accident_prone, background):
    _overtake(b, rng, accident_prone, negotiation=True, background=background, egos_vid=(301, 302, 303))
    return 40.0


# --------------------------------------------------------------------- intersection
def _truck_queue(b: Builder, lane: int, stop_xy: tuple[float, float], first_vid: int, count: int = 3):
    """``count`` trucks stopped and waiting behind the stop line at ``stop_xy`` on ``lane``;
    the first one talks (vids first_vid, first_vid + 1, ...)."""
    q0 = b.arc(lane, stop_xy) - TRUCK[0] / 2 - 1.0
    for k in range(count):
        b.add(Agent(lane=lane, arc=q0 - k * (TRUCK[0] + 2.0), speed=0.0, behaviour=Behaviour.STOPPED,
                     size=TRUCK, cruise=0.0, role=Role.FOCAL if k == 0 else Role.BACKGROUND, transceiver=k == 0,
                     vid=first_vid + k))


def tv_red_light(b, rng, accident_prone, background):
    ns = b.light(1e4, 0.0, 0.0)  # north-south green for the whole episode
    ew = b.light(0.0, 0.0, 1e4)  # east-west red
    stop_s = lambda off: (off, -STOP)  # noqa: E731
    car_lane = b.lane(intersection_path("S", "straight", 5.25, 5.25), light=ns, stop_xy=stop_s(5.25), label=2)
    queue_lane = b.lane(intersection_path("S", "left", 1.75, 1.75), light=ns, stop_xy=stop_s(1.75), label=1,
                        maneuver=2)
    runner_lane = b.lane(intersection_path("W", "straight", 1.75), light=ew, stop_xy=(-STOP, -1.75), label=1)
    b.neighbours(car_lane, left=queue_lane)
    b.neighbours(queue_lane, right=car_lane)
    v1 = 8.0
    start = b.arc(car_lane, (5.25, -45.0 + rng.uniform(-3, 3)))
    b.add(focal_agent(car_lane, start, v1, 109, cruise=v1))
    _truck_queue(b, queue_lane, (1.75, -STOP), first_vid=117)  # queued left-turners
    ca, cb = conflict_arcs(b, car_lane, runner_lane)
    t1 = (ca - start) / v1
    v2 = 10.0 + rng.uniform(-0.5, 0.5)
    arc2 = timed_arc(cb, v2, t1 + rng.uniform(-0.2, 0.2))
    b.add(Agent(lane=runner_lane, arc=arc2, speed=v2, cruise=v2, role=Role.COLLIDER, obeys=not accident_prone,
                 vid=110))
    if background:
        add_followers(b, car_lane, start, v1, 2, rng)
    return 25.0


def tv_left_turn(b, rng, accident_prone, background):
    car_lane = b.lane(intersection_path("S", "left", 1.75, 1.75), label=1, maneuver=2)
    truck_lane = b.lane(intersection_path("N", "left", 1.75, 1.75), label=1, maneuver=2)
    onc_lane = b.lane(intersection_path("N", "straight", 5.25, 5.25), label=2)
    v1 = 7.0
    start = b.arc(car_lane, (1.75, -35.0 + rng.uniform(-3, 3)))
    b.add(focal_agent(car_lane, start, v1, 109, cruise=v1))
    _truck_queue(b, truck_lane, (-1.75, STOP), first_vid=111)
    ca, cb = conflict_arcs(b, car_lane, onc_lane)
    t1 = (ca - start) / v1
    v2 = 9.5 + rng.uniform(-0.5, 0.5)
    arc2 = timed_arc(cb, v2, t1 + start_offset(rng, accident_prone, 0.25, (3.0, 4.0)))
    b.add(Agent(lane=onc_lane, arc=arc2, speed=v2, cruise=v2, role=Role.COLLIDER, vid=110))
    if background:
        add_followers(b, onc_lane, arc2, v2, 2, rng, spacing=(45.0, 60.0))
    return 25.0


def _crossing(b, rng, accident_prone, background, paths, vids, speeds=None, offsets=None, lead=0):
    """Egos on intersection ``paths`` [(approach, turn, offset, out_offset)], timed so that each
    reaches its conflict with ego ``lead`` at the same time (accident-prone) or not."""
    lanes = [b.lane(intersection_path(a, t, o, oo), maneuver={"straight": 0, "right": 1, "left": 2}[t])
             for a, t, o, oo in paths]
    speeds = speeds or [8.0 + rng.uniform(-0.5, 0.5) for _ in paths]
    base = b.arc(lanes[lead], b.lanes[lanes[lead]]["points"][0]) + 45.0 + rng.uniform(-3, 3)
    arcs = [0.0] * len(paths)
    arcs[lead] = base
    for k in range(len(paths)):
        if k == lead:
            continue
        ca, cb = conflict_arcs(b, lanes[lead], lanes[k])
        t = (ca - base) / speeds[lead]
        off = offsets[k] if offsets else start_offset(rng, accident_prone)
        arcs[k] = max(timed_arc(cb, speeds[k], t + off), 2.0)
    for k in range(len(paths)):
        b.add(focal_agent(lanes[k], arcs[k], speeds[k], vids[k], cruise=speeds[k]))
        if background:
            add_followers(b, lanes[k], arcs[k], speeds[k], 1, rng)
    return lanes


# Two-ego InterDrive crossings, 60 s each: the egos' (approach, turn, offset, out_offset).
CROSSINGS = {
    "ic_straight_straight": [("S", "straight", 1.75, 1.75), ("W", "straight", 1.75, 1.75)],
    "ic_straight_left": [("S", "straight", 1.75, 1.75), ("N", "left", 1.75, 1.75)],
    "lm_straight_right": [("N", "straight", 1.75, 1.75), ("W", "right", 1.75, 1.75)],
    "lm_left_right": [("S", "left", 1.75, 1.75), ("N", "right", 1.75, 1.75)],
}


def _two_ego_crossing(paths):
    def build(b, rng, accident_prone, background):
        _crossing(b, rng, accident_prone, background, paths, (201, 202))
        return 60.0

    return build


def ic_chaos(b, rng, accident_prone, background):
    # 6-8 egos, two waves over the four approaches. Accident-prone: each wave reaches the
    # centre together. Safe: one ego every CHAOS_GAP seconds (approach order S, W, N, E),
    # on approaches long enough that nobody's start has to be clipped.
    n = int(rng.integers(6, 9))
    approaches = ["S", "W", "N", "E"]
    v = 7.0
    t0 = 5.0
    paths, vids, offsets = [], [], []
    for k in range(n):
        ap = approaches[k % 4]
        turn = ["straight", "left", "right"][int(rng.integers(0, 3))] if k else "straight"
        paths.append((ap, turn, 1.75, 1.75))
        vids.append(201 + k)
        second = k >= 4  # second vehicle on an approach comes later
        if k == 0:
            offsets.append(0.0)
        elif accident_prone:
            offsets.append(float(rng.uniform(-0.4, 0.4)) + (2.5 if second else 0.0))
        else:
            offsets.append(CHAOS_GAP * k + float(rng.uniform(0.0, 0.3)))
    # background: one IDM car behind the last ego of each approach; safe: it continues the
    # one-every-CHAOS_GAP sequence after the egos
    bg = [k for k in range(n) if k + 4 >= n] if background else []
    bg_t = {k: CHAOS_GAP * (n + j) for j, k in enumerate(bg)}
    reach = 20.0 + v * (t0 + max(offsets + list(bg_t.values())))
    lanes = [b.lane(intersection_path(a, t, o, oo, reach=reach), maneuver={"straight": 0, "right": 1, "left": 2}[t])
             for a, t, o, oo in paths]
    for k in range(n):
        centre = b.arc(lanes[k], (0.0, 0.0)) if paths[k][1] == "straight" else b.arc(
            lanes[k], intersection_path(paths[k][0], "straight", 1.75)[8])
        arc = max(timed_arc(centre, v, t0 + offsets[k]), 2.0)
        b.add(focal_agent(lanes[k], arc, v, vids[k], cruise=v))
        if k in bg_t:
            if accident_prone:
                add_followers(b, lanes[k], arc, v, 1, rng)
            else:
                b.add(Agent(lane=lanes[k], arc=max(timed_arc(centre, v, t0 + bg_t[k]), 2.0), speed=v, cruise=v))
    return 70.0


CHAOS_GAP = 2.5  # s between consecutive egos at the centre in the safe chaos configuration


def lc_right_straight(b, rng, accident_prone, background):
    # A (left lane, wants to turn right) must move into the right lane where B goes straight.
    a_lane = b.lane(intersection_path("S", "straight", 1.75, 1.75), label=1)
    r_lane = b.lane(intersection_path("S", "right", 5.25, 1.75), label=2, maneuver=1)
    s_lane = b.lane(intersection_path("S", "straight", 5.25, 5.25), label=2)
    b.neighbours(a_lane, right=r_lane)
    b.neighbours(r_lane, left=a_lane)
    v = 8.0
    a0 = 20.0 + rng.uniform(-2, 2)
    lc = a0 + 12.0
    b.add(focal_agent(a_lane, a0, v, 201, cruise=v, goal_lane=r_lane, goal_arc=b.length(r_lane) - 10.0, lc_arc=lc,
                 lc_end_arc=b.arc(a_lane, (1.75, -STOP - 6.0))))
    # B (same speed) is beside A's rear when A cuts in (accident-prone: centres 2.5-3.5 m
    # apart, just outside a silent glance's 2 m but overlapping bodies), or 24-32 m ahead
    # or behind (safe)
    if accident_prone:
        rel = -float(rng.uniform(2.5, 3.5))
    else:
        rel = float(rng.choice([-1.0, 1.0]) * v * rng.uniform(3.0, 4.0))
    b.add(focal_agent(s_lane, max(a0 + rel, 1.0), v, 202, cruise=v))
    if background:
        add_followers(b, s_lane, b.agents[-1].arc, v, 1, rng)
    return 60.0


# --------------------------------------------------------------------------- highway
def _highway(b: Builder, n_lanes: int = 2, x0=-200.0, x1=300.0, limit=14.0) -> list[int]:
    ids = [b.lane(L.straight([x0, k * LANE_W], [x1, k * LANE_W]), label=k + 1, limit=limit) for k in range(n_lanes)]
    for k in range(n_lanes - 1):
        b.neighbours(ids[k], left=ids[k + 1])
        b.neighbours(ids[k + 1], right=ids[k])
    return ids


def _merge(b, rng, accident_prone, background, vids, n_highway_egos=1):
    hw = _highway(b, 2)
    ramp_pts = L.join(L.bezier([-150, -40], [-60, -LANE_W], [-20, -LANE_W], 16),
                      L.straight([-20, -LANE_W], [60, -LANE_W], 8), L.straight([60, -LANE_W], [75, -1.0], 3))
    ramp = b.lane(ramp_pts, maneuver=3, label=0, limit=14.0)
    b.neighbours(ramp, left=hw[0])
    v1 = 9.0
    a1 = b.arc(ramp, (-100.0 + rng.uniform(-4, 4), -20.0))
    lc = b.arc(ramp, (-15.0, -LANE_W))
    b.add(focal_agent(ramp, a1, v1, vids[0], cruise=v1, goal_lane=hw[0], goal_arc=b.arc(hw[0], (160.0, 0.0)), lc_arc=lc,
                 lc_end_arc=b.arc(ramp, (55.0, -LANE_W))))
    # the merger's lane change starts at lc (x = -15): the target-lane vehicle is then just
    # behind its shoulder (accident-prone) or well clear of it (safe)
    t_cut = (lc - a1) / v1
    merge_x = -15.0
    v2 = 11.0 + rng.uniform(-0.5, 0.5)
    for k in range(n_highway_egos):
        if accident_prone:
            x2 = merge_x - v2 * t_cut - rng.uniform(2.5, 4.5) - 12.0 * k
        else:
            x2 = merge_x - v2 * t_cut + rng.choice([-1, 1]) * rng.uniform(35.0, 45.0) - 12.0 * k
        b.add(focal_agent(hw[0], b.arc(hw[0], (x2, 0.0)), v2, vids[1 + k], cruise=v2,
                     goal_arc=b.arc(hw[0], (160.0, 0.0))))
    if background:
        add_followers(b, hw[0], b.agents[-1].arc, v2, 2, rng, spacing=(40.0, 55.0))
        base = b.arc(hw[1], (-60.0 + rng.uniform(-10, 10), LANE_W))
        b.add(Agent(lane=hw[1], arc=base, speed=12.0, cruise=12.0))
        add_followers(b, hw[1], base, 12.0, 2, rng, spacing=(30.0, 45.0))
    return hw, ramp


def tv_highway_merge(b, rng, accident_prone, background):
    _merge(b, rng, accident_prone, background, (120, 121))
    return 40.0


def lm_highway_merge(b, rng, accident_prone, background):
    _merge(b, rng, accident_prone, background, (201, 202, 203), n_highway_egos=2)
    return 60.0


def tv_highway_exit(b, rng, accident_prone, background):
    hw = _highway(b, 2)
    exit_pts = L.join(L.straight([-200, 0.0], [100, 0.0], 12), L.bezier([100, 0.0], [130, 0.0], [160, -20.0], 12),
                      L.straight([160, -20.0], [190, -40.0], 4))
    ex = b.lane(exit_pts, maneuver=3, label=1, limit=14.0)
    b.neighbours(hw[1], right=ex)
    b.neighbours(ex, left=hw[1])
    v1 = 11.0
    a1 = b.arc(hw[1], (-80.0 + rng.uniform(-4, 4), LANE_W))
    lc = b.arc(hw[1], (-40.0, LANE_W))
    b.add(focal_agent(hw[1], a1, v1, 120, cruise=v1, goal_lane=ex, goal_arc=b.length(ex) - 15.0, lc_arc=lc,
                 lc_end_arc=b.arc(hw[1], (95.0, LANE_W))))
    t_cut = (lc - a1) / v1 + 1.5
    cut_x = -40.0 + v1 * 1.5
    v2 = 11.0 + rng.uniform(-0.3, 0.3)
    if accident_prone:
        x2 = cut_x - v2 * t_cut + rng.uniform(-2.0, 2.0)
    else:
        x2 = cut_x - v2 * t_cut + rng.uniform(45.0, 60.0)
    # the flow in the right lane: car2 leads, background followers behind it
    b.add(focal_agent(hw[0], b.arc(hw[0], (x2, 0.0)), v2, 121, cruise=v2, goal_arc=b.arc(hw[0], (200.0, 0.0))))
    add_followers(b, hw[0], b.agents[-1].arc, v2, 3 if background else 1, rng, spacing=(14.0, 18.0))
    return 35.0


def lm_neighbour_lane(b, rng, accident_prone, background):
    hw = _highway(b, 2, limit=12.0)
    # the left lane ends at x = 60: A must merge right into B's lane.
    end = b.lane(L.straight([-200, LANE_W], [70, LANE_W]), maneuver=3, label=2)
    b.neighbours(end, right=hw[0])
    v = 9.0
    a0 = b.arc(end, (-60.0 + rng.uniform(-3, 3), LANE_W))
    lc = b.arc(end, (-30.0, LANE_W))
    b.add(focal_agent(end, a0, v, 201, cruise=v, goal_lane=hw[0], goal_arc=b.arc(hw[0], (150.0, 0.0)), lc_arc=lc,
                 lc_end_arc=b.arc(end, (55.0, LANE_W))))
    t_cut = (lc - a0) / v + 1.5
    v2 = 10.0
    cut_x = -30.0 + v * 1.5
    x2 = cut_x - v2 * t_cut - (rng.uniform(3.0, 6.0) if accident_prone else rng.choice([-1, 1]) * rng.uniform(35, 45))
    b.add(focal_agent(hw[0], b.arc(hw[0], (x2, 0.0)), v2, 202, cruise=v2, goal_arc=b.arc(hw[0], (150.0, 0.0))))
    if background:
        add_followers(b, hw[0], b.agents[-1].arc, v2, 2, rng, spacing=(35.0, 50.0))
    return 60.0


def lc_highway_change(b, rng, accident_prone, background):
    hw = _highway(b, 3)
    n = int(rng.integers(6, 9))
    v = 10.0
    # outer lanes move to the middle lane, the middle one moves out: conflicting changes.
    # Accident-prone: rows of three 30 m apart, neighbours in a row 2.5-3.5 m apart (bodies
    # overlap, yet outside a silent glance's 2 m); safe: one ego every 12 m.
    for k in range(n):
        row, lane = k // 3, k % 3
        if accident_prone:
            x = -100.0 - 30.0 * row + lane * float(rng.uniform(2.5, 3.5))
        else:
            x = -100.0 - 12.0 * k + float(rng.uniform(-1.0, 1.0))
        goal = 1 if lane != 1 else int(rng.choice([0, 2]))
        a0 = b.arc(hw[lane], (x, lane * LANE_W))
        b.add(focal_agent(hw[lane], a0, v, 201 + k, cruise=v, goal_lane=hw[goal],
                     goal_arc=b.arc(hw[goal], (150.0, goal * LANE_W)), lc_arc=a0 + 20.0,
                     lc_end_arc=b.arc(hw[lane], (120.0, 0.0))))
    if background:
        for lane in range(3):
            b.add(Agent(lane=hw[lane], arc=b.arc(hw[lane], (-20.0 + 10 * lane, lane * LANE_W)), speed=v, cruise=v))
    return 60.0


_BUILDERS = {name: _two_ego_crossing(CROSSINGS[name]) if name in CROSSINGS else globals()[name]
             for name in SCENARIOS}


def build(name: str, key, *, accident_prone: bool = True, background: bool = False,
          cfg: SimConfig = SimConfig(), builder: Builder | None = None, variation: str = "nominal") -> Scenario:
    """Builds one scenario (unbatched, padded to ``cfg`` sizes).

    Args:
      name: one of :data:`SCENARIOS`.
      key: jax PRNG key; all randomisation (positions, speeds, counts) derives from it.
      accident_prone: timing that makes a collision likely without coordination.
      background: add background IDM traffic (InterDrive's "with background" setting).
      builder: an empty :class:`Builder` to build with (default ``Builder(cfg)``); a
        subclass may map the lane paths elsewhere (e.g. onto a CARLA town's lanes).
      variation: a held-out variation of :data:`jax_drive.sim.variations.VARIATIONS` (the
        same randomisation in a world scaled outside the training ranges).
    """
    family(name)
    scale = variation_scale(variation)
    rng = rng_from_key(key)
    b = Builder(cfg) if builder is None else builder
    timeout = _BUILDERS[name](b, rng, bool(accident_prone), bool(background))
    built = b.build(timeout=timeout, accident_prone=bool(accident_prone), scenario_id=SCENARIOS.index(name))
    return scale_world(built, scale)

