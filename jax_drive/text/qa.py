"""PDM-understanding QA (MTDrive appendix A.2): balanced yes/no questions per metric.

For each scene and each metric except comfort, :func:`qa_candidates` draws candidate
questions in one jitted, batched call and labels them with the scorer's geometry
(:mod:`jax_drive.geometry`: ego footprint from the rear-axle pose, oriented boxes,
separating-axis overlap, even-odd point-in-polygon), then keeps
``min(#yes, #no, per_class)`` questions of each answer per (scene, metric) at random, so
every scene's questions are balanced.

Labels (all in the ego frame at t0):

* **DAC** "does this trajectory point stay within the drivable area?": Yes iff each of
  the 4 corners of the ego box at the pose lies inside some drivable polygon (the
  scorer's non-drivable mask, negated). Candidates: poses near the route (random station
  0..40 m ahead, lateral offset +-10 m, heading noise).
* **NC** "does the ego vehicle at this point collide with this object?": Yes iff the ego
  box at the pose overlaps the object's box (SAT, touching counts). The object box is the
  one at the observation step of a random output pose k (step 5(k+1)). Candidates: ego
  centre within about +-8 m along / +-4 m across the object, random heading noise.
* **TTC** "keeping its speed and heading, does the ego keep a safe time-to-collision with
  this object?": No (unsafe) iff, for some d in {0, 0.3, 0.6, 0.9} s, the ego box moved
  ahead by ``speed * d`` along its heading overlaps the object's logged box at step
  t + d / 0.1, the object exists then, and the object is ahead of the ego: the angle
  between the ego heading and the direction from the ego centre to the object centre is
  below 30 degrees (the scorer's TTC projection; its multiple-lanes / off-road /
  intersection widening is left out so the question stays answerable from its text).
  Candidates: the ego 2..25 m behind an object, nearly aligned with it, at 0..15 m/s.

The text follows the seed's DAC question; the NC and TTC questions are written in the
same style. Answers are ``Yes.`` or ``No.``.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_drive import geometry
from jax_drive.text.codec import format_point
from jax_drive.text.feedback import format_box
from jax_drive.text.prompts import IMAGE_PLACEHOLDER, PromptConfig
from jax_drive.types import NUM_OBS_STEPS, NUM_OUTPUT_POSES, Scene, VehicleParameters

METRICS = ("dac", "nc", "ttc")
_DEG = np.pi / 180.0


@dataclasses.dataclass(frozen=True)
class QAConfig:
    """QA generation options.

    per_class: at most this many Yes and this many No questions per scene and metric (2);
      always as many Yes as No.
    num_candidates: candidates drawn per scene and metric before balancing (64).
    ttc_frames: observation frames ahead tested for TTC, (0, 3, 6, 9) = 0 .. 0.9 s.
    ahead_angle_deg: an object counts as ahead below this angle (30 degrees).
    max_ttc_speed: the TTC candidates' ego speed is drawn in [0, max_ttc_speed] m/s (15).
    """

    per_class: int = 2
    num_candidates: int = 64
    ttc_frames: tuple[int, ...] = (0, 3, 6, 9)
    ahead_angle_deg: float = 30.0
    max_ttc_speed: float = 15.0


# ---------------------------------------------------------------------------------------
# labels (pure geometry; (...) broadcast)


def in_drivable(pose: jax.Array, drivable_vertices, drivable_valid) -> jax.Array:
    """(...,) bool: every ego corner at the rear-axle pose (..., 3) is in a drivable polygon.

    drivable_vertices (..., P, V, 2) and drivable_valid (..., P) share the pose's batch dims.
    """
    corners = geometry.ego_corners(pose, VehicleParameters())  # (..., 4, 2)
    inside = geometry.points_in_polygons(corners, drivable_vertices, drivable_valid)  # (..., 4, P)
    return jnp.all(jnp.any(inside, -1), -1)


def collides(pose: jax.Array, box: jax.Array) -> jax.Array:
    """(...,) bool: the ego box at pose (..., 3) overlaps box (..., 7) [x, y, z, l, w, h, heading]."""
    ego = geometry.ego_corners(pose, VehicleParameters())
    other = geometry.box_corners(box[..., 0], box[..., 1], box[..., 6], box[..., 3], box[..., 4])
    return geometry.boxes_overlap(ego, other)


def ttc_unsafe(
    pose: jax.Array,
    speed: jax.Array,
    future_boxes: jax.Array,
    future_valid: jax.Array,
    dts: jax.Array,
    ahead_angle_deg: float = 30.0,
) -> jax.Array:
    """(...,) bool: the TTC rule of the module docstring.

    Args:
      pose: (..., 3) rear-axle pose; speed: (...) m/s.
      future_boxes: (..., D, 7) the object's boxes at t + dts; future_valid: (..., D).
      dts: (D,) seconds ahead.
    """
    heading = pose[..., 2]
    direction = jnp.stack([jnp.cos(heading), jnp.sin(heading)], -1)  # (..., 2)
    shift = (speed[..., None] * dts)[..., None] * direction[..., None, :]  # (..., D, 2)
    moved = jnp.concatenate(
        [pose[..., None, :2] + shift, jnp.broadcast_to(heading[..., None, None], shift.shape[:-1] + (1,))], -1
    )
    hit = collides(moved, future_boxes) & future_valid
    centre = geometry.ego_center(pose, VehicleParameters())
    to_object = future_boxes[..., 0, :2] - centre
    dist = jnp.maximum(jnp.linalg.norm(to_object, axis=-1), 1e-9)
    cos_angle = jnp.clip(jnp.sum(to_object * direction, -1) / dist, -1.0, 1.0)
    ahead = jnp.arccos(cos_angle) < ahead_angle_deg * _DEG
    return jnp.any(hit, -1) & ahead


# ---------------------------------------------------------------------------------------
# candidates


def _quantize_pose(pose: jax.Array) -> jax.Array:
    """What the question text shows: 2 decimals, |v| <= 0.01 written as 0 (codec rule)."""
    q = jnp.round(pose, 2)
    return jnp.where(jnp.abs(q) <= 0.01, 0.0, q)


def _agent_boxes(scene: Scene) -> jax.Array:
    """(..., N, T, 7) boxes of all objects over the observation steps."""
    a = scene.agents
    t = a.x.shape[-1]
    size = lambda v: jnp.broadcast_to(v[..., None], v.shape + (t,))  # noqa: E731
    return jnp.stack([a.x, a.y, a.z, size(a.length), size(a.width), size(a.height), a.heading], -1)


def _route_pose(scene_route_points, scene_route_valid, s):
    cum = geometry.polyline_arc_lengths(scene_route_points, scene_route_valid)
    p = scene_route_points
    x = jnp.interp(s, cum, p[:, 0])
    y = jnp.interp(s, cum, p[:, 1])
    xa, ya = jnp.interp(s + 0.5, cum, p[:, 0]), jnp.interp(s + 0.5, cum, p[:, 1])
    xb, yb = jnp.interp(s - 0.5, cum, p[:, 0]), jnp.interp(s - 0.5, cum, p[:, 1])
    return jnp.stack([x, y, jnp.arctan2(ya - yb, xa - xb)], -1)


NUM_UNIFORMS = 15  # uniforms per candidate used by _one_scene


def _pick(u, valid):
    """Uniform choice among valid entries from uniforms u (C,) and valid (C, N).

    Returns: index (C,) int (0 where none is valid) and any-valid (C,) bool.
    """
    count = valid.sum(-1)
    target = jnp.minimum(jnp.floor(u * count), jnp.maximum(count - 1, 0))
    cumulative = jnp.cumsum(valid, -1)
    return jnp.argmax(cumulative > target[:, None], -1), count > 0


def _output_step(u):
    """Observation step (C,) int32 of an output pose picked by uniforms u (C,): 5, 10, ..., 40."""
    return 5 * (jnp.minimum(jnp.floor(u * NUM_OUTPUT_POSES), NUM_OUTPUT_POSES - 1).astype(jnp.int32) + 1)


def _rear_axle_pose(centre, heading, back):
    """Quantised (C, 3) rear-axle pose of an ego whose box centre (C, 2) and heading (C,) are
    given; ``back``: rear axle to box centre, m."""
    return _quantize_pose(
        jnp.stack([centre[:, 0] - back * jnp.cos(heading), centre[:, 1] - back * jnp.sin(heading), heading], -1))


def _span(u, col, lo, hi):
    """Uniforms u[:, col] (C,) mapped onto [lo, hi)."""
    return lo + (hi - lo) * u[:, col]


def _dac_candidates(u, scene: Scene) -> dict:
    """DAC candidates: a pose near the route (uniform columns 0-2) and whether it is drivable."""
    origin = jnp.zeros((1, 2), scene.route.points.dtype)
    s0, _ = geometry.project_on_polyline(origin, scene.route.points, scene.route.valid)
    s = s0[0] + _span(u, 0, 0.0, 40.0)
    base = _route_pose(scene.route.points, scene.route.valid, s)
    lateral = _span(u, 1, -10.0, 10.0)
    normal = jnp.stack([-jnp.sin(base[:, 2]), jnp.cos(base[:, 2])], -1)
    dac_heading = geometry.wrap_angle(base[:, 2] + _span(u, 2, -0.3, 0.3))
    dac_pose = jnp.concatenate([base[:, :2] + lateral[:, None] * normal, dac_heading[:, None]], -1)
    dac_pose = _quantize_pose(dac_pose)
    drv = scene.map.drivable
    dac_label = in_drivable(dac_pose, drv.vertices[None], drv.valid[None])
    return dict(dac_pose=dac_pose, dac_label=dac_label, dac_ok=jnp.ones((u.shape[0],), bool))


def _nc_candidates(u, scene: Scene, boxes, back: float) -> dict:
    """NC candidates: an ego pose next to an agent's box (uniform columns 3-7) and whether they overlap."""
    step = _output_step(u[:, 3])
    agent, nc_ok = _pick(u[:, 4], scene.agents.valid[:, step].T)
    nc_box = jnp.round(boxes[agent, step], 2)  # (C, 7), as written in the question
    offset = jnp.stack([_span(u, 5, -8.0, 8.0), _span(u, 6, -4.0, 4.0)], -1)
    centre = nc_box[:, :2] + geometry.rotate(offset, nc_box[:, 6])
    nc_heading = geometry.wrap_angle(nc_box[:, 6] + _span(u, 7, -1.0, 1.0))
    nc_pose = _rear_axle_pose(centre, nc_heading, back)
    return dict(nc_pose=nc_pose, nc_box=nc_box, nc_class=scene.agents.agent_type[agent], nc_object=agent,
                nc_step=step, nc_label=collides(nc_pose, nc_box), nc_ok=nc_ok)


