"""Device meshes and shardings: data parallelism for batches, FSDP for trainer state.

One 2-D ``jax.sharding.Mesh`` with axes ``("data", "fsdp")`` serves every component:

* **batches** (PDM scenes and proposals, simulator episodes, sampler rows, trainer rows)
  split their leading axis over both axes together (``P(("data", "fsdp"))``): every device
  takes ``1 / (data * fsdp)`` of the rows. The scorer and the simulator have no parameters,
  so for them the two axes are the same thing;
* **parameters and optimiser state** of the trainers are sharded along ``fsdp`` only and
  replicated along ``data`` (ZeRO-3 / FSDP): each array is split along one axis chosen from its
  shape (:func:`fsdp_spec`), and the jitted step gathers the weights where the forward pass
  needs them and reduce-scatters the gradients (XLA's SPMD partitioner inserts both from the
  sharding constraints of :func:`constrain_params`).

Nothing here changes results beyond float summation order: the per-row programs are the same
on 1 or N devices; reductions over the batch (losses, gradient sums) are split into partial
sums. Configs name their mesh with :class:`MeshConfig`; the default (1, 1) means "no mesh"
(:func:`make_mesh` returns None) and every caller then runs exactly its single-device code.

On a CPU, ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` makes one process see 8
devices (set before JAX initialises its backend), which is how the equivalence tests run.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA = "data"
FSDP = "fsdp"
AXES = (DATA, FSDP)
# Batches split over both axes: data-parallel replicas x FSDP shards all take their own rows.
BATCH_AXES = (DATA, FSDP)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """How many devices go to each mesh axis.

    Attributes:
      data: data-parallel replicas (default 1); -1 = every device not used by ``fsdp``.
      fsdp: shards of the trainer's parameters and optimiser state (default 1). Batches are
        split over ``data * fsdp`` devices.

    ``MeshConfig()`` (1 x 1) is the single-device default: no mesh, no sharding.
    """

    data: int = 1
    fsdp: int = 1

    def __post_init__(self):
        if self.fsdp < 1 or not (self.data >= 1 or self.data == -1):
            raise ValueError(f"mesh sizes must be >= 1 (data may be -1 = all devices), got "
                             f"data={self.data}, fsdp={self.fsdp}")

    @property
    def single_device(self) -> bool:
        return self.data == 1 and self.fsdp == 1

    def shape(self, num_devices: int) -> tuple[int, int]:
        """(data, fsdp) for ``num_devices`` devices (resolves ``data=-1``)."""
        if self.data == -1:
            if num_devices % self.fsdp:
                raise ValueError(f"{num_devices} devices cannot be split into fsdp={self.fsdp} shards")
            return num_devices // self.fsdp, self.fsdp
        return self.data, self.fsdp


def make_mesh(config: MeshConfig | Mesh | None, devices: Sequence[Any] | None = None) -> Mesh | None:
    """The ``("data", "fsdp")`` mesh of ``config`` over the first ``data * fsdp`` devices.

    Args:
      config: a MeshConfig, an existing Mesh (returned as is; it must have both axes) or None.
      devices: devices to use (default ``jax.devices()``).
    Returns:
      a Mesh, or None for a single-device config (callers then skip sharding entirely).
    Raises:
      ValueError: more devices asked for than available, or a Mesh without the two axes.
    """
    if config is None:
        return None
    if isinstance(config, Mesh):
        if tuple(config.axis_names) != AXES:
            raise ValueError(f"a jax_drive mesh has axes {AXES}, got {tuple(config.axis_names)}")
        return config
    if config.single_device:
        return None
    devices = list(jax.devices() if devices is None else devices)
    data, fsdp = config.shape(len(devices))
    if data * fsdp > len(devices):
        raise ValueError(f"MeshConfig(data={data}, fsdp={fsdp}) needs {data * fsdp} devices, "
                         f"{len(devices)} available (on a CPU: XLA_FLAGS="
                         f"--xla_force_host_platform_device_count={data * fsdp})")
    grid = np.asarray(devices[: data * fsdp], dtype=object).reshape(data, fsdp)
    return Mesh(grid, AXES)


def batch_shards(mesh: Mesh | None) -> int:
    """Devices a batch is split over (``data * fsdp``; 1 without a mesh)."""
    return 1 if mesh is None else math.prod(mesh.shape[a] for a in BATCH_AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading axis split over ``data * fsdp``, the other axes whole."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    """A full copy on every device."""
    return NamedSharding(mesh, PartitionSpec())


def round_up(n: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` >= n."""
    return -(-int(n) // multiple) * multiple


# ----------------------------------------------------------------------------- batches
def pad_batch(tree, multiple: int):
    """Repeats the last row of every leaf (leading axis) up to a multiple of ``multiple``.

    Padding with a real row (not zeros) keeps padded rows valid inputs for any per-row
    program (a zero scene could take another branch or produce NaNs); callers drop them with
    :func:`take_rows`. Returns (padded tree, original row count).
    """
    leaves = jax.tree.leaves(tree)
    if not leaves:
        raise ValueError("pad_batch needs at least one array")
    n = int(leaves[0].shape[0])
    if any(int(x.shape[0]) != n for x in leaves):
        raise ValueError(f"leaves disagree on the batch size: {sorted({int(x.shape[0]) for x in leaves})}")
    extra = round_up(n, multiple) - n
    if extra == 0:
        return tree, n
    pad = lambda x: jnp.concatenate([jnp.asarray(x), jnp.repeat(jnp.asarray(x)[-1:], extra, axis=0)], axis=0)
    return jax.tree.map(pad, tree), n


def take_rows(tree, n: int):
    """The first ``n`` rows of every leaf (undoes :func:`pad_batch`)."""
    return jax.tree.map(lambda x: x[:n], tree)


def shard_batch(tree, mesh: Mesh | None):
    """Places every leaf of ``tree`` with its leading axis split over the mesh's batch axes.

    Without a mesh the tree is returned unchanged. Raises ValueError when a leaf's leading
    axis is not a multiple of :func:`batch_shards` (pad first with :func:`pad_batch`).
    """
    if mesh is None:
        return tree
    shards = batch_shards(mesh)
    for x in jax.tree.leaves(tree):
        if np.ndim(x) == 0 or np.shape(x)[0] % shards:
            raise ValueError(f"a batch of shape {np.shape(x)} cannot be split over {shards} devices: "
                             f"its leading axis must be a multiple of {shards}")
    return jax.device_put(tree, batch_sharding(mesh))


def on_rows(fn, mesh: Mesh):
    """``fn`` run by every device on its own rows (``jax.shard_map`` over the batch axes).

    ``fn`` must treat rows (the leading axis of every argument and output) independently: each
    device then runs exactly the single-device program on its rows, with no cross-device
    communication (XLA's automatic partitioning of the same program may add gathers)."""
    spec = PartitionSpec(BATCH_AXES)
    # check_vma off: ``fn`` is single-device code (scans with fresh carries), not written for
    # manual axes; it holds no collectives, so there is nothing for the check to protect.
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))


