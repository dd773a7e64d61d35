"""Batched PDM score: PDMS (NAVSIM v1.1) and EPDMS (NAVSIM v2) in one jitted call.

Entry points: :func:`score_proposals` (each proposal scored as a (PDM-Closed reference,
proposal) pair, as NAVSIM's ``pdm_score``) and :func:`score_candidates` (EP normalised
over the whole candidate set, as PDM-Closed does internally).

Stages: interpolation -> tracking simulation -> :func:`jax_drive.pdm.metrics.run_steps` ->
one named metric function each (:class:`~jax_drive.pdm.metrics.MetricResult`, value and
validity) collected in :class:`TrajectoryMetrics` -> EP normalisation -> :class:`PDMResult`.

Defined results for edge cases (metrics that are not valid report these defaults):
  * no valid agents: NC = TTC = 1 (nothing to hit);
  * fewer than 2 valid route points: raw progress 0, so EP = 1 unless NC * DAC == 0
    (the <= 5 m rule), lane keeping sees deviation 0 (LK = 1);
  * non-finite proposals (only reachable with ``check_finite=False``): every score 0,
    violations all False / -1, ``finite`` False; a non-finite reference counts as 0 progress;
  * EC (two-frame extended comfort) needs the previous frame's simulated states, which a
    single Scene does not carry: ``ec`` reads 1 and EPDMS leaves it out of the weighted
    average (``PDMConfig.ec_without_previous``, NAVSIM v2); :func:`with_extended_comfort`
    puts a two-frame EC (:func:`jax_drive.pdm.comfort.two_frame_extended_comfort`) in;
  * HC (history comfort) uses the logged history poses and accelerations, the past states'
    yaw rates / accelerations as ``PDMConfig.hc_history_dynamics`` says; HC = 1 for a scene
    without a logged history (``EgoState.history_valid`` False);
  * NAVSIM v2 conventions (``PDMConfig(navsim_version="2")``): objects overlapping the ego
    at t = 0 are dropped, and the human penalty filter scores the scene's human trajectory
    in the same call (see :class:`PDMConfig`).
"""

from __future__ import annotations

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.compile_cache import ExecutableStore
from jax_drive.parallel import MeshConfig, call_on_rows, make_mesh
from jax_drive.pdm.config import PDMConfig
from jax_drive.pdm.interpolate import interpolate_poses, unwrap_angles
from jax_drive.pdm.metrics import (
    MetricResult,
    SceneArrays,
    StepResults,
    comfort,
    driving_direction_compliance,
    drivable_area_compliance,
    ego_progress,
    history_comfort,
    lane_keeping,
    no_at_fault_collisions,
    pose_windows,
    run_steps,
    scene_arrays,
    time_to_collision,
    traffic_light_compliance,
)
from jax_drive.pdm.polygons import MapBudget, map_budget
from jax_drive.pdm.tracker import EgoTrajectory, simulate_states
from jax_drive.types import NUM_OUTPUT_POSES, NUM_SCORE_STEPS, OUTPUT_DT, Scene, batch_shape


@chex.dataclass(frozen=True)
class Violations:
    """Where rules failed, per output pose k = 0..7 (pose k covers simulated steps
    5k+1 .. 5k+5; pose 0 also covers step 0). All (..., P, 8) unless noted.

    dac_point: bool, a footprint corner left the drivable area.
    nc_point: bool, an at-fault collision; nc_object int32 agent index (-1 none), the
      worst object at the first such step; nc_box (..., P, 8, 7) [x, y, z, length, width,
      height, heading] of that object at that step; nc_class int32 AgentType (-1 none).
    ttc_point, ttc_object, ttc_box, ttc_class: the same for TTC failures (box at the
      observation frame t + d that was hit).
    """

    dac_point: chex.Array
    nc_point: chex.Array
    nc_object: chex.Array
    nc_box: chex.Array
    nc_class: chex.Array
    ttc_point: chex.Array
    ttc_object: chex.Array
    ttc_box: chex.Array
    ttc_class: chex.Array


