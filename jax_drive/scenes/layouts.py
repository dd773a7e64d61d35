"""Road layouts of the scene generator: fixed-size tables of analytic paths, lanes, drivable
strips and traffic slots for the STRAIGHT / CURVE, INTERSECTION and MERGE scenes
(ego frame, the ego rear axle at the origin heading +x, right-hand traffic).

Every layout is a dict of the same keys and shapes (:func:`empty_layout`), so the generator
can build all of them and select one per scene under ``vmap``.
"""

from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp

from jax_drive.scenes import paths as P
from jax_drive.types import Command, PolygonType, VehicleParameters

BEHIND = 60.0  # every route path starts 60 m behind the ego: the ego sits at s = 60
MAX_PATHS = 8
MAX_LANES = 12
MAX_STRIPS = 6
EGO = VehicleParameters()


class UniformPool:
    """Hands out slices of one pre-drawn uniform vector (one threefry call per scene keeps
    the compiled program small); the order of draws is fixed at trace time."""

    def __init__(self, key: jax.Array, size: int = 192):
        self._u = jax.random.uniform(key, (size,), jnp.float32)
        self._i = 0

    def u(self, lo: float = 0.0, hi: float = 1.0, shape: tuple[int, ...] = ()) -> jax.Array:
        n = int(np.prod(shape, dtype=np.int64))
        if self._i + n > self._u.shape[0]:
            raise RuntimeError("generator: uniform pool exhausted; raise UniformPool size")
        out = self._u[self._i : self._i + n].reshape(shape)
        self._i += n
        return lo + (hi - lo) * out

    def randint(self, lo: int, hi, shape: tuple[int, ...] = ()) -> jax.Array:
        """Integers in [lo, hi) (hi may be traced)."""
        return jnp.minimum(jnp.floor(lo + (hi - lo) * self.u(0.0, 1.0, shape)), hi - 1).astype(jnp.int32)




def empty_layout():
    return dict(
        paths=jnp.zeros((MAX_PATHS, 7)).at[:, 4].set(100.0),
        # lanes: path, offset, width, kind, on_route, reversed, red, s_lo, s_hi, valid
        lanes=jnp.zeros((MAX_LANES, 10)),
        # strips: path, off_lo, off_hi, kind, s_lo, s_hi, valid
        strips=jnp.zeros((MAX_STRIPS, 7)),
        # traffic slots: path, offset, direction, s_lo, s_hi, v_lo, v_hi, present_prob
        traffic=jnp.zeros((4, 8)),
        route_len=jnp.float32(200.0),
        command=jnp.int32(Command.GO_STRAIGHT),
        stop_s=jnp.float32(1e6),  # route arc of the ego's stop line when the light is red
        ego_red=jnp.bool_(False),
        edge_lo=jnp.float32(-2.0),  # route-path offsets of the road edges near the ego
        edge_hi=jnp.float32(2.0),
        other_lane_offsets=jnp.zeros(4),  # same-direction/oncoming lane offsets for cones
        other_lane_valid=jnp.zeros(4, bool),
        static_s_max=jnp.float32(1e6),  # shoulder objects only before this route arc
    )


def lane_row(path_idx, offset, width, kind=0.0, on_route=False, reversed_=False, red=False, s_lo=0.0, s_hi=220.0, valid=True):
    vals = [path_idx, offset, width, kind, on_route, reversed_, red, s_lo, s_hi, valid]
    return jnp.stack([jnp.asarray(v, jnp.float32) for v in vals])


def road_layout(r: UniformPool, w: float, curve: jax.Array, hard_curve: jax.Array):
    """STRAIGHT (curve False) or CURVE road along the route path."""
    n = r.randint(1, 5)
    e = r.randint(0, 4) % n
    two_way = r.u() < 0.5
    sign = jnp.where(r.u() < 0.5, -1.0, 1.0)
    radius = jnp.where(hard_curve, r.u(35.0, 70.0), r.u(60.0, 250.0))
    angle = jnp.where(hard_curve, r.u(1.0, 1.5), r.u(0.2, 0.8))
    # keep the inner edge well away from the arc centre
    radius = jnp.maximum(radius, (n + 1.0) * w + 10.0)
    d_arc = jnp.where(hard_curve, r.u(0.0, 8.0), r.u(0.0, 40.0))
    angle = jnp.where(curve, sign * angle, 0.0)
    l1 = BEHIND + d_arc
    total = 230.0
    l2 = jnp.maximum(total - l1 - radius * jnp.abs(angle), 20.0)
    lay = empty_layout()
    paths = lay["paths"].at[0].set(P.path(-BEHIND, 0.0, 0.0, l1, radius, angle, l2))
    length = P.path_length(paths[0])
    j = jnp.arange(5)
    offsets = (j - e) * w
    is_lane = (j < n) | ((j == n) & two_way)
    rows = jax.vmap(
        lambda o, valid, rev, onr: lane_row(0, o, w, 0.0, onr, rev, False, 0.0, length, valid)
    )(offsets, is_lane, j == n, j == e)
    lanes = lay["lanes"].at[:5].set(rows)
    shoulder = r.u(0.3, 1.2)
    edge_lo = -(e + 0.5) * w - shoulder
    edge_hi = (n - e - 0.5 + two_way) * w + shoulder
    strips = lay["strips"].at[0].set(jnp.stack([0.0, edge_lo, edge_hi, PolygonType.ROADBLOCK, 0.0, length, 1.0]))
    # traffic slots pick other lanes (offsets relative to the ego lane)
    n_tot = n + two_way.astype(jnp.int32)
    picks = (e + 1 + r.randint(0, 8, (4,)) % jnp.maximum(n_tot - 1, 1)) % n_tot
    rev = picks == n
    slot = jnp.arange(4.0)
    s_lo = BEHIND - 40.0 + slot * 32.0
    traffic = jnp.stack(
        [
            jnp.zeros(4),
            (picks - e) * w,
            jnp.where(rev, -1.0, 1.0),
            s_lo,
            s_lo + 28.0,
            jnp.full(4, 0.5),
            jnp.full(4, 1.0),
            jnp.where(n_tot > 1, 1.0, 0.0) * jnp.ones(4),
        ],
        -1,
    )
    other = (picks - e) * w
    lay.update(
        paths=paths, lanes=lanes, strips=strips, traffic=traffic, route_len=length,
        edge_lo=edge_lo, edge_hi=edge_hi, other_lane_offsets=other, other_lane_valid=jnp.full(4, n_tot > 1),
    )
    return lay