def _ttc_candidates(u, scene: Scene, boxes, back: float, config: QAConfig) -> dict:
    """TTC candidates: an ego pose and speed behind an agent (uniform columns 8-13) and
    whether the agent's next frames stay clear of it."""
    agents, valid = scene.agents, scene.agents.valid
    frames = jnp.asarray(config.ttc_frames)
    t_step = _output_step(u[:, 8])
    t_agent, ttc_ok = _pick(u[:, 9], valid[:, t_step].T)
    future_steps = jnp.minimum(t_step[:, None] + frames[None, :], NUM_OBS_STEPS - 1)  # (C, D)
    future_boxes = jnp.round(boxes[t_agent[:, None], future_steps], 2)  # (C, D, 7)
    future_valid = valid[t_agent[:, None], future_steps] & (t_step[:, None] + frames[None, :] < NUM_OBS_STEPS)
    ttc_box = future_boxes[:, 0]
    rel = jnp.stack([-(_span(u, 10, 2.0, 25.0) + ttc_box[:, 3] / 2), _span(u, 11, -2.0, 2.0)], -1)
    ttc_centre = ttc_box[:, :2] + geometry.rotate(rel, ttc_box[:, 6])
    ttc_heading = geometry.wrap_angle(ttc_box[:, 6] + _span(u, 12, -0.15, 0.15))
    ttc_pose = _rear_axle_pose(ttc_centre, ttc_heading, back)
    ttc_speed = jnp.round(_span(u, 13, 0.0, config.max_ttc_speed), 2)
    dts = frames.astype(jnp.float32) * 0.1
    unsafe = ttc_unsafe(ttc_pose, ttc_speed, future_boxes, future_valid, dts, config.ahead_angle_deg)
    ttc_velocity = jnp.stack([agents.vx[t_agent, t_step], agents.vy[t_agent, t_step]], -1)
    return dict(ttc_pose=ttc_pose, ttc_speed=ttc_speed, ttc_box=ttc_box, ttc_class=agents.agent_type[t_agent],
                ttc_object=t_agent, ttc_step=t_step, ttc_velocity=ttc_velocity,
                ttc_label=~unsafe,  # Yes = safe
                ttc_ok=ttc_ok)