@chex.dataclass(frozen=True)
class PDMResult:
    """Scores, all (..., P) float32 unless noted.

    nc, dac, ddc, ttc (v1.1), ep (v1.1 rule), comfort (v1.1), pdms;
    tlc, lk, hc, ec, epdms (NAVSIM v2; EPDMS uses ddc_v2, ttc_v2 and ep_v2);
    ddc_v2: DDC with steps whose centre is in an intersection skipped (NAVSIM >= 2.1);
    ttc_v2 (steps t <= 31 only), ep_v2 (clip(raw / max masked, 0, 1));
    progress: raw route progress in metres; finite: bool, the proposal was finite;
    violations: :class:`Violations`.
    """

    nc: chex.Array
    dac: chex.Array
    ddc: chex.Array
    ddc_v2: chex.Array
    ttc: chex.Array
    ep: chex.Array
    comfort: chex.Array
    pdms: chex.Array
    tlc: chex.Array
    lk: chex.Array
    hc: chex.Array
    ec: chex.Array
    epdms: chex.Array
    ttc_v2: chex.Array
    ep_v2: chex.Array
    progress: chex.Array
    finite: chex.Array
    violations: Violations


def _history_states(scene, config: PDMConfig) -> dict:
    """Logged history (unbatched scene) as (H,) arrays for history comfort, and ``valid``."""
    n = config.hc_history_steps
    hp = jnp.asarray(scene.ego.history_poses, jnp.float32)
    acc = jnp.asarray(scene.ego.history_acceleration, jnp.float32)
    heading = unwrap_angles(hp[:, 2])
    if config.hc_history_dynamics == "navsim":  # NAVSIM's interpolated past states carry none
        yaw_rate = yaw_accel = jnp.zeros_like(heading)
    elif config.hc_history_dynamics == "logged":
        yaw_rate = jnp.asarray(scene.ego.history_yaw_rate, jnp.float32)
        yaw_accel = jnp.asarray(scene.ego.history_yaw_accel, jnp.float32)
    else:
        yaw_rate = jnp.gradient(heading, config.dt)
        yaw_accel = jnp.gradient(yaw_rate, config.dt)
    return {"ax": acc[:n, 0], "ay": acc[:n, 1], "heading": heading[:n],
            "yaw_rate": yaw_rate[:n], "yaw_accel": yaw_accel[:n],
            "valid": jnp.asarray(scene.ego.history_valid, bool)}


def _simulation_scene(scene, config: PDMConfig):
    """The scene whose t0 state starts the simulation: with "finite_difference" history
    dynamics the t0 yaw rate / acceleration are 0 instead of the logged ones."""
    if config.hc_history_dynamics != "finite_difference":
        return scene
    ego = scene.ego
    return scene.replace(ego=ego.replace(history_yaw_rate=jnp.zeros_like(ego.history_yaw_rate),
                                         history_yaw_accel=jnp.zeros_like(ego.history_yaw_accel)))


@chex.dataclass(frozen=True)
class TrajectoryMetrics:
    """Every metric of Q trajectories of one scene: :class:`MetricResult` fields (Q,) and
    the per-pose :class:`Violations` (Q, 8)."""

    nc: MetricResult
    dac: MetricResult
    ddc: MetricResult
    ddc_v2: MetricResult
    ttc: MetricResult
    ttc_v2: MetricResult
    tlc: MetricResult
    lk: MetricResult
    comfort: MetricResult
    hc: MetricResult
    ec: MetricResult
    progress: MetricResult
    violations: Violations


# What a metric reports where its MetricResult is not valid (see the module docstring).
_DEFAULTS = {"lk": 1.0, "ec": 1.0, "progress": 0.0}


def _value(m: TrajectoryMetrics, name: str) -> chex.Array:
    """The metric's value where valid, else its documented default."""
    r = getattr(m, name)
    return jnp.where(r.valid, r.value, _DEFAULTS.get(name, 0.0)).astype(jnp.float32)


