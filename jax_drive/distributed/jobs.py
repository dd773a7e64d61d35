"""The work of a multi-process run, split by process then by device, results on process 0.

Each function is called by every process of a run (:mod:`jax_drive.distributed.multihost`;
with one process it is the single-process computation) and returns the whole result on every
process; only process 0 should write it (``jax_drive.parallel.is_primary``).

* :func:`score_planner`: a batched PDM evaluation of a planner on generated scenes, in chunks
  fixed by the batch size alone. Process p generates only the scenes of its block of chunks
  (scene i is ``fold_in(key, i)`` whatever the chunk), plans them, and scores them one chunk
  per device (no cross-process traffic); the per-scene results are gathered. Every device
  runs the same program on the same chunk whatever the process count, so the scores do
  not depend on it.
* :func:`run_episode_plan`: cooperative episodes in chunks (one simulator batch each, fixed
  by ``chunk_size`` alone); process p runs its block of chunks, each chunk's episodes split
  over the process's devices (the simulator steps every device's episodes in one partitioned
  program), and the JSON records (:func:`jax_drive.distributed.episodes.episode_record`) are
  gathered in plan order. A chunk runs the same program on the same inputs whatever the
  process count (with as many devices per process).

Training (SFT, mtGRPO) across processes is the trainers' own (``SFTConfig.mesh`` /
``GRPOConfig.mesh`` over the global mesh); ``jax-drive scale-out job`` runs all four.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.parallel import MeshConfig, gather_objects, make_mesh, process_block, row_mesh, shard_batch


def scene_chunks(num_scenes: int, batch_size: int) -> list[range]:
    """The scene ids of every chunk of a batched evaluation: fixed by ``batch_size`` alone."""
    return [range(s, min(num_scenes, s + batch_size)) for s in range(0, num_scenes, batch_size)]


def score_planner(name: str, num_scenes: int, seed: int = 0, *, pdm_config=None, generator=None,
                  batch_size: int = 64):
    """PDM scores (a :class:`~jax_drive.pdm.PDMResult` of (num_scenes,) NumPy fields) of planner
    ``name`` (``jax_drive.evaluate.PLANNERS``) on ``generate_scenes(key(seed), num_scenes)``.

    The scenes are cut into chunks of ``batch_size`` (:func:`scene_chunks`); process p takes its
    block of chunks and, for each chunk, generates only its scenes (a short last chunk is
    filled with the scenes after it, then cut) and runs the planner and PDM-Closed. The chunks
    are then scored one per device (up to this process's device count at once, one
    partitioned program): every device scores ``batch_size`` scenes whatever the process or
    device count, so the scores do not depend on either.
    """
    from jax_drive.evaluate import PLANNERS
    from jax_drive.pdm import PDMConfig, score_proposals
    from jax_drive.planners import pdm_closed
    from jax_drive.scenes.generator import GeneratorConfig, generate_scenes

    if name not in PLANNERS:
        raise ValueError(f"unknown planner {name!r}; choose from {sorted(PLANNERS)}")
    config, generator = pdm_config or PDMConfig(), generator or GeneratorConfig()
    chunks = scene_chunks(num_scenes, batch_size)
    mine = chunks[process_block(len(chunks))]
    per_call = jax.local_device_count()
    parts = []
    for first in range(0, len(mine), per_call):
        group = mine[first:first + per_call]
        planned = []
        for ids in group:  # one chunk's shapes for the planner whatever the group
            scenes = generate_scenes(jax.random.PRNGKey(seed), batch_size, generator, start_id=ids.start)
            closed = pdm_closed(scenes)
            proposals = closed.output if name == "pdm_closed" else PLANNERS[name](scenes)
            planned.append((scenes, proposals[:, None], closed.poses))
        scenes, proposals, reference = jax.tree.map(lambda *xs: jnp.concatenate(xs), *planned)
        mesh = row_mesh(jax.local_devices()[:len(group)])
        result = jax.tree.map(np.asarray, score_proposals(scenes, proposals, reference, config, mesh=mesh))
        parts += [jax.tree.map(lambda a: a[k * batch_size:k * batch_size + len(ids), 0], result)
                  for k, ids in enumerate(group)]
    return jax.tree.map(lambda *xs: np.concatenate(xs), *[p for own in gather_objects(parts) for p in own])


def run_episode_plan(specs: Sequence, *, policy="rule_based", chunk_size: int = 4, cfg=None) -> list[dict]:
    """JSON records of the episodes ``specs`` (:class:`~jax_drive.distributed.episodes.EpisodeSpec`),
    in plan order; see the module docstring."""
    from jax_drive.distributed.backends import check_group, make_policy
    from jax_drive.distributed.episodes import chunk_specs, episode_record

    chunks = chunk_specs(specs, chunk_size)
    policy = make_policy(policy)
    records = []
    for chunk in chunks[process_block(len(chunks))]:
        check_group(chunk)
        results = run_chunk(chunk, policy, cfg)
        records += [episode_record(spec, result, {"process": jax.process_index()})
                    for spec, result in zip(chunk, results)]
    order = {spec.id: k for k, spec in enumerate(specs)}
    gathered = [r for part in gather_objects(records) for r in part]
    return sorted(gathered, key=lambda r: order[r["episode_id"]])


def run_chunk(chunk: Sequence, policy, cfg=None) -> list:
    """The :class:`~jax_drive.coop.runner.EpisodeResult` of one chunk of specs (one
    background flag and time cap), its simulator batch split over this process's devices (as
    many as divide the padded batch: the same split on any process count with as many
    devices each)."""
    from jax_drive.coop.episodes import EpisodeBatch
    from jax_drive.coop.runner import run_episodes
    from jax_drive.sim.state import SimConfig

    batch = EpisodeBatch([s.scenario for s in chunk], [s.key() for s in chunk], [s.accident_prone for s in chunk],
                         background=chunk[0].background, cfg=cfg or SimConfig(), max_time=chunk[0].max_time)
    rows = int(batch.state.x.shape[0])
    devices = jax.local_devices()[:math.gcd(rows, jax.local_device_count())]
    mesh = make_mesh(MeshConfig(data=len(devices)), devices)
    if mesh is not None:  # each device steps its own episodes (one partitioned program)
        batch.scenario, batch.state = shard_batch((batch.scenario, batch.state), mesh)
    return run_episodes(None, None, accident_prone=None, policy=policy, batch=batch)[0]


def per_scene(result, first_id: int = 0) -> list[dict]:
    """One dict per scene (scene_id, pdms and the sub-scores) of a (N,) PDMResult."""
    fields = ("nc", "dac", "ddc", "ttc", "ep", "comfort", "pdms", "epdms", "progress")
    values = {f: np.asarray(getattr(result, f)) for f in fields}
    n = len(values["pdms"])
    return [{"scene_id": first_id + i, **{f: _number(values[f][i]) for f in fields}} for i in range(n)]


def _number(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None
