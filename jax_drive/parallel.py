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

Several processes (JAX's multi-controller runtime, started by
:func:`jax_drive.distributed.multihost.initialize`): every process runs the same program; a
mesh then spans the devices of all processes (process-major: process p's devices form a
contiguous block of the batch axes) and must use every device. Host arrays handed to the
batch functions (:func:`shard_batch`, :func:`call_on_rows`) are *this process's rows*: the
global batch is the processes' rows in process order, so each process loads or generates only
its own. :func:`local_mesh` is the mesh over one process's devices (per-process work with no
cross-process traffic: sampling its own rows, scoring its own scenes); :func:`host_values`,
:func:`gather_objects` and :func:`barrier` move results between processes. With one process
all of this is the single-process code above.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
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
    devices = list(global_devices() if devices is None else devices)
    data, fsdp = config.shape(len(devices))
    if data * fsdp > len(devices):
        raise ValueError(f"MeshConfig(data={data}, fsdp={fsdp}) needs {data * fsdp} devices, "
                         f"{len(devices)} available (on a CPU: XLA_FLAGS="
                         f"--xla_force_host_platform_device_count={data * fsdp})")
    grid = np.asarray(devices[: data * fsdp], dtype=object).reshape(data, fsdp)
    owners = {d.process_index for d in devices}
    if len(owners) > 1 and data * fsdp != len(devices):
        # a process without a device in the mesh could not hold its share of a batch
        raise ValueError(f"a mesh over {len(owners)} processes must use all {len(devices)} devices, got "
                         f"MeshConfig(data={data}, fsdp={fsdp}); use MeshConfig(data=-1, fsdp={fsdp})")
    return Mesh(grid, AXES)


def global_devices() -> list:
    """Every device of every process, process by process (each process's block contiguous,
    so the rows of a batch split over a mesh are the processes' rows in process order)."""
    return sorted(jax.devices(), key=lambda d: d.process_index)


def local_mesh(config: MeshConfig | None) -> Mesh | None:
    """The mesh of ``config`` over this process's devices only (``MeshConfig(data=-1)``: all
    of them); None for a single-device config. Work on it needs no other process."""
    return make_mesh(config, jax.local_devices()) if config is not None else None


def row_mesh(devices: Sequence[Any]) -> Mesh:
    """A data-parallel mesh over exactly ``devices`` (a Mesh even for one device, so a batch
    split over it runs the same per-device program whatever the device count)."""
    return Mesh(np.asarray(list(devices), dtype=object).reshape(-1, 1), AXES)


def spans_processes(mesh: Mesh | None) -> bool:
    """Whether ``mesh`` holds devices of other processes (a multi-controller global mesh)."""
    return mesh is not None and any(d.process_index != jax.process_index() for d in mesh.devices.flat)


def require_global_mesh(mesh: Mesh | None, what: str) -> None:
    """Raises when several processes run but ``mesh`` does not span them: a trainer's state
    must be one global array per leaf, not one copy per process."""
    if jax.process_count() > 1 and not spans_processes(mesh):
        raise ValueError(f"{what} runs in {jax.process_count()} processes: its mesh must span every process's "
                         f"devices (MeshConfig(data=-1) or data * fsdp = {jax.device_count()})")


def batch_shards(mesh: Mesh | None) -> int:
    """Devices a batch is split over (``data * fsdp``; 1 without a mesh)."""
    return 1 if mesh is None else math.prod(mesh.shape[a] for a in BATCH_AXES)


def local_batch_shards(mesh: Mesh | None) -> int:
    """This process's devices in the mesh, i.e. the devices its own rows are split over."""
    if mesh is None:
        return 1
    return sum(d.process_index == jax.process_index() for d in mesh.devices.flat)


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
    With a mesh over several processes, a leaf that is not already a global array holds this
    process's rows (a multiple of :func:`local_batch_shards`, the same count in every
    process); the result is the global batch of every process's rows in process order.
    """
    if mesh is None:
        return tree
    if spans_processes(mesh):
        return jax.tree.map(lambda x: _global_rows(x, mesh), tree)
    shards = batch_shards(mesh)
    for x in jax.tree.leaves(tree):
        if np.ndim(x) == 0 or np.shape(x)[0] % shards:
            raise ValueError(f"a batch of shape {np.shape(x)} cannot be split over {shards} devices: "
                             f"its leading axis must be a multiple of {shards}")
    return jax.device_put(tree, batch_sharding(mesh))


def _global_rows(x, mesh: Mesh) -> jax.Array:
    """One leaf of :func:`shard_batch` over several processes."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return jax.device_put(x, batch_sharding(mesh))
    local = np.asarray(x)
    shards = local_batch_shards(mesh)
    if local.ndim == 0 or local.shape[0] % shards:
        raise ValueError(f"this process's rows of shape {local.shape} cannot be split over its {shards} devices: "
                         f"the leading axis must be a multiple of {shards}")
    return jax.make_array_from_process_local_data(batch_sharding(mesh), local)


