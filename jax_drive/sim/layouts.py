"""Building blocks of the scenario library: the :class:`Builder` that assembles lanes, lights
and agents into a :class:`~jax_drive.sim.state.Scenario`, the canonical layouts' geometry
(approach paths through the four-way intersection, conflict points, timing) and the agent
helpers every scenario uses. World frame, metres, right-hand traffic, lane width 3.5 m.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.geometry import point_at_arc, polyline_table, project_on_table
from jax_drive.sim import lanes as L
from jax_drive.sim.state import Behaviour, Lights, LaneGraph, Role, Scenario, SimConfig

LANE_W = 3.5
STOP = 8.0  # stop line distance from the intersection centre
TRUCK = (10.0, 2.6)
CAR = (4.6, 2.0)


@dataclasses.dataclass
class Agent:
    lane: int
    arc: float
    speed: float
    role: int = Role.BACKGROUND
    reward: bool = False
    behaviour: int = Behaviour.IDM
    cruise: float = 8.0
    obeys: bool = True
    transceiver: bool = False
    vid: int = 0
    size: tuple = CAR
    goal_lane: int | None = None
    goal_arc: float | None = None
    lc_arc: float = 0.0
    lc_end_arc: float = 1e4


class Builder:
    """Collects lanes, lights and agents in Python, then pads them into a Scenario."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.lanes: list[dict] = []
        self.lights: list[tuple] = []
        self.agents: list[Agent] = []

    # map -------------------------------------------------------------------------------
    def lane(self, pts, *, width=LANE_W, limit=10.0, light=-1, stop_xy=None, label=1, maneuver=0) -> int:
        pts = L.resample(pts, self.cfg.lane_points)
        table = polyline_table(pts)
        stop = self._arc(table, stop_xy) if stop_xy is not None else -1e4
        self.lanes.append(dict(points=pts, table=table, width=width, limit=limit, light=light, stop=stop,
                               label=label, maneuver=maneuver, left=-1, right=-1))
        return len(self.lanes) - 1

    def neighbours(self, lane: int, left: int | None = None, right: int | None = None) -> None:
        if left is not None:
            self.lanes[lane]["left"] = left
        if right is not None:
            self.lanes[lane]["right"] = right

    def light(self, green: float, yellow: float, red: float, offset: float = 0.0) -> int:
        self.lights.append((green, yellow, red, offset))
        return len(self.lights) - 1

    @staticmethod
    def _arc(table, xy) -> float:
        return float(project_on_table(table, np.asarray(xy, float), extrapolate=True).arc)

    def length(self, lane: int) -> float:
        return float(self.lanes[lane]["table"].length)

    def arc(self, lane: int, xy) -> float:
        """Arc length of the projection of ``xy`` on ``lane``."""
        return self._arc(self.lanes[lane]["table"], xy)

    def pose(self, lane: int, arc: float) -> tuple[float, float, float]:
        """Point (x, y) and heading at ``arc`` along ``lane``."""
        xy, heading = point_at_arc(self.lanes[lane]["table"], np.asarray(arc, float))
        return float(xy[0]), float(xy[1]), float(heading)

    # agents ----------------------------------------------------------------------------
    def add(self, agent: Agent) -> int:
        self.agents.append(agent)
        return len(self.agents) - 1

    def build(self, *, timeout: float, accident_prone: bool, scenario_id: int) -> Scenario:
        cfg = self.cfg
        nl, na, nk = len(self.lanes), len(self.agents), len(self.lights)
        if nl > cfg.max_lanes or na > cfg.max_agents or nk > cfg.max_lights:
            raise ValueError(f"scenario too large: {nl} lanes, {na} agents, {nk} lights for {cfg}")
        lp, la = cfg.max_lanes, cfg.max_agents
        pts = np.zeros((lp, cfg.lane_points, 2))
        pts[:] = np.linspace([1e4, 1e4], [1e4 + 1, 1e4], cfg.lane_points)  # far-away dummy paths
        f = lambda key, fill, n=lp: np.array([d[key] for d in self.lanes] + [fill] * (n - nl))  # noqa: E731
        for i, d in enumerate(self.lanes):
            pts[i] = d["points"]
        lanes = LaneGraph(
            points=jnp.asarray(pts, jnp.float32),
            valid=jnp.asarray(np.arange(lp) < nl),
            width=jnp.asarray(f("width", LANE_W), jnp.float32),
            left=jnp.asarray(f("left", -1), jnp.int32),
            right=jnp.asarray(f("right", -1), jnp.int32),
            speed_limit=jnp.asarray(f("limit", 10.0), jnp.float32),
            light=jnp.asarray(f("light", -1), jnp.int32),
            stop_arc=jnp.asarray(f("stop", -1e4), jnp.float32),
            label=jnp.asarray(f("label", 0), jnp.int32),
            maneuver=jnp.asarray(f("maneuver", 0), jnp.int32),
        )
        lt = np.zeros((cfg.max_lights, 4))
        lt[:, 0] = 1.0
        for i, v in enumerate(self.lights):
            lt[i] = v
        lights = Lights(
            green=jnp.asarray(lt[:, 0], jnp.float32),
            yellow=jnp.asarray(lt[:, 1], jnp.float32),
            red=jnp.asarray(lt[:, 2], jnp.float32),
            offset=jnp.asarray(lt[:, 3], jnp.float32),
            valid=jnp.asarray(np.arange(cfg.max_lights) < nk),
        )
        cols: dict[str, list] = {k: [] for k in (
            "x", "y", "heading", "speed", "length", "width", "lane", "goal_lane", "goal_arc", "route_length",
            "lc_arc", "lc_end_arc", "role", "reward", "behaviour", "cruise", "obeys", "trx", "vid", "kind")}
        for i, ag in enumerate(self.agents):
            x, y, h = self.pose(ag.lane, ag.arc)
            gl = ag.lane if ag.goal_lane is None else ag.goal_lane
            garc = self.length(gl) - 5.0 if ag.goal_arc is None else ag.goal_arc
            route = max(garc - (self.arc(gl, (x, y))), 1.0)
            vals = dict(x=x, y=y, heading=h, speed=ag.speed, length=ag.size[0], width=ag.size[1], lane=ag.lane,
                        goal_lane=gl, goal_arc=garc, route_length=route, lc_arc=ag.lc_arc, lc_end_arc=ag.lc_end_arc,
                        role=ag.role, reward=ag.reward, behaviour=ag.behaviour, cruise=ag.cruise, obeys=ag.obeys,
                        trx=ag.transceiver, vid=ag.vid or 100 + i, kind=int(ag.size[0] > 6.0))
            for k, v in vals.items():
                cols[k].append(v)
        pad = dict(x=1e4, y=-1e4, heading=0.0, speed=0.0, length=CAR[0], width=CAR[1], lane=0, goal_lane=0,
                   goal_arc=1e4, route_length=1.0, lc_arc=0.0, lc_end_arc=1e4, role=Role.BACKGROUND, reward=False,
                   behaviour=Behaviour.STOPPED, cruise=0.0, obeys=True, trx=False, vid=0, kind=0)
        arr = {}
        for k, v in cols.items():
            vals = v + [pad[k]] * (la - na)
            if k == "x":  # spread padding far apart so padded agents never interact
                vals = v + [1e4 + 50.0 * j for j in range(la - na)]
            arr[k] = np.asarray(vals)
        f32 = lambda k: jnp.asarray(arr[k], jnp.float32)  # noqa: E731
        i32 = lambda k: jnp.asarray(arr[k], jnp.int32)  # noqa: E731
        return Scenario(
            lanes=lanes, lights=lights, x=f32("x"), y=f32("y"), heading=f32("heading"), speed=f32("speed"),
            length=f32("length"), width=f32("width"), valid=jnp.asarray(np.arange(la) < na), lane=i32("lane"),
            goal_lane=i32("goal_lane"), goal_arc=f32("goal_arc"), route_length=f32("route_length"),
            lc_arc=f32("lc_arc"), lc_end_arc=f32("lc_end_arc"), role=i32("role"),
            reward=jnp.asarray(arr["reward"], bool), behaviour=i32("behaviour"), cruise_speed=f32("cruise"),
            obeys_lights=jnp.asarray(arr["obeys"], bool), transceiver=jnp.asarray(arr["trx"], bool),
            vehicle_id=i32("vid"), kind=i32("kind"), timeout=jnp.asarray(timeout, jnp.float32),
            accident_prone=jnp.asarray(accident_prone), scenario_id=jnp.asarray(scenario_id, jnp.int32),
        )