def violations(steps: StepResults, scene) -> Violations:
    """Per output pose window: where DAC, NC and TTC failed and against which object."""
    win = jnp.asarray(pose_windows(steps.nc.shape[0], NUM_OUTPUT_POSES))  # (8, T)
    ag = scene.agents

    def details(flag, obj, frame):
        # flag (T, Q) bool, obj (T, Q) int32, frame (T, Q) int32 -> per-window results.
        fw = flag.T[:, None, :] & win[None]  # (Q, 8, T)
        point = jnp.any(fw, -1)
        first = jnp.argmax(fw, -1)  # (Q, 8)
        o = jnp.take_along_axis(obj.T, first, axis=-1)
        fr = jnp.take_along_axis(frame.T, first, axis=-1)
        o = jnp.where(point, o, -1)
        oi, fi = jnp.maximum(o, 0), jnp.maximum(fr, 0)
        g = lambda a: jnp.asarray(a, jnp.float32)[oi, fi]
        box = jnp.stack([g(ag.x), g(ag.y), g(ag.z), jnp.asarray(ag.length, jnp.float32)[oi],
                         jnp.asarray(ag.width, jnp.float32)[oi],
                         jnp.asarray(ag.height, jnp.float32)[oi], g(ag.heading)], -1)
        box = jnp.where(point[..., None], box, 0.0)
        cls = jnp.where(point, jnp.asarray(ag.agent_type, jnp.int32)[oi], -1)
        return point, o, box, cls

    step_idx = jnp.broadcast_to(jnp.arange(steps.nc.shape[0])[:, None], steps.nc.shape)
    nc_p, nc_o, nc_b, nc_c = details(steps.nc < 1.0, steps.nc_object, step_idx)
    tt_p, tt_o, tt_b, tt_c = details(steps.ttc_fail, steps.ttc_object, steps.ttc_frame)
    dac_point = jnp.any(steps.masks.non_drivable.T[:, None, :] & win[None], -1)
    return Violations(dac_point=dac_point, nc_point=nc_p, nc_object=nc_o, nc_box=nc_b,
                      nc_class=nc_c, ttc_point=tt_p, ttc_object=tt_o, ttc_box=tt_b, ttc_class=tt_c)


def trajectory_metrics(scene, sa: SceneArrays, hist: dict, traj: EgoTrajectory,
                       config: PDMConfig) -> TrajectoryMetrics:
    """All metrics for one scene and Q simulated trajectories (fields (Q, 41)).

    ``sa`` (:class:`SceneArrays`) and ``hist`` (:func:`_history_states`) are built once per
    scene by the caller, outside any chunk loop."""
    steps = run_steps(traj.x, traj.y, traj.heading, traj.speed, sa, config)
    signals = {"ax": traj.ax, "ay": traj.ay, "heading": traj.heading, "yaw_rate": traj.yaw_rate,
               "yaw_accel": traj.yaw_accel}
    nc = no_at_fault_collisions(steps)
    return TrajectoryMetrics(
        nc=nc,
        dac=drivable_area_compliance(steps),
        ddc=driving_direction_compliance(steps, config, skip_intersections=False),
        ddc_v2=driving_direction_compliance(steps, config, skip_intersections=True),
        ttc=time_to_collision(steps),
        ttc_v2=time_to_collision(steps, last_step=config.ttc_v2_last_step),
        tlc=traffic_light_compliance(steps),
        lk=lane_keeping(steps, sa, config),
        comfort=comfort(traj.ax, traj.ay, traj.heading, config),
        hc=history_comfort(signals, hist, config),
        # Two-frame extended comfort needs the previous frame's simulation (not in a Scene).
        ec=MetricResult(value=jnp.ones_like(nc.value), valid=jnp.zeros(nc.value.shape, bool)),
        progress=ego_progress(steps, sa),
        violations=violations(steps, scene))


