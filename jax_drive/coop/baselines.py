"""Baseline policies (Python side, over NumPy views of one episode).

* :class:`SilentPolicy`: drives its task greedily with its own sensing only and sends
  no messages: GO at the task speed (lane following, car-following and red lights are
  handled by the low-level controller), a required lane change or an overtake as soon
  as the slot beside it is free *now*; no prediction, no yielding at conflicts.
* :class:`RuleBasedPolicy`: CoLMDriver's "Rule-based" comparison, made cooperative:
  every focal agent broadcasts its state, lane and what it sees; decisions yield by
  traffic rules over predicted conflicts with every vehicle it knows of (seen or
  reported): non-cooperative vehicles are always yielded to; lane changers and mergers
  yield to vehicles in the lane; straight goes before right before left turns; then
  who reaches the conflict first; ties by vehicle id. Lane changes and overtakes need an
  accepted gap over the manoeuvre time.

Both are :class:`~jax_drive.coop.policy.EpisodePolicy`: ``act`` returns per-agent
:class:`~jax_drive.sim.state.Cmd` codes and target speeds plus messages for one episode
(scripted agents ignore them), and ``decide`` serves the batched runner.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jax_drive.coop.messages import Message
from jax_drive.coop.policy import EpisodePolicy
from jax_drive.geometry import point_at_arc, project_on_table
from jax_drive.sim.state import Behaviour, Cmd, Role


def lane_projection(view: dict, lane: int, xy: np.ndarray):
    """Projection (:class:`~jax_drive.geometry.PolylineProjection`, float64) of points
    xy (..., 2) on lane path ``lane`` of a view, extrapolated past its ends."""
    return project_on_table(view["lane_table"].take(lane), xy, extrapolate=True)


@dataclasses.dataclass
class Known:
    """What an agent knows about another vehicle (seen now or reported)."""

    idx: int
    x: float
    y: float
    heading: float
    speed: float
    length: float
    width: float
    lane: int  # -1 when unknown (then predicted at constant velocity)
    cooperative: bool  # a focal agent that talks and follows the same rules
    maneuver: int  # 0 straight, 1 right, 2 left, 3 lane change / merge; -1 unknown
    vid: int
    age: float = 0.0


HORIZON = 5.0
DT_PRED = 0.25
CONFLICT_DIST = 3.5  # m between centres (CoLMDriver's safety edge: d_min < ~3.55 m)
TIME_MARGIN = 1.5  # s: positions this close in time count as simultaneous


class _Base(EpisodePolicy):
    name = "base"
    talks = False

    def __init__(self, horizon: float = HORIZON):
        self.horizon = horizon

    # --- helpers over a NumPy view ----------------------------------------------------
    @staticmethod
    def controlled(view: dict) -> np.ndarray:
        return np.nonzero(
            view["valid"] & (view["behaviour"] == Behaviour.POLICY) & ~view["done"] & (view["success_step"] < 0)
        )[0]

    def known(self, view: dict, i: int, inbox: list[Message]) -> dict[int, Known]:
        out: dict[int, Known] = {}
        for j in np.nonzero(view["visible"][i])[0]:
            out[int(j)] = self._from_view(view, int(j), lane_known=False)
        if self.talks:
            for m in inbox:
                if not m.data:
                    continue
                for rep in m.data.get("vehicles", []):
                    j = rep["idx"]
                    if j == i:
                        continue
                    age = view["t"] - m.time
                    k = Known(idx=j, x=rep["x"] + rep["speed"] * np.cos(rep["heading"]) * age,
                              y=rep["y"] + rep["speed"] * np.sin(rep["heading"]) * age, heading=rep["heading"],
                              speed=rep["speed"], length=rep["length"], width=rep["width"], lane=rep["lane"],
                              cooperative=rep["cooperative"], maneuver=rep["maneuver"], vid=rep["vid"], age=age)
                    if j not in out or rep["lane"] >= 0:
                        if j in out and rep["lane"] >= 0:  # prefer fresh sensing, keep the reported intent
                            k = dataclasses.replace(out[j], lane=rep["lane"], cooperative=rep["cooperative"],
                                                    maneuver=rep["maneuver"])
                        out[j] = k
        return out

    @staticmethod
    def _from_view(view, j, lane_known) -> Known:
        coop = bool(view["behaviour"][j] == Behaviour.POLICY and view["transceiver"][j])
        return Known(idx=j, x=float(view["x"][j]), y=float(view["y"][j]), heading=float(view["heading"][j]),
                     speed=float(view["speed"][j]), length=float(view["length"][j]), width=float(view["width"][j]),
                     lane=int(view["lane"][j]) if lane_known else -1, cooperative=False,
                     maneuver=-1, vid=int(view["vehicle_id"][j]))

    def in_lane(self, view, i, lane, others: dict[int, Known]):
        """Known vehicles on ``lane`` as (relative arc to i, speed along lane, Known)."""
        if not others:
            return []
        proj = lane_projection(view, lane, np.array([[k.x, k.y] for k in others.values()]))
        me = lane_projection(view, lane, np.array([view["x"][i], view["y"][i]])).arc
        out = []
        for k, a, la, h in zip(others.values(), proj.arc, proj.lateral, proj.heading):
            if abs(la) < 2.4:
                out.append((a - me, k.speed * np.cos(k.heading - h), k))
        return out

    def gap_ok(self, view, i, lane, others, horizon, plan_speed, strict: bool) -> bool:
        """Lane-change gap acceptance on ``lane``.

        strict=False (silent): only a vehicle right beside (centres within 2 m) blocks.
        strict=True (rule): no predicted overlap along the lane within ``horizon`` s with
        any known vehicle, at constant speeds (a vehicle ahead and slower, or behind and
        faster, must stay (l_i + l_j)/2 + 2 m + 0.5 s x closing speed away).
        """
        li = float(view["length"][i])
        for rel, u, k in self.in_lane(view, i, lane, others):
            need = (li + k.length) / 2 + 1.0
            if not strict:  # a glance to the side: only a vehicle right beside blocks
                if abs(rel) < 2.0:
                    return False
                continue
            need += 1.0
            ts = np.arange(0.0, horizon + 1e-9, DT_PRED)
            sep = rel + (u - plan_speed) * ts
            if np.any(np.abs(sep) < need + 0.5 * abs(u - plan_speed)):
                return False
        return True

    # --- task logic -----------------------------------------------------------------
    def blocker(self, view, i, others):
        """Stopped vehicle ahead in the current lane within 25 m: (rel arc, Known) or None."""
        lane = int(view["lane"][i])
        best = None
        for rel, u, k in self.in_lane(view, i, lane, others):
            if 0 < rel < 25.0 and k.speed < 0.5:
                if best is None or rel < best[0]:
                    best = (rel, k)
        return best

    def lane_plan(self, view, i, others, strict):
        """Returns (command or None, target lane or None, waiting flag)."""
        lane = int(view["lane"][i])
        goal = int(view["goal_lane"][i])
        arc = float(view["lane_arc"][i])
        v = float(view["speed"][i])
        cruise = float(view["cruise_speed"][i])
        left, right = int(view["lane_left"][lane]), int(view["lane_right"][lane])
        if lane != goal:
            if view["lane_label"][lane] < 0 and right >= 0:  # in the opposite lane: return once past
                target, cmd = right, Cmd.LANE_RIGHT
                passed = all(not (-(k.length + 6.0) < rel < 30.0 and k.speed < 0.5)
                             for rel, u, k in self.in_lane(view, i, target, others))
                if not passed:
                    return None, None, False
                horizon = 1.5
            elif goal in (left, right):  # a required change: merge, exit, lane drop, turn lane
                target, cmd = (left, Cmd.LANE_LEFT) if left == goal else (right, Cmd.LANE_RIGHT)
                if arc < float(view["lc_arc"][i]):
                    return None, None, False
                horizon = 3.0
            else:
                return None, None, False
            if self.gap_ok(view, i, target, others, horizon, max(v, 0.7 * cruise), strict):
                return cmd, target, False
            return None, target, True
        blk = self.blocker(view, i, others)
        if blk is not None and left >= 0:
            rel, k = blk
            plan = max(cruise, 5.0)
            horizon = (rel + k.length + 12.0) / plan + 2.0
            if self.gap_ok(view, i, left, others, horizon, plan, strict):
                return Cmd.LANE_LEFT, left, False
            return None, left, True
        return None, None, False


class SilentPolicy(_Base):
    """Greedy, silent drivers (see module doc)."""

    name = "silent"
    talks = False

    def act(self, view: dict, inboxes):
        a = len(view["x"])
        cmd = np.full(a, Cmd.KEEP, np.int32)
        speed = np.zeros(a, np.float32)
        for i in self.controlled(view):
            others = self.known(view, i, [])
            lc, target, waiting = self.lane_plan(view, i, others, strict=False)
            cmd[i] = lc if lc is not None else Cmd.GO
            speed[i] = view["cruise_speed"][i]
            if waiting and lc is None:
                cmd[i] = Cmd.GO
        return cmd, speed, []


class RuleBasedPolicy(_Base):
    """Cooperative rule-based drivers (see module doc)."""

    name = "rule_based"
    talks = True

    def message(self, view, i, others) -> Message | None:
        if not view["transceiver"][i]:
            return None
        vehicles = []

        def rep(j, lane, coop, man):
            vehicles.append(dict(idx=int(j), x=float(view["x"][j]), y=float(view["y"][j]),
                                 heading=float(view["heading"][j]), speed=float(view["speed"][j]),
                                 length=float(view["length"][j]), width=float(view["width"][j]), lane=int(lane),
                                 cooperative=coop, maneuver=int(man), vid=int(view["vehicle_id"][j])))

        me_coop = bool(view["behaviour"][i] == Behaviour.POLICY)
        lane = int(view["lane"][i])
        rep(i, lane if me_coop else -1, me_coop, view["lane_maneuver"][lane] if me_coop else -1)
        seen = []
        for j in np.nonzero(view["visible"][i])[0]:
            rep(j, -1, False, -1)
            seen.append(int(j))
        vid = int(view["vehicle_id"][i])
        v = float(view["speed"][i])
        if me_coop:
            intent = {0: "going straight", 1: "turning right", 2: "turning left", 3: "changing lanes"}[
                int(view["lane_maneuver"][lane])]
            text = f"Vehicle {vid}: {intent} at {v:.0f} m/s."
        else:
            text = f"Vehicle {vid}: stopped here."
        for j in seen[:3]:
            d = float(np.hypot(view["x"][j] - view["x"][i], view["y"][j] - view["y"][i]))
            state = "stopped" if view["speed"][j] < 0.5 else f"moving at {view['speed'][j]:.0f} m/s"
            text += f" I see Vehicle {int(view['vehicle_id'][j])} {d:.0f} m away, {state}."
        return Message(sender=int(i), sender_vid=vid, time=float(view["t"]), text=text,
                       data={"vehicles": vehicles})

    def predict(self, view, k: Known, speed: float | None = None) -> np.ndarray:
        """(T, 2) predicted centres over the horizon: along its lane when known, else
        straight at constant velocity."""
        ts = np.arange(0.0, self.horizon + 1e-9, DT_PRED)
        v = k.speed if speed is None else speed
        if k.lane >= 0:
            arc = lane_projection(view, k.lane, np.array([k.x, k.y])).arc
            return point_at_arc(view["lane_table"].take(k.lane), arc + v * ts)[0]
        return np.stack([k.x + v * np.cos(k.heading) * ts, k.y + v * np.sin(k.heading) * ts], -1)

    def yields_to(self, view, i, me: Known, k: Known, my_path, their_path) -> tuple[bool, float]:
        # distances between my position at t1 and theirs at t2 with |t1 - t2| <= TIME_MARGIN
        d = np.linalg.norm(my_path[:, None] - their_path[None], axis=-1)
        steps = np.arange(len(my_path))
        d = np.where(np.abs(steps[:, None] - steps[None]) * DT_PRED <= TIME_MARGIN, d, np.inf)
        t1, t2 = np.unravel_index(int(np.argmin(d)), d.shape)
        if d[t1, t2] >= CONFLICT_DIST:
            return False, np.inf
        t_idx = int(t1)
        t_c = t_idx * DT_PRED
        if not k.cooperative:
            return True, t_c
        if me.maneuver != k.maneuver and me.maneuver >= 0 and k.maneuver >= 0:
            return me.maneuver > k.maneuver, t_c
        # who reaches the conflict point first (along the predicted paths)
        p = my_path[t_idx]
        d_me = np.linalg.norm(my_path[0] - p)
        d_k = np.linalg.norm(their_path[0] - p)
        if abs(d_me - d_k) > 2.0:
            return d_me > d_k, t_c
        return me.vid > k.vid, t_c

    def act(self, view: dict, inboxes):
        a = len(view["x"])
        cmd = np.full(a, Cmd.KEEP, np.int32)
        speed = np.zeros(a, np.float32)
        messages = []
        talkers = np.nonzero(view["valid"] & view["transceiver"] & (view["success_step"] < 0) & (
            (view["role"] == Role.FOCAL)))[0]
        for i in talkers:
            msg = self.message(view, i, None)
            if msg is not None:
                messages.append(msg)
        for i in self.controlled(view):
            others = self.known(view, i, inboxes[i])
            cruise = float(view["cruise_speed"][i])
            lane = int(view["lane"][i])
            lc, target, waiting = self.lane_plan(view, i, others, strict=True)
            me = self._from_view(view, i, lane_known=True)
            me.cooperative, me.maneuver = True, int(view["lane_maneuver"][lane])
            if target is not None and int(view["lane_maneuver"][target]) == 3:
                me.maneuver = 3
            plan_v = max(float(view["speed"][i]), cruise)
            my_path = self.predict(view, me, plan_v)
            yield_now, t_min = False, np.inf
            for j, k in others.items():
                # same-lane traffic is handled by car following; parallel traffic by the gap logic
                proj = lane_projection(view, lane, np.array([k.x, k.y]))
                lat, along = abs(float(proj.lateral)), np.cos(k.heading - float(proj.heading)) > 0.8
                if along or (k.speed < 0.5 and lat > 1.5):
                    continue
                their_v = k.speed if not k.cooperative else max(k.speed, 3.0)
                y, t_c = self.yields_to(view, i, me, k, my_path, self.predict(view, k, their_v))
                if y:
                    yield_now, t_min = True, min(t_min, t_c)
            if yield_now:
                cmd[i] = Cmd.STOP if t_min < 4.5 or view["speed"][i] < 1.0 else Cmd.SLOW_DOWN
            elif lc is not None:
                cmd[i] = lc
            elif waiting:
                near_end = float(view["lane_arc"][i]) > float(view["lc_end_arc"][i]) - 15.0
                blocked = self.blocker(view, i, others) is not None
                cmd[i] = Cmd.STOP if (near_end or blocked) else Cmd.SLOW_DOWN
                if not (near_end or blocked) and view["speed"][i] < 0.5 * cruise:
                    cmd[i] = Cmd.GO
                    speed[i] = 0.5 * cruise
                    continue
            else:
                cmd[i] = Cmd.GO
            speed[i] = cruise
        return cmd, speed, messages


POLICIES = {"silent": SilentPolicy, "rule_based": RuleBasedPolicy}


def make_policy(name: str):
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
    return POLICIES[name]()
