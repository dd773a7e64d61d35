"""Parity with NAVSIM itself: the cases both scorers see and the per-column comparison.

NAVSIM's own ``pdm_score`` runs only in a NAVSIM environment (``experiments/navsim_parity.py``
builds its metric caches from the scene records below and scores every proposal there); its
per-proposal outputs are committed as test data (``tests/data/navsim/``). Here:

* :func:`parity_cases`: generated scenes of every kind (hard ones included) written as scene
  records at UTM-sized, rotated global poses, with variants that exercise NAVSIM v2's rules:
  a scene without a logged history (HC 1), a synthetic scene without a human trajectory (no
  human penalty filter), a human trajectory that fails a metric (the filter acts), an object
  overlapping the ego's t0 box (v2 drops it), logged yaw rates / accelerations of the past
  states that the headings' finite differences miss (history comfort at the seam); 8
  proposals per scene from good to bad, and a
  PDM-Closed stand-in (the human trajectory resampled at 0.1 s, stretched in every 4th scene).
* :func:`score_cases`: jax-drive's scores of the cases, read back through the scene-file
  loader (the same records NAVSIM read), per NAVSIM version.
* :func:`compare`: per column, how many proposals agree (discrete columns exactly, continuous
  ones within a tolerance) and every difference.

The NAVSIM side reads the records with plain JSON (it has no JAX): the records are the
interface, so both scorers see the same float64 inputs.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

T8 = np.arange(1, 9) * 0.5
T40 = np.arange(1, 41) * 0.1
VARIANTS = ("plain", "no_history", "synthetic", "bad_human", "t0_overlap", "yaw_seam")
# NAVSIM's columns -> jax-drive's PDMResult fields, per NAVSIM version (the v2 "score" is the
# one-stage final score without a previous frame; "score_with_ec" adds the two-frame EC of
# the pair (proposal p, previous = proposal (p + 1) % P), see ``ec_pairs``).
COLUMNS = {
    "1.1": {"no_at_fault_collisions": "nc", "drivable_area_compliance": "dac", "ego_progress": "ep",
            "time_to_collision_within_bound": "ttc", "comfort": "comfort", "driving_direction_compliance": "ddc",
            "score": "pdms"},
    "2.2": {"no_at_fault_collisions": "nc", "drivable_area_compliance": "dac",
            "driving_direction_compliance": "ddc_v2", "traffic_light_compliance": "tlc", "ego_progress": "ep_v2",
            "time_to_collision_within_bound": "ttc_v2", "lane_keeping": "lk", "history_comfort": "hc",
            "score": "epdms", "two_frame_extended_comfort": "ec", "score_with_ec": "epdms_with_ec"},
}
CONTINUOUS = {"ego_progress": 1e-4, "score": 1e-4, "score_with_ec": 1e-4}


@dataclasses.dataclass(frozen=True)
class ParityCases:
    """records: scene-file records (global frame); proposals (S, P, 8, 3) in each scene's
    ego frame at 0.5 .. 4 s; variants: (S,) names from :data:`VARIANTS`; fingerprints: (S,)
    :func:`fingerprint` lists (to tell whether regenerated cases still match the committed
    NAVSIM outputs)."""

    records: list
    proposals: np.ndarray
    variants: tuple
    fingerprints: tuple

    @property
    def tokens(self) -> list:
        return [r["token"] for r in self.records]


def fingerprint(scene, proposals: np.ndarray, reference: np.ndarray) -> list:
    """A few sums that pin down one case (ego frame, float64): valid object poses, map
    vertices, route, human trajectory, history, reference and proposals. Regenerated cases
    match the scored ones when these agree to float32 noise (:func:`same_cases`); a bitwise
    hash would not, since XLA's compiler options change the generator's last bits."""
    ag = scene.agents
    valid = np.asarray(ag.valid, bool)
    f = lambda a: float(np.sum(np.asarray(a, np.float64)))  # noqa: E731
    return [f(np.where(valid, ag.x, 0.0)), f(np.where(valid, ag.y, 0.0)), f(np.where(valid, ag.heading, 0.0)),
            float(valid.sum()), f(np.where(scene.map.drivable.valid[:, None, None], scene.map.drivable.vertices, 0.0)),
            f(np.where(scene.map.lanes.valid[:, None, None], scene.map.lanes.vertices, 0.0)),
            f(np.where(scene.route.valid[:, None], scene.route.points, 0.0)), f(scene.expert),
            f(scene.ego.history_poses), f(reference), f(proposals)]


def same_cases(a, b) -> bool:
    """Two :func:`fingerprint` lists describe the same case (float32 noise aside)."""
    return len(a) == len(b) and bool(np.allclose(a, b, rtol=1e-5, atol=1e-2))


def shift_left(poses: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Poses (8, 3) moved left by offsets (8,) metres, headings following the drift."""
    out = poses.copy()
    h = poses[:, 2]
    out[:, 0] -= np.sin(h) * offsets
    out[:, 1] += np.cos(h) * offsets
    prev = np.concatenate([[0.0], offsets[:-1]])
    step = np.maximum(np.abs(np.diff(np.concatenate([[0.0], poses[:, 0]]))), 0.5)
    out[:, 2] += np.arctan2(offsets - prev, step)
    return out