def _one_scene(u, scene: Scene, config: QAConfig):
    """Candidates of one scene (no batch dims) from uniforms u (C, NUM_UNIFORMS): the DAC,
    NC and TTC fields, each (C, ...)."""
    boxes = _agent_boxes(scene)  # (N, T, 7)
    back = VehicleParameters().rear_axle_to_center
    return {**_dac_candidates(u, scene), **_nc_candidates(u, scene, boxes, back),
            **_ttc_candidates(u, scene, boxes, back, config)}


def _balance(u, label, ok, per_class):
    """Indices (2 * per_class,) and their validity: per_class Yes slots then per_class No.

    Exactly k = min(#yes, #no, per_class) items of each answer are kept, so every
    (scene, metric) is balanced. u: (C, 2) uniforms used as random priorities.
    """
    masks = [ok & label, ok & ~label]
    k = jnp.minimum(jnp.minimum(masks[0].sum(), masks[1].sum()), per_class)
    out_idx, out_ok = [], []
    for j, mask in enumerate(masks):
        score = jnp.where(mask, u[:, j], -1.0)
        _, idx = jax.lax.top_k(score, per_class)
        out_idx.append(idx)
        out_ok.append(jnp.arange(per_class) < k)
    return jnp.concatenate(out_idx), jnp.concatenate(out_ok)