def _simulated_metrics(scene, states: chex.Array, config: PDMConfig,
                       budget: MapBudget | None) -> TrajectoryMetrics:
    """Tracking simulation + :func:`trajectory_metrics` for states (Q, 41, 3) of one scene.

    With ``config.chunk_size > 0`` and Q above it, the trajectories go through both stages
    in equal chunks of at most ``chunk_size`` (``lax.map``): the per-step (Q, ...)
    intermediates then stay small. On the 2-core CPU, unchunked batches of 2,048+ needed
    temp buffers above glibc's 32 MB mmap ceiling, which were mapped and page-faulted
    afresh on every call.
    """
    sa = scene_arrays(scene, config, budget)
    hist = _history_states(scene, config)
    sim_scene = _simulation_scene(scene, config)

    def run(chunk_states):
        return trajectory_metrics(scene, sa, hist, simulate_states(sim_scene, chunk_states, config), config)

    q = states.shape[0]
    chunk = config.chunk_size
    if chunk <= 0 or q <= chunk:
        return run(states)
    # n equal chunks of at most chunk_size, padded by fewer than n rows: 1 + P = 2^k + 1 rows
    # (the reference first) would otherwise pad a whole extra chunk, and a separate pass for
    # the remainder would compile the metric program twice.
    n = -(-q // chunk)
    size = -(-q // n)
    padded = jnp.pad(states, ((0, n * size - q), (0, 0), (0, 0)), mode="edge")
    out = jax.lax.map(run, padded.reshape((n, size) + states.shape[1:]))
    return jax.tree_util.tree_map(lambda a: a.reshape((n * size,) + a.shape[2:])[:q], out)


def _masked_progress(m: TrajectoryMetrics, finite: chex.Array) -> tuple[chex.Array, chex.Array]:
    """Progress masked by the multipliers: v1.1 (NC * DAC) and v2 (NC * DAC * DDC * TLC);
    a non-finite trajectory counts 0. Both (Q,)."""
    mult = _value(m, "nc") * _value(m, "dac") * finite.astype(jnp.float32)
    progress = _value(m, "progress")
    return progress * mult, progress * mult * _value(m, "ddc_v2") * _value(m, "tlc")


def _ep_rules(m: TrajectoryMetrics, norm_v1: chex.Array, norm_v2: chex.Array, config: PDMConfig):
    """EP v1.1 and v2 from per-trajectory metrics and the normalisers (max masked progress)."""
    mult = _value(m, "nc") * _value(m, "dac")
    progress = _value(m, "progress")
    masked = progress * mult
    thr = config.progress_distance_threshold
    ep = jnp.where(norm_v1 > thr, masked / jnp.where(norm_v1 > thr, norm_v1, 1.0),
                   jnp.where(mult == 0.0, 0.0, 1.0))
    ep2 = jnp.where(norm_v2 > thr,
                    jnp.clip(progress / jnp.where(norm_v2 > thr, norm_v2, 1.0), 0.0, 1.0), 1.0)
    return ep, ep2


# Metrics the human penalty filter acts on. NAVSIM also lists EP and HC, but scored alone
# the human's progress normalises itself (EP 1) and it is scored without its past (HC 1).
HUMAN_FILTERED = ("nc", "dac", "ddc_v2", "tlc", "ttc_v2", "lk")


def _human_filter(v: dict, human: TrajectoryMetrics, expert_valid: chex.Array) -> dict:
    """NAVSIM v2's human penalty filter: a metric the human trajectory scores 0 on is 1."""
    out = dict(v)
    for name in HUMAN_FILTERED:
        out[name] = jnp.where(expert_valid & (_value(human, name) == 0.0), 1.0, v[name])
    return out


def epdms_from_parts(nc, dac, ddc_v2, tlc, ep_v2, ttc_v2, lk, hc, ec, config: PDMConfig, with_ec: bool):
    """EPDMS = NC * DAC * DDC * TLC * (5 EP + 5 TTC + 2 LK + 2 HC [+ 2 EC]) / (14 [+ 2]).

    ``with_ec`` False leaves EC out of the weighted average (NAVSIM v2 without a previous
    frame)."""
    num = config.weight_ep * ep_v2 + config.weight_ttc * ttc_v2 + config.weight_lk * lk + config.weight_hc * hc
    den = config.weight_ep + config.weight_ttc + config.weight_lk + config.weight_hc
    if with_ec:
        num, den = num + config.weight_ec * ec, den + config.weight_ec
    return nc * dac * ddc_v2 * tlc * num / den


def _aggregate(m: TrajectoryMetrics, ep, ep2, finite, config: PDMConfig,
               human: TrajectoryMetrics | None = None, expert_valid=None) -> PDMResult:
    """Combines metrics into PDMS / EPDMS (after the human penalty filter when ``human``,
    the human trajectory's metrics, is given); zeroes non-finite proposals."""
    v = {name: _value(m, name) for name in ("nc", "dac", "ddc", "ddc_v2", "ttc", "ttc_v2", "tlc", "lk",
                                            "comfort", "hc", "ec", "progress")}
    if human is not None:
        v = _human_filter(v, human, expert_valid)
    pdms = v["nc"] * v["dac"] * (config.weight_ttc * v["ttc"] + config.weight_ep * ep
                                 + config.weight_comfort * v["comfort"]) / (
        config.weight_ttc + config.weight_ep + config.weight_comfort)
    epdms = epdms_from_parts(v["nc"], v["dac"], v["ddc_v2"], v["tlc"], ep2, v["ttc_v2"], v["lk"], v["hc"], v["ec"],
                             config, with_ec=config.ec_without_previous == "one")
    z = lambda a: jnp.where(finite, a, jnp.zeros_like(a))
    viol = m.violations
    fb = finite[..., None]
    viol = Violations(
        dac_point=viol.dac_point & fb, nc_point=viol.nc_point & fb,
        nc_object=jnp.where(fb, viol.nc_object, -1), nc_box=jnp.where(fb[..., None], viol.nc_box, 0.0),
        nc_class=jnp.where(fb, viol.nc_class, -1), ttc_point=viol.ttc_point & fb,
        ttc_object=jnp.where(fb, viol.ttc_object, -1), ttc_box=jnp.where(fb[..., None], viol.ttc_box, 0.0),
        ttc_class=jnp.where(fb, viol.ttc_class, -1))
    return PDMResult(**{name: z(val) for name, val in v.items()}, ep=z(ep), ep_v2=z(ep2), pdms=z(pdms),
                     epdms=z(epdms), finite=finite, violations=viol)


def with_extended_comfort(result: PDMResult, ec, config: PDMConfig = PDMConfig()) -> PDMResult:
    """``result`` with a two-frame extended comfort ``ec`` (broadcastable to its fields, e.g.
    from :func:`jax_drive.pdm.comfort.two_frame_extended_comfort` on this frame's and the
    previous frame's simulated trajectories) and EPDMS over all five weights (/ 16), as
    NAVSIM v2 scores a frame that has a previous one."""
    ec = jnp.broadcast_to(jnp.asarray(ec, jnp.float32), jnp.shape(result.epdms))
    epdms = epdms_from_parts(result.nc, result.dac, result.ddc_v2, result.tlc, result.ep_v2, result.ttc_v2,
                             result.lk, result.hc, ec, config, with_ec=True)
    finite = jnp.asarray(result.finite, bool)
    return result.replace(ec=jnp.where(finite, ec, 0.0), epdms=jnp.where(finite, epdms, 0.0))


def _sanitize(states: chex.Array) -> tuple[chex.Array, chex.Array]:
    """(..., K, 3) -> (zeros where any entry is non-finite, (...) finite flag)."""
    finite = jnp.all(jnp.isfinite(states), axis=(-2, -1))
    return jnp.where(finite[..., None, None], states, 0.0), finite


def _pairs_single(scene, proposals, reference, config: PDMConfig, budget: MapBudget | None) -> PDMResult:
    """One scene: proposals (P, 8, 3) in 0.5 s steps, reference (40, 3) in 0.1 s steps; with
    the human penalty filter the scene's human trajectory is simulated and scored as a last row."""
    proposals, finite = _sanitize(jnp.asarray(proposals, jnp.float32))
    reference, ref_finite = _sanitize(jnp.asarray(reference, jnp.float32))
    p = proposals.shape[0]
    parts = [interpolate_poses(scene, reference[None], 0.1), interpolate_poses(scene, proposals, OUTPUT_DT)]
    if config.human_penalty_filter:
        parts.append(interpolate_poses(scene, jnp.asarray(scene.expert, jnp.float32)[None], OUTPUT_DT))
    m = _simulated_metrics(scene, jnp.concatenate(parts, axis=0), config, budget)  # (1 + P [+ 1], 41, 3)
    rows = lambda lo, hi: jax.tree_util.tree_map(lambda a: a[lo:hi], m)  # noqa: E731
    masked, masked2 = _masked_progress(rows(0, 1 + p), jnp.concatenate([ref_finite[None], finite]))
    props = rows(1, 1 + p)
    ep, ep2 = _ep_rules(props, jnp.maximum(masked[0], masked[1:]), jnp.maximum(masked2[0], masked2[1:]), config)
    human = jax.tree_util.tree_map(lambda a: a[-1], m) if config.human_penalty_filter else None
    return _aggregate(props, ep, ep2, finite, config, human, jnp.asarray(scene.expert_valid, bool))


def _candidates_single(scene, candidates, config: PDMConfig, budget: MapBudget | None) -> PDMResult:
    """One scene: candidates (P, 40, 3) at 0.1 s, EP normalised over the set."""
    candidates, finite = _sanitize(jnp.asarray(candidates, jnp.float32))
    states = interpolate_poses(scene, candidates, 0.1)
    m = _simulated_metrics(scene, states, config, budget)
    masked, masked2 = _masked_progress(m, finite)
    ep, ep2 = _ep_rules(m, jnp.max(masked), jnp.max(masked2), config)
    return _aggregate(m, ep, ep2, finite, config)


def _flatten_scene(scene: Scene):
    shape = batch_shape(scene)
    flat = jax.tree_util.tree_map(lambda a: jnp.reshape(a, (-1,) + a.shape[len(shape):]), scene)
    return flat, shape


@functools.partial(jax.jit, static_argnames=("config", "budget"))
def _score_proposals_jit(scene, proposals, reference, config: PDMConfig, budget: MapBudget | None) -> PDMResult:
    flat, shape = _flatten_scene(scene)
    props = proposals.reshape((-1,) + proposals.shape[len(shape):])
    ref = reference.reshape((-1,) + reference.shape[len(shape):])
    out = jax.vmap(lambda s, p, r: _pairs_single(s, p, r, config, budget))(flat, props, ref)
    return jax.tree_util.tree_map(lambda a: a.reshape(shape + a.shape[1:]), out)


@functools.partial(jax.jit, static_argnames=("config", "budget"))
def _score_candidates_jit(scene, candidates, config: PDMConfig, budget: MapBudget | None) -> PDMResult:
    flat, shape = _flatten_scene(scene)
    cands = candidates.reshape((-1,) + candidates.shape[len(shape):])
    out = jax.vmap(lambda s, c: _candidates_single(s, c, config, budget))(flat, cands)
    return jax.tree_util.tree_map(lambda a: a.reshape(shape + a.shape[1:]), out)


def _check(name: str, arr, lead: tuple[int, ...], tail: tuple[int | None, ...], finite: bool):
    """Boundary checks: shape (lead + tail; None = any size >= 1) and optional finiteness."""
    if not hasattr(arr, "shape"):
        arr = np.asarray(arr)
    shape = tuple(arr.shape)
    want = len(lead) + len(tail)
    ok = len(shape) == want and shape[: len(lead)] == lead and all(
        (w is None and s >= 1) or s == w for s, w in zip(shape[len(lead):], tail))
    if not ok:
        tail_s = ", ".join("P" if w is None else str(w) for w in tail)
        raise ValueError(f"{name} must have shape {lead + tuple()} + ({tail_s}) "
                         f"(scene batch dims first), got {shape}")
    if finite and not isinstance(arr, jax.core.Tracer):
        if not bool(np.all(np.isfinite(np.asarray(arr)))):
            raise ValueError(f"{name} contains NaN or inf values; pass finite poses or use "
                             "PDMConfig(check_finite=False) to score them as 0")
    return jnp.asarray(arr, jnp.float32)


def _check_scene(scene) -> tuple[int, ...]:
    if not isinstance(scene, Scene):
        raise TypeError(f"scene must be a jax_drive.types.Scene, got {type(scene).__name__}")
    shape = batch_shape(scene)
    n_steps = scene.agents.valid.shape[-1]
    if n_steps < 50:
        raise ValueError(f"scene agents need >= 50 observation frames (TTC looks 0.9 s past 4 s), "
                         f"got {n_steps}")
    return shape


def score_proposals(scene: Scene, proposals, reference, config: PDMConfig = PDMConfig(), *,
                    budget: MapBudget | None = None, mesh: MeshConfig | None = None,
                    executables: ExecutableStore | None = None) -> PDMResult:
    """Scores proposals against the PDM-Closed reference, one (reference, proposal) pair each.

    Args:
      scene: Scene with batch dims (...).
      proposals: (..., P, 8, 3) poses at 0.5 .. 4.0 s in the t0 rear-axle frame.
      reference: (..., 40, 3) PDM-Closed poses at 0.1 .. 4.0 s.
      config: PDMConfig (static).
      budget: a :class:`MapBudget` covering these scenes (e.g. the largest of several
        batches', :func:`jax_drive.pdm.polygons.merge_budgets`, so that they share one
        program); default: read off ``scene`` here.
      mesh: a ``jax_drive.parallel`` MeshConfig or Mesh: the scenes (first batch dim, at
        least one needed) are split over its devices, each scoring its own (default: one device).
      executables: a :class:`jax_drive.compile_cache.ExecutableStore`: the compiled scoring
        program is loaded from it (or compiled and stored there), skipping tracing in a
        warm process (one device only).
    Returns: PDMResult with fields (..., P). A proposal's scores do not depend on the other
      proposals in the batch.
    Raises: TypeError / ValueError on a wrong scene type, wrong shapes, or (with
      ``config.check_finite``) non-finite poses.
    """
    shape = _check_scene(scene)
    proposals = _check("proposals", proposals, shape, (None, NUM_OUTPUT_POSES, 3), config.check_finite)
    reference = _check("reference", reference, shape, (NUM_SCORE_STEPS - 1, 3), config.check_finite)
    # check_finite only acts here: normalise it so both settings share one compilation.
    config = dataclasses.replace(config, check_finite=True)
    if budget is None:
        budget = map_budget(scene, num_trajectories=proposals.shape[-3] + 1 + int(config.human_penalty_filter))
    mesh = _scene_mesh(mesh, shape)
    if executables is not None and mesh is None:
        args = (scene, proposals, reference)
        fn = executables.get("score_proposals", _score_proposals_jit, args, {"config": config, "budget": budget})
        return fn(*args)
    return call_on_rows(lambda s, p, r: _score_proposals_jit(s, p, r, config, budget),
                        (scene, proposals, reference), mesh)


def score_candidates(scene: Scene, candidates, config: PDMConfig = PDMConfig(), *,
                     budget: MapBudget | None = None, mesh: MeshConfig | None = None) -> PDMResult:
    """Scores a candidate set with EP normalised against the best candidate (PDM-Closed).

    Args: scene (...), candidates (..., P, 40, 3) poses at 0.1 .. 4.0 s; budget: a
      :class:`MapBudget` from ``map_budget(scene)`` taken outside a caller's jit (by default
      it is read off the scene here, which is only possible when the scene is concrete);
      mesh: as in :func:`score_proposals`.
    Returns: PDMResult (..., P).
    """
    shape = _check_scene(scene)
    candidates = _check("candidates", candidates, shape, (None, NUM_SCORE_STEPS - 1, 3),
                        config.check_finite)
    config = dataclasses.replace(config, check_finite=True)
    budget = budget if budget is not None else map_budget(scene, candidates.shape[-3])
    return call_on_rows(lambda s, c: _score_candidates_jit(s, c, config, budget), (scene, candidates),
                        _scene_mesh(mesh, shape))


def _scene_mesh(mesh, shape: tuple[int, ...]):
    """The Mesh of a scoring call (None: one device); scenes need a batch dim to be split."""
    mesh = make_mesh(mesh)
    if mesh is not None and not shape:
        raise ValueError("a mesh splits the scene batch: pass scenes with at least one batch dim")
    return mesh