def proposal_family(expert: np.ndarray, speed: float, rng: np.random.Generator, count: int = 8) -> np.ndarray:
    """(count, 8, 3) proposals of one scene: the expert, constant velocity, then a mix of
    plausible variants (speed change with drift, noise, lane change) and failures (swerve off
    the road, emergency stop, much too fast, zigzag, standing still, sharp turn)."""
    out = [expert.copy(), np.stack([speed * T8, np.zeros(8), np.zeros(8)], -1)]
    kinds = ("drift", "noise", "lane_change", "swerve", "stop", "fast", "zigzag", "still", "turn")
    while len(out) < count:
        kind = kinds[int(rng.integers(len(kinds)))]
        p = expert.copy()
        if kind == "drift":
            p[:, :2] *= rng.uniform(0.7, 1.3)
            p = shift_left(p, rng.normal(0.0, 0.8) * (T8 / 4.0) ** 2)
        elif kind == "noise":
            p[:, :2] += rng.normal(0.0, 0.25, size=(8, 2))
            p[:, 2] += rng.normal(0.0, 0.04, size=8)
        elif kind == "lane_change":
            p = shift_left(p, rng.choice([-1.0, 1.0]) * 3.5 * np.clip((T8 - 0.5) / 2.5, 0.0, 1.0))
        elif kind == "swerve":
            p = shift_left(p, rng.choice([-1.0, 1.0]) * rng.uniform(3.0, 9.0) * T8 / 4.0)
        elif kind == "stop":
            s = np.minimum(speed * T8 - 4.0 * T8 ** 2, speed ** 2 / 16.0)
            p = np.stack([np.maximum.accumulate(np.maximum(s, 0.0)), np.zeros(8), np.zeros(8)], -1)
        elif kind == "fast":
            p[:, :2] *= rng.uniform(1.6, 2.5)
        elif kind == "zigzag":
            p = shift_left(p, rng.uniform(0.8, 2.0) * np.sin(np.arange(8) * 2.2))
        elif kind == "still":
            p = np.zeros((8, 3))
        else:
            sign, radius = rng.choice([-1.0, 1.0]), rng.uniform(6.0, 15.0)
            arc = np.maximum(speed, 3.0) * T8 / radius
            p = np.stack([radius * np.sin(arc), sign * radius * (1 - np.cos(arc)), sign * arc], -1)
        out.append(p)
    return np.stack(out)


def reference_standin(expert: np.ndarray, stretch: bool) -> np.ndarray:
    """(40, 3) PDM-Closed stand-in: the expert resampled at 0.1 s (stretched 1.7x when asked,
    so that the reference itself sometimes fails and drops out of the EP normaliser)."""
    poses = expert.copy()
    if stretch:
        poses[:, :2] *= 1.7
    knots = np.concatenate([np.zeros((1, 3)), poses], 0)
    knot_t = np.concatenate([[0.0], T8])
    return np.stack([np.interp(T40, knot_t, knots[:, 0]), np.interp(T40, knot_t, knots[:, 1]),
                     np.interp(T40, knot_t, np.unwrap(knots[:, 2]))], -1)


def _t0_overlap_object(agents, i: int, rng: np.random.Generator) -> None:
    """Moves the whole track of an object valid at frame 0 so that its t0 box overlaps the
    ego's t0 box (beside the ego's rear half); in place on numpy arrays."""
    valid0 = np.flatnonzero(agents.valid[i][:, 0])
    if valid0.size == 0:
        return
    n = int(valid0[rng.integers(valid0.size)])
    side = float(rng.choice([-1.0, 1.0]))
    target = np.array([rng.uniform(-0.5, 1.5), side * (1.1 + 0.5 * float(agents.width[i, n]) - 0.4)])
    delta = target - np.array([agents.x[i, n, 0], agents.y[i, n, 0]])
    agents.x[i, n] += delta[0]
    agents.y[i, n] += delta[1]