def local_rows(x) -> np.ndarray:
    """This process's rows of a global array split along its leading axis (the inverse of
    :func:`shard_batch` over several processes), as NumPy; a fully addressable array whole."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return np.asarray(x)
    shards = {}
    for shard in x.addressable_shards:  # replicas of a row block appear once per device
        shards.setdefault(shard.index[0].start or 0, shard.data)
    return np.concatenate([np.asarray(shards[k]) for k in sorted(shards)], axis=0)


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
    mesh this is ``fn(*batch)``. With a mesh over several processes ``batch`` holds this
    process's rows and so does the result (every process must call it, as any global program).
    """
    if mesh is None:
        return fn(*batch)
    if spans_processes(mesh):  # this process's rows; every process pads to the same count
        n = int(jax.tree.leaves(batch)[0].shape[0])
        if n == 0:
            raise ValueError("every process needs at least one row (it pads with copies of its last)")
        most = int(np.max(host_values(np.int64(n), stack=True)))
        padded, _ = pad_batch(tuple(batch), round_up(most, local_batch_shards(mesh)))  # n <= most: one multiple
        out = on_rows(fn, mesh)(*shard_batch(padded, mesh))
        return jax.tree.map(lambda x: jnp.asarray(local_rows(x)[:n]), out)
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


# ----------------------------------------------------------------------------- processes
def is_primary() -> bool:
    """Whether this is process 0, the one that writes logs and results."""
    return jax.process_index() == 0


def process_block(n: int, index: int | None = None, count: int | None = None) -> slice:
    """The rows of ``n`` that process ``index`` of ``count`` (default: this one) owns: contiguous
    blocks in process order, the first ``n % count`` one row longer."""
    index = jax.process_index() if index is None else int(index)
    count = jax.process_count() if count is None else int(count)
    base, extra = divmod(int(n), count)
    start = index * base + min(index, extra)
    return slice(start, start + base + (index < extra))


def host_values(tree, stack: bool = False):
    """Every leaf as NumPy on every process: a global array's full value (gathered from the
    processes that hold its shards); with ``stack``, each process's own value of a host
    leaf (one per process along a new leading axis, same shape everywhere). One process:
    ``np.asarray`` (stacked: a leading axis of 1)."""
    if jax.process_count() == 1:
        return jax.tree.map(lambda x: np.asarray(x)[None] if stack else np.asarray(x), tree)
    from jax.experimental import multihost_utils

    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            if x.is_fully_replicated:  # every process holds the whole value already
                return np.asarray(x.addressable_data(0))
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        if stack:
            return np.asarray(multihost_utils.process_allgather(np.asarray(x), tiled=False))
        return np.asarray(x)

    return jax.tree.map(one, tree)


def gather_objects(obj) -> list:
    """``obj`` of every process (picklable), in process order, on every process (``[obj]``
    with one process). The processes are one program, so unpickling their data is safe."""
    if jax.process_count() == 1:
        return [obj]
    data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = host_values(np.int64(data.size), stack=True)
    # padded to a power of two: few distinct shapes, so few compiled gathers
    width = 1 << max(int(np.max(sizes)) - 1, 1).bit_length()
    padded = np.zeros(width, np.uint8)
    padded[:data.size] = data
    rows = host_values(padded, stack=True)
    return [pickle.loads(rows[i, :int(sizes[i])].tobytes()) for i in range(len(sizes))]


def barrier(name: str, timeout_s: float = 6 * 3600) -> None:
    """Waits until every process reaches the barrier ``name`` (nothing with one process).

    A barrier of the runtime's coordination service, not a device collective: it compiles
    nothing and waits as long as a process takes (up to ``timeout_s``; a dead process ends
    the run through the runtime's heartbeats first). Before the first collective of a set of
    devices after uneven work (gloo gives up on peers that take 30 s to reach a new set's
    first collective), a barrier lines the processes up.
    """
    if jax.process_count() == 1:
        return
    from jax._src import distributed  # the runtime's client has no public handle (orbax reads it here too)

    client = distributed.global_state.client
    if client is None:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
    else:
        client.wait_at_barrier(f"jax_drive:{name}", int(timeout_s * 1000))


def host_local(tree):
    """A copy of ``tree`` on this process's default device, global arrays gathered whole
    (what per-process work, e.g. the sampler of :func:`local_mesh`, reads)."""
    if jax.process_count() == 1:
        return tree
    return jax.tree.map(
        lambda x: jnp.asarray(host_values(x)) if isinstance(x, jax.Array) and not x.is_fully_addressable else x, tree)