# ------------------------------------------------------------------------------ layouts
def rotation(theta: float) -> np.ndarray:
    c, s = np.cos(theta), np.sin(theta)
    return np.array([[c, -s], [s, c]])


APPROACH = {"W": 0.0, "S": np.pi / 2, "E": np.pi, "N": 1.5 * np.pi}  # rotation of the canonical frame


def intersection_path(approach: str, turn: str, offset: float = 1.75, out_offset: float = 1.75,
                      reach: float = 80.0, exit_len: float = 60.0) -> np.ndarray:
    """Path through the four-way intersection.

    Canonical frame: the vehicle comes from the west heading east in the lane ``offset``
    metres right of the centre line; ``turn`` in {'straight', 'left', 'right'}; the path
    is rotated so that the vehicle enters from ``approach`` (W, S, E, N).
    """
    p0 = np.array([-reach, -offset])
    ps = np.array([-STOP, -offset])
    if turn == "straight":
        body = L.straight(ps, [STOP, -offset], 8)
        end = L.straight([STOP, -offset], [STOP + exit_len, -offset], 8)
    elif turn == "left":
        body = L.bezier(ps, [out_offset, -offset], [out_offset, STOP], 20)
        end = L.straight([out_offset, STOP], [out_offset, STOP + exit_len], 8)
    elif turn == "right":
        body = L.bezier(ps, [-out_offset, -offset], [-out_offset, -STOP], 12)
        end = L.straight([-out_offset, -STOP], [-out_offset, -STOP - exit_len], 8)
    else:
        raise ValueError(turn)
    pts = L.join(L.straight(p0, ps, 8), body, end)
    return pts @ rotation(APPROACH[approach]).T