def call_on_rows(fn, batch: tuple, mesh: Mesh | None):
    """``fn(*batch)`` with the rows (leading axis) of every array in ``batch`` split over the mesh.

    The rows are padded to a multiple of :func:`batch_shards` (:func:`pad_batch`), placed with
    :func:`shard_batch`, run by :func:`on_rows` (``fn`` must treat rows independently: the
    scorer, the simulator), and the padding rows are dropped from every output leaf. Without a
    mesh this is ``fn(*batch)``.
    """
    if mesh is None:
        return fn(*batch)
    padded, n = pad_batch(tuple(batch), batch_shards(mesh))
    return take_rows(on_rows(fn, mesh)(*shard_batch(padded, mesh)), n)


def replicate(tree, mesh: Mesh | None):
    """Every leaf copied to every device of the mesh (unchanged without a mesh)."""
    return tree if mesh is None else jax.device_put(tree, replicated(mesh))


def constrain_batch(tree, mesh: Mesh | None):
    """Inside a jitted function: the leading axis of every leaf split over the batch axes."""
    if mesh is None:
        return tree
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, batch_sharding(mesh)), tree)


# ---------------------------------------------------------------------- FSDP parameters
def fsdp_spec(shape: Sequence[int], shards: int) -> PartitionSpec:
    """Where an array of ``shape`` is split along the ``fsdp`` axis (a rule by shape only).

    Arrays of rank >= 2 are split along their largest axis other than axis 0 whose size is a
    multiple of ``shards`` (the last such axis on ties). Axis 0 is skipped because the decoder
    keeps its layers stacked on it and scans over it; splitting it would make every scan step
    fetch a layer from another device. Scalars, vectors and arrays with no divisible axis are
    replicated (they are small: norms, biases, step counts). The optimiser's moments have
    their parameter's shape, so they get the same split.

    Args: shape: the array's shape; shards: size of the ``fsdp`` axis.
    Returns: a PartitionSpec naming ``"fsdp"`` on at most one axis.
    """
    shape = tuple(int(s) for s in shape)
    if shards <= 1 or len(shape) < 2:
        return PartitionSpec()
    best = None
    for axis in range(1, len(shape)):
        if shape[axis] % shards == 0 and (best is None or shape[axis] >= shape[best]):
            best = axis
    if best is None:
        return PartitionSpec()
    return PartitionSpec(*([None] * best + [FSDP]))