def intersection_layout(r: UniformPool, w: float, hard_turn: jax.Array, ego_speed: jax.Array, ego_red_wanted):
    c = r.u(5.0, 9.0)
    H = w + c
    d = jnp.where(hard_turn, r.u(4.0, 12.0), r.u(10.0, 40.0))
    turn = jnp.where(hard_turn, r.randint(0, 2) * 2, r.randint(0, 3))
    # the hard case is a T-junction: no road straight ahead, so going straight leaves the road
    t_junction = hard_turn
    # turn: 0 left, 1 straight, 2 right (== Command values)
    arm = 60.0
    r_left, r_right = H + w / 2, H - w / 2
    radius = jnp.select([turn == 0, turn == 2], [r_left, r_right], 100.0)
    angle = jnp.select([turn == 0, turn == 2], [jnp.pi / 2, -jnp.pi / 2], 0.0)
    l2 = jnp.where(turn == 1, 2 * H + arm, arm)
    yc = w / 2  # road centre (divider) of the approach / ahead arms
    lay = empty_layout()
    paths = lay["paths"]
    paths = paths.at[0].set(P.path(-BEHIND, 0.0, 0.0, BEHIND + d, radius, angle, l2))  # route
    paths = paths.at[1].set(P.path(-BEHIND, yc, 0.0, BEHIND + d))  # approach arm
    paths = paths.at[2].set(P.path(d + 2 * H, yc, 0.0, arm))  # ahead arm
    paths = paths.at[3].set(P.path(d + H, yc + H, jnp.pi / 2, arm))  # left arm
    paths = paths.at[4].set(P.path(d + H, yc - H, -jnp.pi / 2, arm))  # right arm
    paths = paths.at[5].set(P.path(d, yc, 0.0, 2 * H))  # intersection square
    paths = paths.at[6].set(P.path(d + H - w / 2, yc + H + arm, -jnp.pi / 2, 2 * arm + 2 * H))  # from left, straight
    paths = paths.at[7].set(P.path(d + H + w / 2, yc - H - arm, jnp.pi / 2, 2 * arm + 2 * H))  # from right, straight
    # red light: the ego's only if it can stop comfortably, else the crossing traffic's
    gap0 = d - EGO.front_length
    can_stop = gap0 >= ego_speed**2 / (2 * 2.5) + 3.0
    ego_red = ego_red_wanted & can_stop
    a0 = BEHIND + d
    a1 = P.arc_range(paths[0])[1] + jnp.where(turn == 1, 2 * H, 0.0)
    route_len = P.path_length(paths[0])
    half = w / 2
    lanes = jnp.stack(
        [
            lane_row(1, -half, w, 0, True, False, False, 0.0, BEHIND + d),  # ego approach
            lane_row(1, half, w, 0, False, True, False, 0.0, BEHIND + d),  # oncoming, outgoing
            lane_row(0, 0.0, w, 1, True, False, ego_red, a0, a1),  # ego connector
            lane_row(2, -half, w, 0, turn == 1, False, False, 0.0, arm, ~t_junction),
            lane_row(2, half, w, 0, False, True, False, 0.0, arm, ~t_junction),
            lane_row(3, -half, w, 0, turn == 0, False, False, 0.0, arm),
            lane_row(3, half, w, 0, False, True, False, 0.0, arm),
            lane_row(4, -half, w, 0, turn == 2, False, False, 0.0, arm),
            lane_row(4, half, w, 0, False, True, False, 0.0, arm),
            lane_row(6, 0.0, w, 1, False, False, ~ego_red, arm, arm + 2 * H),  # crossing connectors
            lane_row(7, 0.0, w, 1, False, False, ~ego_red, arm, arm + 2 * H),
            lane_row(2, half, w, 1, False, True, ego_red, -2 * H, 0.0, ~t_junction),  # oncoming straight
        ]
    )
    strips = jnp.stack(
        [
            jnp.stack([1.0, -w - 1.0, w + 1.0, PolygonType.ROADBLOCK, 0.0, BEHIND + d, 1.0]),
            jnp.stack([2.0, -w - 1.0, w + 1.0, PolygonType.ROADBLOCK, 0.0, arm, ~t_junction]),
            jnp.stack([3.0, -w - 1.0, w + 1.0, PolygonType.ROADBLOCK, 0.0, arm, 1.0]),
            jnp.stack([4.0, -w - 1.0, w + 1.0, PolygonType.ROADBLOCK, 0.0, arm, 1.0]),
            jnp.stack([5.0, -H, H, PolygonType.INTERSECTION, 0.0, 2 * H, 1.0]),
            jnp.zeros(7),
        ]
    )
    # traffic: crossing from the left / right (queued when their light is red, else driving),
    # oncoming going away behind the ego, oncoming approaching from the ahead arm (far).
    moving = ego_red
    q0 = arm - 7.0  # queue position before the stop line of the crossing paths
    traffic = jnp.stack(
        [
            jnp.stack([6.0, 0.0, 1.0, jnp.where(moving, 10.0, q0 - 12.0), jnp.where(moving, arm + 20, q0), jnp.where(moving, 0.6, 0.0), jnp.where(moving, 0.9, 0.0), 0.9]),
            jnp.stack([7.0, 0.0, 1.0, jnp.where(moving, 10.0, q0 - 12.0), jnp.where(moving, arm + 20, q0), jnp.where(moving, 0.6, 0.0), jnp.where(moving, 0.9, 0.0), 0.9]),
            jnp.stack([1.0, half, -1.0, BEHIND - 30.0, BEHIND + d - 5.0, 0.5, 0.9, 0.8]),
            jnp.stack([2.0, half, -1.0, 35.0, arm, 0.3, 0.6, jnp.where(t_junction, 0.0, 0.6)]),
        ]
    )
    lay.update(
        paths=paths, lanes=jnp.concatenate([lanes, jnp.zeros((MAX_LANES - 12, 10))]), strips=strips,
        traffic=traffic, route_len=route_len, command=turn.astype(jnp.int32),
        stop_s=jnp.where(ego_red, a0, 1e6), ego_red=ego_red, edge_lo=jnp.float32(-half), edge_hi=jnp.float32(w + half),
        other_lane_offsets=jnp.full(4, w), other_lane_valid=jnp.zeros(4, bool), static_s_max=a0 - 3.0,
    )
    return lay