def conflict_arcs(b: Builder, la: int, lb: int) -> tuple[float, float]:
    """Arc lengths along lanes ``la`` and ``lb`` of their closest approach (conflict point)."""
    pa, pb = b.lanes[la]["points"], b.lanes[lb]["points"]
    d = np.linalg.norm(pa[:, None] - pb[None], axis=-1)
    i, j = np.unravel_index(np.argmin(d), d.shape)
    return b.arc(la, pa[i]), b.arc(lb, pb[j])


def timed_arc(conflict_arc: float, speed: float, t: float) -> float:
    """Start arc so that a vehicle at constant ``speed`` reaches ``conflict_arc`` at ``t``."""
    return conflict_arc - speed * t


def rng_from_key(key) -> np.random.Generator:
    return np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())


def start_offset(rng, accident_prone: bool, near: float = 0.25, far: tuple = (3.5, 5.0)) -> float:
    """Arrival-time offset of a potential collider: small when accident-prone, else large."""
    if accident_prone:
        return float(rng.uniform(-near, near))
    return float(rng.choice([-1.0, 1.0]) * rng.uniform(*far))


def focal_agent(lane, arc, speed, vid, *, reward=True, **kw) -> Agent:
    return Agent(lane=lane, arc=arc, speed=speed, role=Role.FOCAL, reward=reward, behaviour=Behaviour.POLICY,
                  cruise=kw.pop("cruise", speed), transceiver=True, vid=vid, **kw)


def add_followers(b: Builder, lane: int, arc: float, speed: float, n: int, rng, spacing=(16.0, 24.0)) -> None:
    """Background IDM vehicles queued behind ``arc`` on ``lane``."""
    for _ in range(n):
        arc -= float(rng.uniform(*spacing))
        if arc < 2.0:  # would start before the lane: no room for more
            break
        b.add(Agent(lane=lane, arc=arc, speed=speed, cruise=speed))