def fsdp_shardings(tree, mesh: Mesh):
    """A NamedSharding per leaf of ``tree`` (arrays or ShapeDtypeStructs) by :func:`fsdp_spec`."""
    shards = mesh.shape[FSDP]
    return jax.tree.map(lambda x: NamedSharding(mesh, fsdp_spec(np.shape(x), shards)), tree)


def shard_params(tree, mesh: Mesh | None):
    """Places parameters / optimiser state on the mesh, split along ``fsdp`` by shape."""
    if mesh is None:
        return tree
    return jax.device_put(tree, fsdp_shardings(tree, mesh))


def constrain_params(tree, mesh: Mesh | None):
    """Inside a jitted function: every leaf split along ``fsdp`` by :func:`fsdp_spec`."""
    if mesh is None:
        return tree
    shards = mesh.shape[FSDP]
    return jax.tree.map(
        lambda x: jax.lax.with_sharding_constraint(x, NamedSharding(mesh, fsdp_spec(x.shape, shards))), tree)


def shard_model(model, mesh: Mesh | None) -> None:
    """Moves an nnx model's state onto the mesh in place (FSDP split by shape).

    The trainers call this first, so the live model (which the sampler reads) holds the same
    sharded arrays as the trainer's state and no full copy stays on one device.
    """
    if mesh is None:
        return
    from flax import nnx

    nnx.update(model, shard_params(nnx.state(model), mesh))


COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute", "all-to-all")


def collective_counts(hlo_text: str) -> dict[str, int]:
    """How many cross-device operations of each kind a compiled program's HLO text holds
    (``jitted.lower(...).compile().as_text()``); async pairs count once."""
    return {op: len(re.findall(rf"\b{op}(?:-start)?\(", hlo_text)) for op in COLLECTIVES}


def is_sharded(x, axis_name: str) -> bool:
    """Whether array ``x`` is split along ``axis_name`` of its mesh (a NamedSharding)."""
    sharding = getattr(x, "sharding", None)
    if not isinstance(sharding, NamedSharding) or sharding.mesh.shape.get(axis_name, 1) == 1:
        return False
    for entry in sharding.spec:
        names = entry if isinstance(entry, tuple) else (entry,)
        if axis_name in names:
            return True
    return False
