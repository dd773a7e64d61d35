"""Packed prompts: the rows' own prompt parts placed several to a row for the prefill, so a
batch of very different prompt lengths is not left-padded to its longest prompt.

Each packed token attends to its own piece and the common prefix only; the prefill then
places its keys / values at the slots of the left-padded cache layout, so the decode program
is the prompt bucket's whether a call packed or not. Host-side and pure.
"""

from __future__ import annotations

from collections.abc import Sequence

import chex
import jax
import numpy as np

from jax_drive.sampling.shapes import count_bucket, grid_up

PACK_MIN_SAVING = 0.25  # pack a prefill only when it skips at least this share of the padded work
PACK_ATTENTION_COST = 1 / 2048  # per token of bin length: score work relative to the token's matmuls


@chex.dataclass(frozen=True)
class PackedPrompts:
    """The rows' own prompt parts packed several to a row for the prefill (no left padding).

    ids, positions, segments (M, K) int32: packed tokens, their RoPE positions, the prompt row
    of each column (-1 unused); slot_token (R, P - 1 - C) int32: for each row and cache slot
    C .. P - 2 (its left-padded layout) the flat index (bin * K + column) of the packed token it
    holds, -1 for a padding slot (R: the prompt rows, or the loop's rows, see :meth:`for_rows`).
    """

    ids: jax.Array
    positions: jax.Array
    segments: jax.Array
    slot_token: jax.Array

    def for_rows(self, source: np.ndarray) -> "PackedPrompts":
        """The packing seen from rows that repeat prompt rows: row b holds prompt ``source[b]``."""
        return self.replace(slot_token=self.slot_token[source])


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> tuple[dict[int, tuple[int, int]], int]:
    """Bins of ``capacity`` for the non-empty ``lengths``, longest first, each into the first
    bin with room: ({index: (bin, offset)}, number of bins)."""
    free: list[int] = []  # room left in each bin
    place = {}
    for r in sorted(range(len(lengths)), key=lambda r: -lengths[r]):
        if lengths[r]:
            b = next((i for i, room in enumerate(free) if room >= lengths[r]), len(free))
            if b == len(free):
                free.append(capacity)
            place[r] = (b, capacity - free[b])
            free[b] -= lengths[r]
    return place, len(free)


def pack_prompt_parts(parts: Sequence[Sequence[int]], first_position: int, width: int,
                      rows: int) -> PackedPrompts | None:
    """Packs the prompts' parts that a prefill caches several to a row, when that saves at
    least :data:`PACK_MIN_SAVING` of the left-padded work.

    parts: per prompt, the tokens after the shared prefix and before the last one (which the
    first decode step feeds); first_position: the RoPE position of each part's first token
    (the shared prefix's length); width: P - 1 - C, the columns a left-padded prefill runs per
    row; rows: U, that prefill's row count (dummy rows included). The bin length K is, among
    the longest part rounded up on ``shapes.grid_up`` (at least 16) and the next four grid
    values, the one that gives the least work (bins x K, plus :data:`PACK_ATTENTION_COST` for
    the longer attention of longer bins); bins are filled first-fit decreasing and their
    count is rounded up by ``shapes.count_bucket``. So a prompt bucket and batch bucket compile
    at most (grid values from 16 to four past the width's) x (count buckets up to U) packed
    prefills, in practice a few. Returns None when packing would not pay or there is nothing
    to pack.
    """
    lengths = [len(p) for p in parts]
    if width <= 0 or not any(lengths):
        return None
    capacities = [grid_up(max(lengths), 16)]
    for _ in range(4):
        capacities.append(grid_up(capacities[-1] + 1))
    plans = []
    for capacity in capacities:
        place, used = first_fit_decreasing(lengths, capacity)
        bins = count_bucket(used)
        plans.append((bins * capacity * (1 + PACK_ATTENTION_COST * capacity), capacity, bins, place))
    _, capacity, bins, place = min(plans, key=lambda plan: plan[:2])
    if bins * capacity > (1 - PACK_MIN_SAVING) * rows * width:
        return None
    ids = np.zeros((bins, capacity), np.int32)
    segments = np.full((bins, capacity), -1, np.int32)
    positions = np.zeros((bins, capacity), np.int32)
    slot_token = np.full((rows, width), -1, np.int32)
    for r, (b, offset) in place.items():
        n = lengths[r]
        ids[b, offset:offset + n] = parts[r]
        segments[b, offset:offset + n] = r
        positions[b, offset:offset + n] = first_position + np.arange(n)
        slot_token[r, width - n:] = b * capacity + offset + np.arange(n)
    return PackedPrompts(ids=ids, positions=positions, segments=segments, slot_token=slot_token)
