"""Dynamic conflict grouping of CoLMDriver's negotiation module, pure JAX.

Every vehicle broadcasts its W planned waypoints (0.2 s apart). For two vehicles the
minimum distance over *time-aligned* waypoints d_min gives a safety score
``sigmoid(2 (d_min - 3))``; an edge joins two vehicles whose safety is below 0.75
(d_min < ~3.55 m). Groups are the connected components of that graph, merged with the
groups still held from earlier negotiations (the paper's Eq. 2-3: H^t = Phi(H^{t-1} u C^t),
Phi merging intersecting groups). A merged group negotiates when it contains a current
edge and none of its members negotiated less than ``cooldown`` seconds ago; the outcome
then holds until ``hold_after_conflict`` seconds after the group's predicted conflict
(the latest time of closest approach over its edges).

Connected components are a boolean matrix closure (ceil(log2 A) squarings of
``adjacency | I``) under jit, no Python graph search; the label of a group is its lowest
member index. :func:`group_step` works on one episode; :func:`batched_group_step` vmaps it
over episodes. The same array program runs on NumPy over a whole batch at once
(:func:`group_step_numpy`, the vectorised NumPy peer of the benchmark);
:func:`group_step_reference` is a brute-force version (per-episode Python loops, an explicit
depth-first search and set merging) kept as the reference for tests.

Ablation "negotiation without grouping": with ``GroupingConfig.radius`` set, edges join
every two live vehicles closer than ``radius`` metres now (the waypoints are then only
used for the conflict time).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.configs import above, at_least


@dataclasses.dataclass(frozen=True)
class GroupingConfig:
    """Grouping constants (CoLMDriver's; reference page).

    Attributes:
      safety_centre: metres; the safety score is 0.5 at this d_min.
      safety_slope: 1/m; steepness of the safety sigmoid.
      edge_threshold: an edge joins two vehicles whose safety score is below this.
      waypoint_dt: seconds between planned waypoints (waypoint k lies at (k + 1) dt).
      cooldown: seconds after a negotiation before any member negotiates again.
      hold_after_conflict: seconds the outcome holds after the predicted conflict.
      radius: None (conflict grouping) or metres (ablation: everyone this close talks).
    """

    safety_centre: float = 3.0
    safety_slope: float = 2.0
    edge_threshold: float = 0.75
    waypoint_dt: float = 0.2
    cooldown: float = 1.0
    hold_after_conflict: float = 1.0
    radius: float | None = None

    def __post_init__(self):
        if not 0.0 < self.edge_threshold < 1.0:
            raise ValueError(f"edge_threshold must be in (0, 1) (a sigmoid score), got {self.edge_threshold}")
        above(self, 0, "safety_slope", "waypoint_dt")
        at_least(self, 0, "cooldown", "hold_after_conflict")
        if self.radius is not None and self.radius <= 0:
            raise ValueError(f"radius must be None or > 0, got {self.radius}")


@chex.dataclass(frozen=True)
class GroupState:
    """Groups held from earlier negotiations (per vehicle slot).

    Fields (A slots, any leading batch dims):
      label: (..., A) int32 label of the held group (its lowest member index when it
        negotiated), -1 none.
      hold_until: (..., A) float32 time (s) until which that group's outcome holds.
      last_negotiation: (..., A) float32 time (s) of the vehicle's last negotiation, -inf none.
    """

    label: chex.Array
    hold_until: chex.Array
    last_negotiation: chex.Array

    @classmethod
    def empty(cls, shape: tuple[int, ...]) -> GroupState:
        """No held groups for slots of ``shape`` (..., A)."""
        return cls(label=jnp.full(shape, -1, jnp.int32), hold_until=jnp.full(shape, -jnp.inf, jnp.float32),
                   last_negotiation=jnp.full(shape, -jnp.inf, jnp.float32))

    def holding(self, t, xp=jnp) -> chex.Array:
        """(..., A) bool: the slot belongs to a group whose outcome still holds at ``t`` (() or
        (...,)); ``xp`` the array module of the fields (jax.numpy or numpy)."""
        return (self.label >= 0) & (xp.asarray(t, xp.float32)[..., None] <= self.hold_until)


@chex.dataclass(frozen=True)
class Grouping:
    """One grouping step (A slots, any leading batch dims).

    Fields:
      safety: (..., A, A) pairwise safety scores of the planned waypoints.
      conflict_time: (..., A, A) seconds from now to the pair's closest approach.
      edge: (..., A, A) bool current conflict edges (symmetric, no self edges).
      label: (..., A) int32 merged group label (lowest member index), -1 for slots not live.
      size: (..., A) int32 members of the slot's merged group (1 for a lone vehicle).
      negotiate: (..., A) bool the slot's group negotiates now.
      hold_until: (..., A) float32 when a group negotiating now stops holding its outcome.
    """

    safety: chex.Array
    conflict_time: chex.Array
    edge: chex.Array
    label: chex.Array
    size: chex.Array
    negotiate: chex.Array
    hold_until: chex.Array


def pairwise_min_distance(waypoints: chex.Array, xp=jnp) -> tuple[chex.Array, chex.Array]:
    """Closest approach of every pair over time-aligned waypoints.

    Args: waypoints (..., A, W, 2); xp the array module (jax.numpy or numpy).
    Returns: d_min (..., A, A) metres and its waypoint index (..., A, A) int32.
    """
    diff = waypoints[..., :, None, :, :] - waypoints[..., None, :, :, :]  # (..., A, A, W, 2)
    dist = xp.sqrt(xp.sum(diff * diff, axis=-1))
    return xp.min(dist, axis=-1), xp.argmin(dist, axis=-1).astype(xp.int32)


def safety_score(d_min: chex.Array, cfg: GroupingConfig = GroupingConfig(), xp=jnp) -> chex.Array:
    """sigmoid(slope (d_min - centre)), any shape (NumPy: as 0.5 (1 + tanh(x / 2)), no overflow)."""
    x = cfg.safety_slope * (d_min - cfg.safety_centre)
    return jax.nn.sigmoid(x) if xp is jnp else 0.5 * (1.0 + xp.tanh(0.5 * x))


def connected_components(adjacency: chex.Array, xp=jnp) -> chex.Array:
    """Reachability of a symmetric graph by boolean matrix squaring.

    Args: adjacency (..., A, A) bool, symmetric; xp the array module.
    Returns: (..., A, A) bool, True where two nodes are connected (every node reaches itself).
    """
    a = adjacency.shape[-1]
    reach = adjacency | xp.eye(a, dtype=bool)
    for _ in range(max(1, math.ceil(math.log2(max(a, 2))))):  # static: paths double each time
        r = reach.astype(xp.float32)
        reach = (r @ r) > 0.5
    return reach


def group_step(cfg: GroupingConfig, waypoints: chex.Array, position: chex.Array, live: chex.Array,
               state: GroupState, t: chex.Array) -> tuple[Grouping, GroupState]:
    """One grouping step of one episode.

    Args:
      waypoints: (A, W, 2) each slot's planned waypoints (world frame).
      position: (A, 2) current positions (used only with ``cfg.radius``).
      live: (A,) bool slots that take part (negotiating vehicles still driving).
      state: the held groups (:class:`GroupState`, (A,) fields).
      t: () time in seconds.
    Returns: the :class:`Grouping` and the next :class:`GroupState`.
    """
    return _group_step(jnp, cfg, waypoints, position, live, state, t)


def group_step_numpy(cfg: GroupingConfig, waypoints, position, live, state: GroupState,
                     t) -> tuple[Grouping, GroupState]:
    """:func:`group_step`'s array program in NumPy over a whole batch at once: waypoints
    (B, A, W, 2), position (B, A, 2), live (B, A), state with (B, A) NumPy fields (e.g.
    ``jax.tree.map(np.asarray, GroupState.empty((B, A)))``), t () or (B,); NumPy outputs."""
    return _group_step(np, cfg, np.asarray(waypoints, np.float32), np.asarray(position, np.float32),
                       np.asarray(live, bool), state, t)


def _group_step(xp, cfg: GroupingConfig, waypoints, position, live, state: GroupState,
                t) -> tuple[Grouping, GroupState]:
    """The grouping step on slots (..., A) with the array module ``xp``; t () or (...,)."""
    a = live.shape[-1]
    t = xp.asarray(t, xp.float32)[..., None]  # against the (..., A) slot fields
    not_self = ~xp.eye(a, dtype=bool)
    pair = live[..., :, None] & live[..., None, :] & not_self
    d_min, k_min = pairwise_min_distance(waypoints, xp)
    safety = safety_score(d_min, cfg, xp)
    conflict_time = (k_min + 1).astype(xp.float32) * cfg.waypoint_dt
    if cfg.radius is None:
        edge = pair & (safety < cfg.edge_threshold)
    else:
        gap = xp.linalg.norm(position[..., :, None, :] - position[..., None, :, :], axis=-1)
        edge = pair & (gap < cfg.radius)
    held = live & state.holding(t[..., 0], xp)
    same_held = (held[..., :, None] & held[..., None, :] & not_self
                 & (state.label[..., :, None] == state.label[..., None, :]))
    reach = connected_components(edge | same_held, xp) & live[..., :, None] & live[..., None, :]
    label = xp.where(live, xp.argmax(reach, axis=-1), -1).astype(xp.int32)
    size = xp.sum(reach, axis=-1).astype(xp.int32)
    has_edge = xp.any(edge, axis=-1)
    cooling = live & (t - state.last_negotiation < cfg.cooldown)
    group_has_edge = xp.any(reach & has_edge[..., None, :], axis=-1)
    group_cooling = xp.any(reach & cooling[..., None, :], axis=-1)
    negotiate = live & (size > 1) & group_has_edge & ~group_cooling
    own_conflict = xp.max(xp.where(edge, conflict_time, 0.0), axis=-1)
    group_conflict = xp.max(xp.where(reach, own_conflict[..., None, :], 0.0), axis=-1)
    hold_until = (t + group_conflict + cfg.hold_after_conflict).astype(xp.float32)
    grouping = Grouping(safety=safety, conflict_time=conflict_time, edge=edge, label=label, size=size,
                        negotiate=negotiate, hold_until=hold_until)
    new_state = GroupState(
        label=xp.where(negotiate, label, xp.where(held, state.label, -1)).astype(xp.int32),
        hold_until=xp.where(negotiate, hold_until, state.hold_until).astype(xp.float32),
        last_negotiation=xp.where(negotiate, t, state.last_negotiation).astype(xp.float32),
    )
    return grouping, new_state


@functools.partial(jax.jit, static_argnums=0)
def batched_group_step(cfg: GroupingConfig, waypoints: chex.Array, position: chex.Array, live: chex.Array,
                       state: GroupState, t: chex.Array) -> tuple[Grouping, GroupState]:
    """:func:`group_step` over episodes: waypoints (B, A, W, 2), position (B, A, 2), live
    (B, A), state with (B, A) fields, t () or (B,)."""
    b, a = live.shape
    if waypoints.ndim != 4 or waypoints.shape[:2] != (b, a) or waypoints.shape[-1] != 2 \
            or position.shape != (b, a, 2) or state.label.shape != (b, a):
        raise ValueError(f"shapes disagree: waypoints {waypoints.shape} (want ({b}, {a}, W, 2)), position "
                         f"{position.shape} (want ({b}, {a}, 2)), state {state.label.shape} (want ({b}, {a}))")
    t = jnp.broadcast_to(jnp.asarray(t, jnp.float32), (b,))
    return jax.vmap(group_step, in_axes=(None, 0, 0, 0, 0, 0))(cfg, waypoints, position, live, state, t)


# ----------------------------------------------------------------- NumPy reference
def group_step_reference(cfg: GroupingConfig, waypoints, position, live, state: dict, t: float):
    """Brute-force NumPy twin of :func:`group_step` for one episode (tests, benchmarks).

    Explicit loops: pairwise distances, a depth-first search over conflict edges (the
    paper's DFS), then repeated merging of intersecting sets (current groups and held
    groups) until none intersect. ``state`` is a dict of NumPy arrays with the
    :class:`GroupState` fields. Returns (dict of the :class:`Grouping` fields
    ``label``, ``size``, ``negotiate``, ``hold_until``, ``edge``; next state dict).
    """
    wp = np.asarray(waypoints, np.float64)
    pos = np.asarray(position, np.float64)
    live = np.asarray(live, bool)
    a = len(live)
    edge = np.zeros((a, a), bool)
    ctime = np.zeros((a, a))
    for i in range(a):
        for j in range(a):
            if i == j or not (live[i] and live[j]):
                continue
            dist = np.linalg.norm(wp[i] - wp[j], axis=-1)
            k = int(np.argmin(dist))
            ctime[i, j] = (k + 1) * cfg.waypoint_dt
            if cfg.radius is None:
                edge[i, j] = 1.0 / (1.0 + np.exp(-cfg.safety_slope * (dist[k] - cfg.safety_centre))) < cfg.edge_threshold
            else:
                edge[i, j] = np.linalg.norm(pos[i] - pos[j]) < cfg.radius
    # current groups: depth-first search over edges (groups of two or more)
    seen = np.zeros(a, bool)
    sets = []
    for i in range(a):
        if not live[i] or seen[i]:
            continue
        stack, comp = [i], set()
        while stack:
            v = stack.pop()
            if seen[v]:
                continue
            seen[v] = True
            comp.add(v)
            stack.extend(int(j) for j in np.flatnonzero(edge[v]) if not seen[j])
        if len(comp) > 1:
            sets.append(comp)
    held = live & (state["label"] >= 0) & (t <= state["hold_until"])
    for lab in sorted(set(int(x) for x in state["label"][held])):
        sets.append({int(i) for i in np.flatnonzero(held & (state["label"] == lab))})
    merged = True
    while merged:  # Phi: merge intersecting groups until they are disjoint
        merged = False
        for x in range(len(sets)):
            for y in range(x + 1, len(sets)):
                if sets[x] & sets[y]:
                    sets[x] |= sets.pop(y)
                    merged = True
                    break
            if merged:
                break
    label = np.where(live, np.arange(a), -1)
    size = live.astype(np.int64)
    negotiate = np.zeros(a, bool)
    hold = np.full(a, t + cfg.hold_after_conflict)
    for s in sets:
        members = sorted(s)
        conflict = max((ctime[i, j] for i in members for j in range(a) if edge[i, j]), default=0.0)
        go = (any(edge[i].any() for i in members)
              and not any(t - state["last_negotiation"][i] < cfg.cooldown for i in members))
        for i in members:
            label[i], size[i], negotiate[i] = members[0], len(members), go and len(members) > 1
            hold[i] = t + conflict + cfg.hold_after_conflict
    new_state = {
        "label": np.where(negotiate, label, np.where(held, state["label"], -1)),
        "hold_until": np.where(negotiate, hold, state["hold_until"]),
        "last_negotiation": np.where(negotiate, t, state["last_negotiation"]),
    }
    return {"label": label, "size": size, "negotiate": negotiate, "hold_until": hold, "edge": edge}, new_state
