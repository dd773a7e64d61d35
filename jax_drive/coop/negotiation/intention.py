"""Rule-based intention planner: a stand-in for CoLMDriver's VLM intention planner.

CoLMDriver's VLM (InternVL2-4B with LoRA) reads the front camera, the perception results
and the route command and outputs a navigation intention ('turn left at intersection',
..., 'right lane change') and a speed intention (STOP, SLOWER, KEEP, FASTER). We have no
camera and no VLM here: this module derives the same two intentions from the simulator
state with rules. It sees only what the ego senses (visible vehicles) and never
coordinates with other negotiating vehicles: conflicts between them are the negotiation
module's job.

Per ego (NumPy view of one episode):
  * navigation: the route's manoeuvre (straight / turn on crossing paths, lane following
    elsewhere), a lane change once the route requires it (past ``lc_arc``, with a free gap
    among non-negotiating vehicles; kept once started), an overtake through the left
    lane once close behind a stopped vehicle (same gap rule), back after passing it;
  * speed: towards min(cruise speed, 8 m/s, the bend speed of the path ahead); SLOWER / STOP to keep a safe gap behind the
    vehicle ahead on its path (Gipps-style safe speed of the simulator's controller) and
    to yield to non-negotiating vehicles whose predicted path conflicts (the rule-based
    baseline's prediction), STOP when a required lane change is about to run out of road.
  * ``cap``: the most a negotiated intention may ask for (the gap, bend and yield limits
    without the cruise target), so a negotiated FASTER never drives into a vehicle ahead
    or too fast into a turn;
  * ``stay``: a vehicle that a negotiation tells to yield (STOP / SLOWER) postpones a lane
    change it has not started (the negotiation is about speed; slowing down while cutting
    in would not yield).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jax_drive.coop.baselines import RuleBasedPolicy, lane_projection
from jax_drive.geometry import point_at_arc
from jax_drive.sim.actions import SPEED_CAP, NavIntent, SpeedIntent
from jax_drive.sim.state import Behaviour, Role, SimConfig

MANEUVER_NAV = {0: NavIntent.FOLLOW_LANE, 1: NavIntent.TURN_RIGHT, 2: NavIntent.TURN_LEFT, 3: NavIntent.FOLLOW_LANE}
SPEED_BAND = 0.5  # m/s dead band around the desired speed
COMMITTED_OFFSET = 0.7  # m from the lane centre: a started lane change is finished
OVERTAKE_ROOM = 6.0  # m of extra gap kept behind a stopped vehicle
TURN_ACCEL = 2.5  # m/s^2 of lateral acceleration allowed in turns
TURN_LOOKAHEAD = 20.0  # m of path ahead checked for curvature


@dataclasses.dataclass
class Intentions:
    """Per-slot intentions of one episode (A,) int: nav (:class:`NavIntent`), speed
    (:class:`SpeedIntent`) when driving alone, cap (highest speed intention a negotiated
    outcome may use), stay (the navigation intention of a vehicle told to yield: a lane
    change not yet started waits, i.e. the lane's own intention; else ``nav``); ``egos``
    the slots planned for."""

    nav: np.ndarray
    speed: np.ndarray
    cap: np.ndarray
    stay: np.ndarray
    egos: np.ndarray


def negotiating(view: dict) -> np.ndarray:
    """(A,) bool slots of negotiating vehicles still driving: focal, policy-driven,
    transceiver, not arrived or collided."""
    return (view["valid"] & (view["role"] == Role.FOCAL) & (view["behaviour"] == Behaviour.POLICY)
            & view["transceiver"] & ~view["done"] & (view["success_step"] < 0))


def crossing_lanes(static: dict, min_angle: float = 0.5, near: float = 2.0) -> np.ndarray:
    """(L,) bool lane paths that cross another lane at an angle (intersection paths)."""
    pts = static["lane_points"]
    valid = np.abs(pts).reshape(len(pts), -1).max(-1) < 5e3
    head = np.arctan2(np.gradient(pts[..., 1], axis=1), np.gradient(pts[..., 0], axis=1))
    out = np.zeros(len(pts), bool)
    for a in np.flatnonzero(valid):
        for b in np.flatnonzero(valid):
            if a == b:
                continue
            d = np.linalg.norm(pts[a][:, None] - pts[b][None], axis=-1)
            i, j = np.nonzero(d < near)
            dh = np.abs(np.angle(np.exp(1j * (head[a][i] - head[b][j]))))
            if np.any((dh > min_angle) & (dh < np.pi - min_angle)):
                out[a] = True
                break
    return out


def speed_intent(v: float, v_des: float) -> int:
    """Speed intention that moves speed ``v`` towards ``v_des`` (m/s)."""
    if v_des < SPEED_BAND:
        return int(SpeedIntent.STOP)
    if v > v_des + SPEED_BAND:
        return int(SpeedIntent.SLOWER)
    if v < v_des - SPEED_BAND:
        return int(SpeedIntent.FASTER)
    return int(SpeedIntent.KEEP)


def turn_speed(view: dict, lane: int, arc: float) -> float:
    """Highest speed (m/s) for the sharpest bend of path ``lane`` within
    :data:`TURN_LOOKAHEAD` metres after ``arc`` (lateral acceleration :data:`TURN_ACCEL`)."""
    s = arc + np.arange(0.0, TURN_LOOKAHEAD + 1e-9, 2.0)
    _, head = point_at_arc(view["lane_table"].take(lane), s)
    bend = np.abs(np.angle(np.exp(1j * np.diff(head)))) / 2.0  # rad per metre
    kappa = float(np.max(np.convolve(bend, np.ones(3) / 3, mode="valid"))) if len(bend) >= 3 else float(bend.max())
    return float(np.sqrt(TURN_ACCEL / max(kappa, 1e-6)))


def safe_speed(gap: float, lead_v: float, cfg: SimConfig) -> float:
    """The simulator controller's safe speed behind a leader (NumPy twin of
    :func:`jax_drive.sim.core.safe_speed` for one vehicle)."""
    b = cfg.follow_decel
    room = max(gap - cfg.follow_gap, 0.0)
    return max(float(np.sqrt(lead_v**2 + 2 * b * room)) - 0.5 * b, 0.0)


class RuleIntentionPlanner:
    """See the module docstring. ``plan(view, crossing)`` -> :class:`Intentions`."""

    def __init__(self, cfg: SimConfig = SimConfig()):
        self.cfg = cfg
        self.rules = RuleBasedPolicy()

    def _others(self, view, i):
        others = self.rules.known(view, i, [])
        for j, k in others.items():  # negotiating vehicles are left to the negotiation
            k.cooperative = bool((view["role"][j] == Role.FOCAL) & (view["behaviour"][j] == Behaviour.POLICY))
        return others

    def _blocking(self, view, i, lane, others, reach: float = 25.0) -> bool:
        """A stopped vehicle on ``lane`` beside ego ``i`` or ahead with a gap below
        ``reach`` metres (an overtake is needed)."""
        li = float(view["length"][i])
        return any(-(k.length + li) / 2 - 4.0 < rel < (k.length + li) / 2 + reach and k.speed < 0.5
                   and not k.cooperative for rel, u, k in self.rules.in_lane(view, i, lane, others))

    def _nav(self, view, i, lane, crossing, others) -> tuple[int, int, bool, int]:
        """(nav intention, reference lane, waiting for a lane-change gap, nav when yielding)."""
        goal = int(view["goal_lane"][i])
        left, right = int(view["lane_left"][lane]), int(view["lane_right"][lane])
        base = int(MANEUVER_NAV[int(view["lane_maneuver"][lane])])
        if base == NavIntent.FOLLOW_LANE and crossing[lane]:
            base = int(NavIntent.GO_STRAIGHT)
        lateral = float(lane_projection(view, lane, np.array([view["x"][i], view["y"][i]])).lateral)
        non_coop = {j: k for j, k in others.items() if not k.cooperative}
        plan_v = max(float(view["speed"][i]), min(float(view["cruise_speed"][i]), SPEED_CAP))
        for target, nav, side in ((left, NavIntent.LANE_LEFT, 1.0), (right, NavIntent.LANE_RIGHT, -1.0)):
            if target < 0:
                continue
            started = side * lateral > COMMITTED_OFFSET
            required = goal == target and float(view["lane_arc"][i]) >= float(view["lc_arc"][i])
            # overtake a stopped vehicle once close behind it (or while beside it)
            close = self.cfg.follow_gap + OVERTAKE_ROOM + 2.0
            overtake = (nav == NavIntent.LANE_LEFT and goal == lane
                        and self._blocking(view, i, lane, others, 25.0 if started else close))
            if started and (required or overtake or goal == target):
                return int(nav), target, False, int(nav)
            if required or overtake:
                if self.rules.gap_ok(view, i, target, non_coop, 3.0, plan_v, strict=True):
                    return int(nav), target, False, base
                return base, lane, required, base
        return base, lane, False, base

    def plan(self, view: dict, crossing: np.ndarray) -> Intentions:
        a = len(view["x"])
        nav = np.full(a, int(NavIntent.FOLLOW_LANE), np.int32)
        speed = np.full(a, int(SpeedIntent.KEEP), np.int32)
        cap = np.full(a, int(SpeedIntent.FASTER), np.int32)
        stay = nav.copy()
        egos = np.flatnonzero(negotiating(view))
        for i in map(int, egos):
            lane = int(view["lane"][i])
            others = self._others(view, i)
            nav[i], ref, waiting, stay[i] = self._nav(view, i, lane, crossing, others)
            v = float(view["speed"][i])
            li = float(view["length"][i])
            # gap to the vehicle ahead on the reference path (and on the current lane while changing)
            gap, lead_v = np.inf, 0.0
            changing = ref != lane
            for path in {lane, ref}:
                for rel, u, k in self.rules.in_lane(view, i, path, others):
                    g = rel - (li + k.length) / 2
                    if k.speed < 0.5 and not k.cooperative:
                        g -= OVERTAKE_ROOM  # stop well behind a stopped vehicle: room to pull out
                    passing = changing and path == lane and k.speed < 0.5 and not k.cooperative
                    if rel > 0 and g < gap and not passing:
                        gap, lead_v = g, max(u, 0.0)
            v_safe = safe_speed(gap, lead_v, self.cfg) if np.isfinite(gap) else np.inf
            ref_arc = float(lane_projection(view, ref, np.array([view["x"][i], view["y"][i]])).arc)
            limit = min(v_safe, turn_speed(view, ref, ref_arc))  # what the road and the gap allow
            speed[i] = speed_intent(v, min(float(view["cruise_speed"][i]), SPEED_CAP, limit))
            cap[i] = speed_intent(v, limit) if limit < SPEED_CAP else int(SpeedIntent.FASTER)
            # yield to non-negotiating vehicles crossing the predicted path (rule-based prediction)
            me = self.rules._from_view(view, i, lane_known=True)
            me.cooperative, me.maneuver = True, int(view["lane_maneuver"][ref])
            me.lane = ref
            my_path = self.rules.predict(view, me, max(v, min(float(view["cruise_speed"][i]), SPEED_CAP, limit)))
            for j, k in others.items():
                if k.cooperative or k.speed < 0.5:
                    continue
                proj = lane_projection(view, lane, np.array([k.x, k.y]))
                if np.cos(k.heading - float(proj.heading)) > 0.8 and abs(float(proj.lateral)) < 2.4:
                    continue  # same-direction traffic in my lane: the gap rule covers it
                must, t_c = self.rules.yields_to(view, i, me, k, my_path, self.rules.predict(view, k))
                if must:
                    limit = int(SpeedIntent.STOP) if (t_c < 4.5 or v < 1.0) else int(SpeedIntent.SLOWER)
                    speed[i], cap[i] = min(speed[i], limit), min(cap[i], limit)
            if waiting and float(view["lane_arc"][i]) > float(view["lc_end_arc"][i]) - 15.0:
                speed[i] = int(SpeedIntent.STOP)
        return Intentions(nav=nav, speed=speed, cap=cap, stay=stay, egos=egos)