def parity_cases(num_scenes: int, seed: int = 0, proposals_per_scene: int = 8) -> ParityCases:
    """The cases (see the module docstring); deterministic for (num_scenes, seed)."""
    import jax

    from jax_drive.scenes import generate_scenes, scene_record

    scenes = jax.tree.map(lambda a: np.array(a), generate_scenes(jax.random.PRNGKey(seed), num_scenes))
    rng = np.random.default_rng(seed)
    records, proposals, variants, fingerprints = [], [], [], []
    for i in range(num_scenes):
        variant = VARIANTS[i % len(VARIANTS)]
        expert = scenes.expert[i].astype(np.float64)
        speed = float(np.hypot(*scenes.ego.velocity[i]))
        proposals.append(proposal_family(expert, speed, rng, proposals_per_scene))
        if variant == "no_history":
            scenes.ego.history_valid[i] = False
        elif variant == "synthetic":
            scenes.expert_valid[i] = False
        elif variant == "bad_human":
            bad = expert.copy()
            if rng.uniform() < 0.5:
                bad[:, :2] *= rng.uniform(1.6, 2.2)  # rushes into whatever is ahead
            else:
                bad = shift_left(bad, rng.choice([-1.0, 1.0]) * rng.uniform(2.0, 6.0) * T8 / 4.0)
            scenes.expert[i] = bad
        elif variant == "t0_overlap":
            _t0_overlap_object(scenes.agents, i, rng)
        elif variant == "yaw_seam":  # logged yaw dynamics that finite differences of the headings miss
            slope = float(rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 1.5))
            t = np.arange(scenes.ego.history_yaw_rate.shape[1]) * 0.1 - 1.5
            scenes.ego.history_yaw_rate[i] = scenes.ego.history_yaw_rate[i, -1] + slope * t
            scenes.ego.history_yaw_accel[i] = slope
        scene = jax.tree.map(lambda a: a[i], scenes)
        angle = float(rng.uniform(-math.pi, math.pi))
        origin = np.array([rng.uniform(3e5, 7e5), rng.uniform(4.0e6, 5.0e6), angle])
        reference = reference_standin(scenes.expert[i].astype(np.float64), stretch=i % 4 == 3)
        records.append(scene_record(scene, origin, f"parity-{seed}-{i:04d}", reference))
        variants.append(variant)
        fingerprints.append(fingerprint(scene, proposals[-1], reference))
    return ParityCases(records=records, proposals=np.stack(proposals), variants=tuple(variants),
                       fingerprints=tuple(fingerprints))


def ec_pairs(num_proposals: int) -> np.ndarray:
    """(P,) index of the "previous frame" each proposal's two-frame EC is computed against."""
    return (np.arange(num_proposals) + 1) % num_proposals


# Another choice for every convention where NAVSIM v2 and other readings differ (jax-drive's
# earlier rule, or for the past states' yaw dynamics the logged values NAVSIM does not read).
OTHER_CONVENTION = {"t0_overlap": "keep", "human_penalty_filter": False, "hc_acceleration": "rigid_body",
                    "hc_history_dynamics": "logged", "ec_without_previous": "one"}


def score_cases(cases: ParityCases, version: str, **conventions) -> dict:
    """jax-drive's scores of ``cases`` as NAVSIM ``version`` ("1.1" or "2.2") computes them:
    {NAVSIM column: (S, P) float64}, scenes read back from the records; ``conventions``:
    PDMConfig fields to set otherwise (to show what each rule changes)."""
    import jax
    import jax.numpy as jnp

    from jax_drive.pdm import (
        PDMConfig,
        interpolate_poses,
        score_proposals,
        simulate_states,
        two_frame_extended_comfort,
        with_extended_comfort,
    )
    from jax_drive.scenes import load_scenes

    loaded = load_scenes(cases.records)
    scenes = loaded.build()
    config = PDMConfig(navsim_version="2" if version.startswith("2") else "1.1", **conventions)
    result = score_proposals(scenes, cases.proposals, loaded.references, config)
    out = {}
    if version.startswith("2"):
        pairs = ec_pairs(cases.proposals.shape[1])

        @jax.jit
        def extended_comfort(scenes, proposals):
            traj = simulate_states(scenes, interpolate_poses(scenes, proposals, 0.5), config)
            return two_frame_extended_comfort(traj, jax.tree.map(lambda a: a[..., pairs, :], traj), config)

        ec = extended_comfort(scenes, jnp.asarray(cases.proposals, jnp.float32))
        with_ec = with_extended_comfort(result, ec, config)
        result = result.replace(ec=with_ec.ec)
        out["score_with_ec"] = np.asarray(with_ec.epdms, np.float64)
    for column, field in COLUMNS["2.2" if version.startswith("2") else "1.1"].items():
        if column not in out:
            out[column] = np.asarray(getattr(result, field), np.float64)
    return out


def compare(navsim: dict, ours: dict, tokens, max_listed: int = 50) -> dict:
    """Per column: proposals compared, how many agree (discrete exactly; ego_progress and the
    scores within :data:`CONTINUOUS`), and the differences (token, proposal, NAVSIM, ours)."""
    report = {}
    for column, theirs in navsim.items():
        if column not in ours:
            continue
        theirs = np.asarray(theirs, np.float64)
        mine = np.asarray(ours[column], np.float64)
        tol = CONTINUOUS.get(column, 0.0)
        same = np.abs(theirs - mine) <= tol + 1e-9
        bad = np.argwhere(~same)
        report[column] = {
            "compared": int(same.size), "equal": int(same.sum()), "tolerance": tol,
            "differences": [{"token": tokens[s], "proposal": int(p), "navsim": float(theirs[s, p]),
                             "jax_drive": float(mine[s, p])} for s, p in bad[:max_listed]],
        }
    return report