def merge_layout(r: UniformPool, w: float):
    theta = r.u(0.12, 0.3)
    radius = r.u(80.0, 160.0)
    d = r.u(10.0, 50.0)
    lay = empty_layout()
    route = P.path(-BEHIND, 0.0, 0.0, BEHIND + d, radius, -theta, 140.0)
    s_merge = P.arc_range(route)[1]
    pe = P.path_pose(route, s_merge[None])[0]
    back = 170.0
    main = P.path(pe[0] - back * jnp.cos(pe[2]), pe[1] - back * jnp.sin(pe[2]), pe[2], back + 140.0)
    paths = lay["paths"].at[0].set(route).at[1].set(main)
    main_len = back + 140.0
    lanes = lay["lanes"]
    lanes = lanes.at[0].set(lane_row(0, 0.0, w, 0, True, False, False, 0.0, s_merge))  # ramp
    lanes = lanes.at[1].set(lane_row(1, 0.0, w, 0, True, False, False, 0.0, main_len))  # main right
    lanes = lanes.at[2].set(lane_row(1, w, w, 0, False, False, False, 0.0, main_len))  # main left
    shoulder = r.u(0.3, 1.0)
    strips = lay["strips"]
    strips = strips.at[0].set(jnp.stack([0.0, -w / 2 - shoulder, w / 2 + shoulder, PolygonType.ROADBLOCK, 0.0, s_merge + 5.0, 1.0]))
    strips = strips.at[1].set(jnp.stack([1.0, -w / 2 - shoulder, 1.5 * w + shoulder, PolygonType.ROADBLOCK, 0.0, main_len, 1.0]))
    traffic = jnp.stack(
        [
            jnp.stack([1.0, w, 1.0, back - 60.0, back - 20.0, 0.8, 1.0, 0.8]),
            jnp.stack([1.0, w, 1.0, back + 10.0, back + 50.0, 0.8, 1.0, 0.8]),
            jnp.stack([1.0, 0.0, 1.0, back + 25.0, back + 60.0, 0.8, 1.0, 0.7]),
            jnp.stack([1.0, 0.0, 1.0, back - 120.0, back - 90.0, 0.7, 0.9, 0.5]),
        ]
    )
    lay.update(
        paths=paths, lanes=lanes, strips=strips, traffic=traffic, route_len=P.path_length(route),
        edge_lo=-w / 2 - shoulder, edge_hi=w / 2 + shoulder, static_s_max=s_merge - 40.0,
    )
    return lay