@functools.partial(jax.jit, static_argnums=2)
def qa_candidates(key: jax.Array, scene: Scene, config: QAConfig = QAConfig()) -> dict[str, jax.Array]:
    """Balanced, labelled QA items for a batch of scenes (one leading batch dim B).

    Returns a dict; for metric m in (dac, nc, ttc), Q = 2 * per_class items (Yes first):
      m_pose (B, Q, 3), m_label (B, Q) bool (True = the answer is Yes), m_keep (B, Q) bool
      (False where not enough candidates of that label existed), and for nc / ttc also
      m_box (B, Q, 7), m_class (B, Q), m_object (B, Q) agent index, m_step (B, Q) the
      observation step of the box; ttc_speed (B, Q), ttc_velocity (B, Q, 2).
    """
    b = scene.command.shape[0]
    u = jax.random.uniform(key, (b, config.num_candidates, NUM_UNIFORMS + 2 * len(METRICS)))

    def per_scene(u_scene, sc):
        cand = _one_scene(u_scene[:, :NUM_UNIFORMS], sc, config)
        out = {}
        for j, m in enumerate(METRICS):
            u_bal = u_scene[:, NUM_UNIFORMS + 2 * j : NUM_UNIFORMS + 2 * j + 2]
            idx, keep = _balance(u_bal, cand[f"{m}_label"], cand[f"{m}_ok"], config.per_class)
            for name, value in cand.items():
                if name.startswith(m + "_") and not name.endswith("_ok"):
                    out[name] = value[idx]
            out[f"{m}_keep"] = keep
        return out

    return jax.vmap(per_scene)(u, scene)


# ---------------------------------------------------------------------------------------
# text

_ROLE = "You are a vehicle trajectory prediction model for an autonomous driving system. "
_REQUIREMENTS = "Output Requirements:\nFormat: Yes or No\nMaintain numerical precision to two decimal places."


def _inputs(config: PromptConfig) -> tuple[str, str]:
    """(what the model is given, extra block) for the perception mode."""
    if config.perception in ("camera", "image"):
        return "a front-view image", ""
    if config.perception == "text":
        return "a scene description", ""
    return "no other input", ""


