"""PDM-Closed (Dauner et al., 2023) in JAX: IDM proposals along the route, scored, best kept.

Candidates: every (target speed fraction, lateral offset) pair of ``PDMClosedConfig``
(default 5 x 3 = 15): target speed = fraction * speed limit (15 m/s when the scene has no
valid limit); the path is the route centreline shifted by the offset (blended in over
``IDMConfig.lateral_time``); the speed profile is an IDM w.r.t. the leading object on that
path (:mod:`jax_drive.planners.idm`). Each candidate is 40 poses at 0.1 s. All candidates
are scored together with :func:`jax_drive.pdm.score_candidates` (EP normalised over the
set) and the one with the highest PDMS is kept (ties: the first in order).
"""

from __future__ import annotations

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp

from jax_drive.pdm import PDMConfig, score_candidates
from jax_drive.pdm.polygons import MapBudget, map_budget
from jax_drive.planners.idm import IDMConfig, idm_rollout_single, target_speed
from jax_drive.types import NUM_OUTPUT_POSES, Scene, batch_shape


@dataclasses.dataclass(frozen=True)
class PDMClosedConfig:
    """PDM-Closed settings (NAVSIM / nuPlan defaults).

    Attributes:
      speed_fractions: target speeds as fractions of the speed limit (0.2 .. 1.0).
      lateral_offsets: lateral offsets of the centreline, metres (-1, 0, +1).
      idm: IDM parameters (min gap 1 m, headway 1.5 s, accel 1.5, decel 3.0).
      pdm: scorer config used to rank the candidates.
    """

    speed_fractions: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 1.0)
    lateral_offsets: tuple[float, ...] = (-1.0, 0.0, 1.0)
    idm: IDMConfig = IDMConfig()
    pdm: PDMConfig = PDMConfig()


@chex.dataclass(frozen=True)
class PDMClosedOutput:
    """poses: (..., 40, 3) at 0.1 .. 4.0 s; output: (..., 8, 3) at 0.5 .. 4.0 s;
    best: (...) int32 index of the chosen candidate; candidates: (..., C, 40, 3);
    candidate_pdms: (..., C) their PDMS."""

    poses: chex.Array
    output: chex.Array
    best: chex.Array
    candidates: chex.Array
    candidate_pdms: chex.Array


def _grid(config: PDMClosedConfig) -> tuple[jax.Array, jax.Array]:
    fr, off = jnp.meshgrid(jnp.asarray(config.speed_fractions), jnp.asarray(config.lateral_offsets), indexing="ij")
    return fr.reshape(-1), off.reshape(-1)


def pdm_closed_candidates(scene: Scene, config: PDMClosedConfig = PDMClosedConfig()) -> chex.Array:
    """Candidate trajectories (..., C, 40, 3) at 0.1 s, C = len(fractions) * len(offsets)."""
    shape = batch_shape(scene)
    flat = jax.tree.map(lambda a: a.reshape((-1,) + a.shape[len(shape):]), scene)
    fractions, offsets = _grid(config)
    v_limit = target_speed(flat.map.speed_limit, config.idm)  # (B,)
    cands = jax.vmap(lambda s, v: idm_rollout_single(s, offsets, fractions * v, config.idm))(flat, v_limit)
    return cands.reshape(shape + cands.shape[1:])


def pdm_closed(scene: Scene, config: PDMClosedConfig = PDMClosedConfig()) -> PDMClosedOutput:
    """PDM-Closed for a batch of scenes (...): one jitted program, no Python loops.

    Called with concrete scenes, the scorer's map budget is read off them first (fast
    polygon tables); inside a caller's jit the scorer uses its brute-force tests instead.
    """
    num_candidates = len(config.speed_fractions) * len(config.lateral_offsets)
    return _pdm_closed_jit(scene, config, map_budget(scene, num_candidates))


@functools.partial(jax.jit, static_argnames=("config", "budget"))
def _pdm_closed_jit(scene: Scene, config: PDMClosedConfig, budget: MapBudget | None) -> PDMClosedOutput:
    cands = pdm_closed_candidates(scene, config)
    result = score_candidates(scene, cands, config.pdm, budget=budget)
    best = jnp.argmax(result.pdms, axis=-1)
    poses = jnp.take_along_axis(cands, best[..., None, None, None], axis=-3)[..., 0, :, :]
    output = poses[..., 4::5, :][..., :NUM_OUTPUT_POSES, :]
    return PDMClosedOutput(poses=poses, output=output, best=best.astype(jnp.int32), candidates=cands,
                           candidate_pdms=result.pdms)
