"""Static shapes of the sampler: its configuration, the length buckets and the padded layouts.

Compiled programs depend only on shapes and static settings. The host pads the prompts to a
bucketed length ``P``, the batch to a bucketed size ``B`` and the generation budget to a
bucketed ``N``, so a rollout loop with varying prompt lengths reuses one decode program.
Everything here is host-side and pure (numpy in, numpy out).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from jax_drive.parallel import MeshConfig, batch_shards, make_mesh, round_up


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """Shape bucketing and prefill sharing of the sampler.

    Attributes:
      prompt_buckets: allowed padded prompt lengths, ascending; ``None`` (default) means
        powers of two >= ``min_prompt_bucket``.
      min_prompt_bucket: smallest power-of-two prompt bucket (default 16).
      gen_buckets: allowed generation budgets, ascending; ``None`` means powers of two
        >= ``min_gen_bucket``.
      min_gen_bucket: smallest power-of-two generation bucket (default 16).
      bucket_batch: pad the batch to a power of two with dummy rows (default True).
      max_stop_ids: size of the (padded) stop-id array is the next power of two >= the
        number of stop ids, at least this many (default 4).
      unroll_layers: decode with per-layer weight buffers and a Python-unrolled layer loop
        (``jax_drive.models.unroll_params``: XLA:CPU then does not copy every layer's weights
        out of the stacked arrays on each step; keeps one extra copy of the weights, compiles
        longer; ``experiments/bench_sampler.py`` measures it). False: call the model's
        ``__call__`` (scanned layers) in the loop. Models whose ``arrays()`` are not in the
        ``CausalLM`` layout always use the latter. Default True.
      share_prefix: prefill each distinct prompt of a call once and copy its cache rows to
        the rows that repeat it (outputs equal the unshared path's), and prefill the leading
        tokens all distinct prompts share once (``plan.common_prefix_length``; outputs equal
        up to float rounding, as the shared keys are computed in a one-row batch; the padded
        prompt length and the decode program stay those of the prompt bucket, the prefill
        compiles once per shared length). Default True.
      pack_prompts: prefill the prompts' own parts (after the common prefix) packed several to
        a row instead of left-padded to the bucket (``packing.pack_prompt_parts``, when that
        skips at least a quarter of the work; text models on one device). Outputs equal up to
        float rounding; the prefill compiles once per packed shape (bin length and count, each
        on a coarse grid: a few per prompt and batch bucket), the decode program is the
        bucket's. Default True.
      mesh: devices the rows of a call are split over (default one): the weights are copied
        to every device, the batch is padded to a multiple of the device count, and XLA
        partitions the jitted programs along the rows.
    """

    prompt_buckets: tuple[int, ...] | None = None
    min_prompt_bucket: int = 16
    gen_buckets: tuple[int, ...] | None = None
    min_gen_bucket: int = 16
    bucket_batch: bool = True
    max_stop_ids: int = 4
    unroll_layers: bool = True
    share_prefix: bool = True
    pack_prompts: bool = True
    mesh: MeshConfig = MeshConfig()

    def __post_init__(self) -> None:
        for name in ("prompt_buckets", "gen_buckets"):
            b = getattr(self, name)
            if b is not None:
                b = tuple(int(x) for x in b)
                if not b or any(x < 1 for x in b) or list(b) != sorted(set(b)):
                    raise ValueError(f"{name} must be ascending distinct positive ints, got {b}")
                object.__setattr__(self, name, b)
        if self.min_prompt_bucket < 1 or self.min_gen_bucket < 1 or self.max_stop_ids < 1:
            raise ValueError("minimum bucket sizes must be >= 1")

    def batch_size(self, rows: int) -> int:
        """Rows of the compiled batch for ``rows`` real rows (a multiple of the mesh's devices)."""
        return round_up(next_power_of_two(rows) if self.bucket_batch else rows,
                        batch_shards(make_mesh(self.mesh)))

    def prompt_bucket(self, length: int) -> int:
        """Padded prompt length P for a longest prompt of ``length`` tokens."""
        return bucket_size(length, self.prompt_buckets, self.min_prompt_bucket, "prompt length")

    def gen_bucket(self, max_new_tokens: int) -> int:
        """Output columns N compiled for a budget of ``max_new_tokens``."""
        return bucket_size(max_new_tokens, self.gen_buckets, self.min_gen_bucket, "max_new_tokens")


def next_power_of_two(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << max(0, int(n) - 1).bit_length()


def bucket_size(n: int, buckets: Sequence[int] | None, minimum: int, what: str) -> int:
    """The bucket that holds length ``n``: the smallest entry of ``buckets`` >= n, or the
    next power of two (at least ``minimum``) when ``buckets`` is None.

    Raises:
      ValueError: ``n`` exceeds the largest fixed bucket.
    """
    if buckets is None:
        return max(int(minimum), next_power_of_two(n))
    for b in buckets:
        if b >= n:
            return int(b)
    raise ValueError(f"{what} {n} exceeds the largest bucket {buckets[-1]}")


# The grid 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (powers of two and 1.5x them): a length rounded
# on it compiles once per grid value and gives up, or pads, at most a third.
def grid_down(n: int) -> int:
    """Largest grid entry <= n (n >= 1)."""
    power = 1 << (int(n).bit_length() - 1)
    return power + power // 2 if n >= power + power // 2 else power


def grid_up(n: int, minimum: int = 1) -> int:
    """Smallest grid entry >= max(n, minimum)."""
    n = max(int(n), int(minimum), 1)
    power = next_power_of_two(n)
    return power * 3 // 4 if power >= 4 and n <= power * 3 // 4 else power


def count_bucket(n: int) -> int:
    """``n`` rounded up to 1, 2, ..., 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, ... (four shapes
    per doubling above 8; fewer than a quarter of the rows are padding)."""
    step = max(1, next_power_of_two(n) // 8)
    return -(-max(int(n), 1) // step) * step


def left_pad(
    prompts: Sequence[Sequence[int]], length: int, batch: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Left-pads token lists into a (batch, length) array.

    Rows beyond ``len(prompts)`` are dummy rows holding one "real" pad token (so no row is
    fully masked).

    Returns:
      ids (batch, length) int32, mask (batch, length) bool (True = real token),
      row_valid (batch,) bool (False for dummy rows).
    """
    ids = np.full((batch, length), pad_id, dtype=np.int32)
    mask = np.zeros((batch, length), dtype=bool)
    for i, p in enumerate(prompts):
        n = len(p)
        if n:
            ids[i, length - n:] = np.asarray(p, dtype=np.int32)
            mask[i, length - n:] = True
    mask[len(prompts):, -1] = True
    row_valid = np.zeros((batch,), dtype=bool)
    row_valid[: len(prompts)] = True
    return ids, mask, row_valid


def right_pad(rows: Sequence[Sequence[int]], length: int, batch: int, pad_id: int = 0):
    """Token lists left-aligned in a (batch, length) int32 array (``pad_id`` after them), and
    their lengths (batch,) int32 (0 for rows beyond ``len(rows)``)."""
    ids = np.full((batch, length), pad_id, np.int32)
    lengths = np.zeros((batch,), np.int32)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
        lengths[i] = len(r)
    return ids, lengths