def dac_question(pose, config: PromptConfig = PromptConfig(), scene_description: str | None = None) -> str:
    """The seed's DAC question for a (3,) pose."""
    given, _ = _inputs(config)
    text = (
        _ROLE + "One of your key metrics is Drivable Area Compliance (DAC), which assesses whether "
        "trajectory points remain within the drivable area. Given a trajectory prediction point and "
        f"{given}, where trajectory point is formatted as (x: float, y: float, heading: float), your "
        "task is to identify if the given trajectory point stays within the drivable area.\n"
    )
    return _wrap(text + f"Trajectory point is {format_point(pose)}.\n", config, scene_description)


def nc_question(pose, box, agent_type, config: PromptConfig = PromptConfig(), scene_description=None) -> str:
    """NC question: does the ego at ``pose`` collide with the object ``box`` (7,)?"""
    given, _ = _inputs(config)
    text = (
        _ROLE + "One of your key metrics is No at-fault Collisions (NC), which assesses whether the "
        "ego vehicle collides with surrounding objects. Given a trajectory prediction point, an object "
        f"and {given}, where trajectory point is formatted as (x: float, y: float, heading: float) and "
        "the object as (x, y, z, l, w, h, heading, name) in the ego-coordinate system, your task is to "
        "identify if the ego vehicle at the given trajectory point collides with the object.\n"
        f"Trajectory point is {format_point(pose)}.\nObject is {format_box(box, agent_type)}.\n"
    )
    return _wrap(text, config, scene_description)


def ttc_question(
    pose, speed, box, agent_type, velocity, config: PromptConfig = PromptConfig(), scene_description=None
) -> str:
    """TTC question: keeping speed and heading, is the time-to-collision with the object safe?"""
    given, _ = _inputs(config)
    vx, vy = (f"{round(float(v), 2) + 0.0:.2f}" for v in velocity)
    text = (
        _ROLE + "One of your key metrics is Time to Collision (TTC), which assesses whether trajectory "
        "points keep a safe distance from the objects ahead. Given a trajectory prediction point with "
        f"the ego speed, an object with its velocity and {given}, where trajectory point is formatted "
        "as (x: float, y: float, heading: float) and the object as (x, y, z, l, w, h, heading, name) in "
        "the ego-coordinate system, your task is to identify if the ego vehicle, keeping its speed and "
        "heading from the given trajectory point, stays clear of the object ahead for the next 0.9 "
        "seconds (a safe time-to-collision).\n"
        f"Trajectory point is {format_point(pose)} with speed {round(float(speed), 2) + 0.0:.2f} m/s.\n"
        f"Object is {format_box(box, agent_type)} with velocity ({vx}, {vy}) m/s.\n"
    )
    return _wrap(text, config, scene_description)


def _wrap(text: str, config: PromptConfig, scene_description: str | None) -> str:
    if config.perception == "text":
        if scene_description is None:
            raise ValueError("perception='text' needs a scene_description")
        text = text + "Scene description in the ego frame:\n" + scene_description.rstrip("\n") + "\n"
    text = text + _REQUIREMENTS
    return f"{IMAGE_PLACEHOLDER}\n{text}" if config.image_placeholder else text


def answer_text(label: bool) -> str:
    return "Yes." if bool(label) else "No."


def qa_items(
    candidates: dict[str, np.ndarray],
    index: int,
    config: PromptConfig = PromptConfig(),
    scene_description: str | None = None,
) -> list[dict]:
    """The kept QA items of scene ``index`` as dicts {metric, question, answer, label}.

    ``candidates``: host (numpy) output of :func:`qa_candidates`.
    """
    c = {k: np.asarray(v[index]) for k, v in candidates.items()}
    items = []
    for m in METRICS:
        for q in np.flatnonzero(c[f"{m}_keep"]):
            if m == "dac":
                question = dac_question(c["dac_pose"][q], config, scene_description)
            elif m == "nc":
                question = nc_question(c["nc_pose"][q], c["nc_box"][q], c["nc_class"][q], config, scene_description)
            else:
                question = ttc_question(
                    c["ttc_pose"][q], c["ttc_speed"][q], c["ttc_box"][q], c["ttc_class"][q],
                    c["ttc_velocity"][q], config, scene_description,
                )
            label = bool(c[f"{m}_label"][q])
            items.append(dict(metric=m, question=question, answer=answer_text(label), label=label))
    return items
