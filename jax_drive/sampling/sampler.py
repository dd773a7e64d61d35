"""Jitted KV-cache sampler for ``jax_drive.models.CausalLM``.

Layout of one call (``generate_tokens``):

1. The host left-pads the prompts to a *bucketed* length ``P`` (powers of two by default,
   or a fixed list) and the batch to a bucketed size ``B``; the generation budget is
   bucketed to ``N``. Shapes, hence compiled programs, only change when a bucket changes,
   so a rollout loop with varying prompt lengths reuses one decode program (a packed
   prefill, below, also compiles once per packed shape, on a coarse grid).
2. ``_prefill`` (jitted): allocates a static KV cache of ``S = P + N`` slots and writes the
   keys/values of the first ``P - 1`` prompt columns (``CausalLM.prefill``: causal attention
   over the prompt in query blocks, not over all S slots; SmolLM2 at B = 8, P = 1408 on the
   2-core CPU: 32 s instead of 62 s). The logits of the prefill are never used, so no
   (B, P, V) LM head is computed. **Shared prefixes**: rows with equal prompts (a request
   with ``n > 1``, or equal prompts in one batch) are prefilled once and their cache rows
   broadcast to every row that shares them, and the leading tokens that all distinct prompts
   have in common (a system prompt, shared instructions) are prefilled once for the whole
   call (``SamplerConfig.share_prefix``; see :func:`common_prefix_length`). **Packed
   prompts**: where left padding to ``P`` would waste at least a quarter of the prefill, the
   rows' own parts are instead packed several to a row without padding (each attends to its
   own piece and the common prefix only; :func:`pack_prompt_parts`,
   ``SamplerConfig.pack_prompts``), and their keys / values are placed in the left-padded
   cache layout, so the decode program is the bucket's either way.
3. ``_decode_*`` (jitted, loop state donated): a ``lax.while_loop``; step ``t`` feeds one
   token per row (the last prompt token at ``t = 0``, then the previous sample) at the row's
   cache slot (``P - 1 + t``), samples the next token and records its log-prob. The loop
   stops at ``max_new_tokens`` (dynamic, <= N) or when every row has produced a stop token.
   Rows that are done keep running but their outputs are replaced by ``pad_id`` / 0.
   Two step functions, both the model's own forward: ``_decode_unrolled`` (default) runs it
   on the unrolled weight layout (``jax_drive.models.unroll_params``: per-layer buffers, LoRA
   folded in, q/k/v and gate/up fused) with a per-layer ``LayerCache``, which avoids XLA:CPU
   copying every layer's weights out of the stacked arrays on each step (~2x fewer CPU
   cycles per token measured here); ``_decode_generic`` calls ``CausalLM.__call__`` (the
   contract path; any model). With a ``PromptLookup`` each step instead verifies K drafted
   tokens per row in one forward pass (``jax_drive.sampling.speculative``); rows then advance
   by different numbers of tokens, each at its own cache slot.

Randomness: one PRNG key for the call (split at every step), or one key per row (a (R,) key
array): each row then draws only from its own key, so its sample does not depend on which
other rows share the call (``jax-drive serve`` batches seeded requests this way). A draw is
a two-level Gumbel-max (``selection.two_level_gumbel_max``).

Sampling-only settings (temperature, top-k/p values, stop ids, min/max new tokens, pad id)
are traced values, so changing them never recompiles; greedy vs sampled, filtering on/off,
the log-prob mode and the prompt-lookup settings are static.

Log-probabilities: ``"raw"`` = log-softmax of the unprocessed float32 logits at the sampled
token (temperature 1, no filtering, no min-token mask): log pi(token | prefix) of the policy.
``"processed"`` = log-softmax after temperature / top-k / top-p (and min-token masking), the
distribution the token was drawn from (0 under greedy decoding).

Multi-turn continuation of the rows of a call (their caches kept on the device) is
``jax_drive.sampling.session``.

Several devices (``SamplerConfig.mesh``): the rows of a call are split over the mesh's batch
axes (``jax_drive.parallel``), the weights are copied to every device, and the jitted programs
keep that split (XLA partitions them; the loop's "every row done" test becomes a cross-device
reduction). The batch is padded with dummy rows to a multiple of the device count.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_drive.parallel import MeshConfig, batch_shards, make_mesh, replicate, round_up, shard_batch
from jax_drive.models.transformer import (
    KVCache,
    LayerCache,
    forward_hidden,
    init_cache,
    lm_logits,
    packed_prompt_kv,
    positions_from_mask,
    unroll_params,
)
from jax_drive.sampling.selection import NEG_INF, gather_logprob, select_tokens
from jax_drive.sampling.speculative import PromptLookup, accept_drafts, lookup_drafts


# ----------------------------------------------------------------------------- config
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
        (``jax_drive.models.unroll_params``; ~2x faster per token on the CPU, keeps one extra
        copy of the weights, longer compile). False: call ``CausalLM.__call__`` (scanned
        layers) in the loop. Models without ``arrays()`` always use the latter. Default True.
      share_prefix: prefill each distinct prompt of a call once and copy its cache rows to
        the rows that repeat it (outputs equal the unshared path's), and prefill the leading
        tokens all distinct prompts share once (:func:`common_prefix_length`; outputs equal
        up to float rounding, as the shared keys are computed in a one-row batch; the padded
        prompt length and the decode program stay those of the prompt bucket, the prefill
        compiles once per shared length). Default True.
      pack_prompts: prefill the prompts' own parts (after the common prefix) packed several to
        a row instead of left-padded to the bucket (:func:`pack_prompt_parts`, when that skips at
        least a quarter of the work; text models on one device). Outputs equal up to float
        rounding; the prefill compiles once per packed shape (bin length and count, each on a
        coarse grid: a few per prompt and batch bucket), the decode program is the bucket's.
        Default True.
      mesh: devices the rows of a call are split over (default one; see the module docstring).
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


# ------------------------------------------------------------------------ host helpers
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


def unique_rows(rows: Sequence[Sequence[int]]) -> tuple[list[list[int]], np.ndarray]:
    """Distinct token lists in first-seen order, and for each row the index of its list.

    Returns: (unique lists, source (R,) int32) with ``rows[r] == unique[source[r]]``.
    """
    index: dict[tuple[int, ...], int] = {}
    source = np.asarray([index.setdefault(tuple(r), len(index)) for r in rows], np.int32)
    return [list(r) for r in index], source


MIN_COMMON_PREFIX = 16  # shorter common prefixes are not worth a separate prefill pass
# Left-padded prefills only: the rows' own parts then attend over all cache slots instead of
# causally in blocks over the prompt alone (up to ~2x the attention work at long prompts), so
# a shared part under this fraction of the longest prompt would cost more than it saves.
# Packed parts attend to the prefix and their own piece only: any shared part pays there.
MIN_COMMON_FRACTION = 0.25


def common_prefix_length(rows: Sequence[Sequence[int]], min_fraction: float = MIN_COMMON_FRACTION) -> int:
    """Tokens that every one of >= 2 rows starts with and that the call prefills once:
    their longest common prefix, leaving each row at least one token of its own, rounded
    down on the grid (:func:`grid_down`: the prefill compiles once per value, and at most a
    third of the shared part is given up); 0 below
    :data:`MIN_COMMON_PREFIX` tokens or ``min_fraction`` of the longest row (a left-padded
    prefill: :data:`MIN_COMMON_FRACTION`; a packed one: 0), or with fewer than two rows."""
    if len(rows) < 2:
        return 0
    # every row shares a prefix iff the lexicographically first and last rows do
    lowest, highest = (min(map(list, rows)), max(map(list, rows)))
    limit = min(len(r) for r in rows) - 1
    common = 0
    while common < limit and lowest[common] == highest[common]:
        common += 1
    if common < max(MIN_COMMON_PREFIX, min_fraction * max(len(r) for r in rows)):
        return 0
    return grid_down(common)


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
    the longest part rounded up on :func:`grid_up` (at least 16) and the next four grid
    values, the one that gives the least work (bins x K, plus :data:`PACK_ATTENTION_COST` for
    the longer attention of longer bins); bins are filled first-fit decreasing and their
    count is rounded up by :func:`count_bucket`. So a prompt bucket and batch bucket compile
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


def right_pad(rows: Sequence[Sequence[int]], length: int, batch: int, pad_id: int = 0):
    """Token lists left-aligned in a (batch, length) int32 array (``pad_id`` after them), and
    their lengths (batch,) int32 (0 for rows beyond ``len(rows)``)."""
    ids = np.full((batch, length), pad_id, np.int32)
    lengths = np.zeros((batch,), np.int32)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
        lengths[i] = len(r)
    return ids, lengths


@dataclasses.dataclass(frozen=True)
class Request:
    """One decoding request of the sampler, engine defaults resolved.

    Attributes: max_new_tokens, temperature (0 = greedy), top_p, top_k, min_new_tokens,
    logprobs_mode as in ``SamplingParams``; stop_token_ids: the resolved stop ids (default
    none); pad_id: padding id of inputs and outputs (default 0); prompt_lookup: speculative
    decoding settings or None (default: one token per step).
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    min_new_tokens: int = 0
    pad_id: int = 0
    logprobs_mode: str = "raw"
    prompt_lookup: PromptLookup | None = None

    def check(self, vocab: int) -> None:
        """Raises ValueError for settings the sampler cannot honour."""
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.logprobs_mode not in ("raw", "processed"):
            raise ValueError(f"logprobs_mode must be 'raw' or 'processed', got {self.logprobs_mode!r}")
        if any(not (0 <= s < vocab) for s in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must lie in [0, {vocab}), got {list(self.stop_token_ids)}")

    @property
    def greedy(self) -> bool:
        return float(self.temperature) == 0.0

    @property
    def draft_len(self) -> int:
        """K drafted tokens per step (0 without prompt lookup)."""
        return 0 if self.prompt_lookup is None else self.prompt_lookup.num_draft

    def mode(self) -> "DecodeMode":
        return DecodeMode(greedy=self.greedy,
                          use_filter=(not self.greedy) and (self.top_k > 0 or self.top_p < 1.0),
                          processed_logprobs=self.logprobs_mode == "processed",
                          lookup=self.prompt_lookup)

    def settings(self, config: SamplerConfig, never_ids: Sequence[int] = ()) -> "DecodeSettings":
        """Traced settings; ``never_ids`` (the model's input placeholders, e.g. a VLM's image
        pad id) get zero probability, and so are never sampled nor accepted as drafts."""
        stop = list(self.stop_token_ids)
        kpad = max(config.max_stop_ids, next_power_of_two(max(1, len(stop))))
        never = [int(i) for i in never_ids]
        mpad = next_power_of_two(max(1, len(never)))
        return DecodeSettings(
            max_new_tokens=jnp.int32(self.max_new_tokens),
            min_new_tokens=jnp.int32(self.min_new_tokens),
            temperature=jnp.float32(1.0 if self.greedy else self.temperature),
            top_k=jnp.int32(self.top_k),
            top_p=jnp.float32(self.top_p),
            stop_ids=jnp.asarray(stop + [-1] * (kpad - len(stop)), jnp.int32),
            never_ids=jnp.asarray(never + [-1] * (mpad - len(never)), jnp.int32),
            pad_id=jnp.int32(self.pad_id),
        )


def check_token_ids(rows: Sequence[Sequence[int]], vocab: int, what: str = "prompt") -> None:
    """Raises ValueError for an id outside [0, vocab)."""
    for r in rows:
        if r and (min(r) < 0 or max(r) >= vocab):
            raise ValueError(f"{what} token ids must lie in [0, {vocab}), got {min(r)}..{max(r)}")


def row_keys(key: jax.Array, rows: int) -> jax.Array | None:
    """``key`` as one typed PRNG key per row ((rows,) key array), or None for a single key.

    A single key is a typed key of shape () or a raw uint32 key of shape (2,); one key per
    row is a typed (rows,) key array or raw (rows, 2) data.

    Raises:
      ValueError: a key array whose length is not ``rows``.
    """
    key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
    typed = jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    if key.ndim == (0 if typed else 1):
        return None
    keys = key if typed else jax.random.wrap_key_data(key)
    if keys.ndim != 1 or keys.shape[0] != rows:
        raise ValueError(f"one PRNG key per row needs {rows} keys, got key shape {tuple(key.shape)}")
    return keys


def split_keys(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(next key, subkey) of one key (shape ()) or of one key per row ((B,): row-wise)."""
    if key.ndim == 0:
        key, sub = jax.random.split(key)
        return key, sub
    pairs = jax.vmap(jax.random.split)(key)  # (B, 2)
    return pairs[:, 0], pairs[:, 1]


# ----------------------------------------------------------------------- decode weights
@jax.jit
def _unroll(arrays: dict) -> dict:
    return unroll_params(arrays)


def unrolled_weights(model) -> dict | None:
    """``unroll_params(model.arrays())`` (a new copy of the weights), or None when the model
    does not expose ``arrays()`` in the CausalLM layout (it then decodes through ``__call__``)."""
    arrays_fn = getattr(model, "arrays", None)
    arrays = arrays_fn() if arrays_fn is not None else None
    if not isinstance(arrays, dict) or "layers" not in arrays or "embed" not in arrays:
        return None
    # the language model only (a vision tower's weights are not needed to decode)
    return _unroll({k: arrays[k] for k in ("embed", "layers", "final_norm", "lm_head")})


class DecodeWeightCache:
    """The unrolled decode copy of one model's weights, kept while its arrays are unchanged.

    Keyed by the identity of the model's state arrays (``nnx.state``; ``arrays()`` for other
    models): the cache holds those arrays, so an id cannot be reused while the entry lives,
    and an in-place update (a trainer step assigns new arrays) makes the next ``get`` rebuild
    the copy. (Not ``arrays()`` of an nnx model: with unmerged LoRA it builds a new
    ``lora_scale`` array on every call, which would miss every time.) Owned by an engine
    (one entry).
    """

    def __init__(self) -> None:
        self._entry: tuple | None = None  # (leaf ids, leaves, weights)

    def get(self, model) -> dict | None:
        """The cached (or rebuilt) ``unrolled_weights(model)``."""
        arrays_fn = getattr(model, "arrays", None)
        if arrays_fn is None:
            return None
        leaves = jax.tree.leaves(nnx.state(model) if isinstance(model, nnx.Module) else arrays_fn())
        ids = tuple(id(x) for x in leaves)
        if self._entry is not None and self._entry[0] == ids:
            return self._entry[2]
        weights = unrolled_weights(model)
        self._entry = None if weights is None else (ids, leaves, weights)
        return weights

    def clear(self) -> None:
        """Drops the copy (frees its memory)."""
        self._entry = None


# --------------------------------------------------------------------- jitted programs
@chex.dataclass
class DecodeSettings:
    """Traced sampling settings (changing them never recompiles): max_new_tokens,
    min_new_tokens, top_k, pad_id () int32; temperature, top_p () float32; stop_ids (K,) and
    never_ids (M,) int32 padded with -1 (never_ids: ids that are never sampled)."""

    max_new_tokens: jax.Array
    min_new_tokens: jax.Array
    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    stop_ids: jax.Array
    never_ids: jax.Array
    pad_id: jax.Array


@dataclasses.dataclass(frozen=True)
class DecodeMode:
    """Static decoding settings (one compiled program each)."""

    greedy: bool
    use_filter: bool
    processed_logprobs: bool
    lookup: PromptLookup | None = None


@chex.dataclass
class DecodeState:
    """Carry of the decode loop (B rows, W output columns).

    cache: the model's KVCache (generic path) or a LayerCache (unrolled path); token (B,)
    int32: the pending token, fed at the next step; position (B,) int32: its RoPE position;
    index () or (B,) int32: the cache slot it is written to (per row once rows advance
    differently); step () int32: loop iterations so far; done (B,) bool; tokens (B, W) int32
    and logprobs (B, W) float32: outputs (pad / 0 after a stop); lengths (B,) int32:
    generated tokens per row (stop token included); stopped (B,) bool: a stop token was
    produced; key: PRNG key, or (B,) keys (one per row); history (B, T) int32 and history_len (B,) int32: each row's
    context with its outputs (prompt lookup only, else None).
    """

    cache: Any
    token: jax.Array
    position: jax.Array
    index: jax.Array
    step: jax.Array
    done: jax.Array
    tokens: jax.Array
    logprobs: jax.Array
    lengths: jax.Array
    stopped: jax.Array
    key: jax.Array
    history: jax.Array | None = None
    history_len: jax.Array | None = None


def new_decode_state(cache, token, position, index, row_valid, key, width: int,
                     history=None, history_len=None) -> DecodeState:
    """A loop state before the first step: nothing generated, dummy rows done."""
    batch = token.shape[0]
    return DecodeState(
        cache=cache, token=token, position=position, index=index,
        step=jnp.zeros((), jnp.int32), done=~row_valid,
        tokens=jnp.zeros((batch, width), jnp.int32),
        logprobs=jnp.zeros((batch, width), jnp.float32),
        lengths=jnp.zeros((batch,), jnp.int32), stopped=jnp.zeros((batch,), bool), key=key,
        history=history, history_len=history_len,
    )


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("slots", "width", "per_layer", "common"))
def _prefill(graphdef, state, ids, mask, source, row_valid, key, history, history_len, *,
             slots: int, width: int, per_layer: bool, positions=None, vision=None,
             common: int = 0, packed: PackedPrompts | None = None) -> DecodeState:
    """Caches the first P - 1 prompt columns and returns the loop state before step 0.

    ids/mask (U, P) left-padded prompts; source (B,) int32: the prompt row of each of the B
    loop rows (shared prefill), or None when U == B and row b is prompt b; row_valid (B,)
    bool (False = dummy row, done from the start); history / history_len: see DecodeState.
    slots: cache length S; width: output columns; per_layer: a LayerCache (else KVCache).
    positions, vision: a prompt batch with images brings its (3, U, P) M-RoPE positions and
    its vision inputs (``model.multimodal_inputs``); decoding goes on from the last column's
    position (a text token: its three positions are equal).
    common: the first ``common`` columns are the same real tokens in every row (the prompts'
    common prefix, see :func:`start_decode`): they are prefilled in one row and broadcast,
    then the rest of the columns attend to them (text models only).
    packed: the prompt columns common .. P - 2 of every row packed without padding
    (:func:`pack_prompt_parts`, seen from the B loop rows; text models only): their keys /
    values are computed in the packed rows, after the common prefix's, and placed at the
    slots of the left-padded layout, which is the cache's.
    """
    model = nnx.merge(graphdef, state)
    config = model.config
    plen = ids.shape[1]
    if positions is None:
        positions = positions_from_mask(mask)
    images = {} if vision is None else {"vision": vision}
    head = _prefix_cache(model, ids, positions, mask, common) if common else None
    if packed is not None:  # already the loop's rows
        cache = _packed_cache(model, packed, head, slots, plen)
    else:
        cache = init_cache(config, ids.shape[0], slots, config.jnp_dtype)
        if common:  # the prefix in every row's first slots, the rest attending over the cache
            cache = cache.replace(k=cache.k.at[:, :, :common].set(head.k), v=cache.v.at[:, :, :common].set(head.v),
                                  mask=cache.mask.at[:, :common].set(True))
            _, cache = forward_hidden(model.arrays(), config, ids[:, common:-1], positions[:, common:-1],
                                      mask[:, common:-1], cache, jnp.int32(common))
        elif plen > 1 and hasattr(model, "prefill"):  # blocked causal attention over the prompt only
            cache = model.prefill(ids[:, :-1], positions[..., :-1], mask[:, :-1], cache, **images)
        elif plen > 1:
            _, cache = model(
                ids[:, :-1], positions[..., :-1], mask[:, :-1], cache=cache, cache_index=jnp.int32(0),
                **images)
    positions = positions[0] if positions.ndim == 3 else positions  # (U, P): last column's onwards
    if source is not None:  # broadcast the shared prompts' rows
        if packed is None:
            cache = cache.replace(k=jnp.take(cache.k, source, axis=1), v=jnp.take(cache.v, source, axis=1),
                                  mask=jnp.take(cache.mask, source, axis=0))
        ids, positions = jnp.take(ids, source, axis=0), jnp.take(positions, source, axis=0)
    if per_layer:
        cache = LayerCache.from_stacked(cache)
    index = jnp.int32(plen - 1)
    if history is not None:  # rows advance differently: one cache slot per row
        index = jnp.full(row_valid.shape, plen - 1, jnp.int32)
    return new_decode_state(cache, ids[:, -1], positions[:, -1], index, row_valid, key, width,
                            history, history_len)


def prefill_plan(distinct: Sequence[Sequence[int]], plen: int, rows: int,
                 config: SamplerConfig) -> tuple[int, PackedPrompts | None]:
    """How a text model on one device prefills the ``distinct`` prompts of a call (left-padded
    to ``plen`` in ``rows`` rows): the common prefix length computed once (0: none) and the
    packing of the rest (None: left-padded), as ``config`` allows and where each pays."""
    common = 0
    if config.share_prefix:  # packed parts attend to the prefix and themselves only: any prefix pays
        common = common_prefix_length(distinct, 0.0 if config.pack_prompts else MIN_COMMON_FRACTION)
    if not config.pack_prompts:
        return common, None
    packed = pack_prompt_parts([p[common:-1] for p in distinct], common, plen - 1 - common, rows)
    if packed is None and common:  # a left-padded prefill after all: its own rule
        common = common_prefix_length(distinct)
    return common, packed


def _prefix_cache(model, ids, positions, mask, common: int) -> KVCache:
    """The cache (NL, 1, C, Nk, D) of the first ``common`` columns (the same in every row),
    prefilled in a one-row batch."""
    return model.prefill(ids[:1, :common], positions[:1, :common], mask[:1, :common],
                         init_cache(model.config, 1, common, model.config.jnp_dtype))


def _packed_cache(model, packed: PackedPrompts, head: KVCache | None, slots: int, plen: int) -> KVCache:
    """The cache (NL, B, S, Nk, D) after prefilling columns [0, P - 1) of B rows: the common
    prefix ``head`` (C slots, or None) in every row's first slots, then each row's own part
    from the packed prefill at its left-padded slots ``packed.slot_token`` (B, P - 1 - C)."""
    prefix_k, prefix_v = (None, None) if head is None else (head.k[:, 0], head.v[:, 0])
    k, v = packed_prompt_kv(model.arrays(), model.config, packed.ids, packed.positions, packed.segments,
                            prefix_k, prefix_v)
    real = packed.slot_token >= 0
    rows, common = real.shape[0], plen - 1 - real.shape[1]

    def layout(x, prefix):  # packed (NL, M, K, Nk, D) -> (NL, B, S, Nk, D)
        flat = x.reshape(x.shape[0], -1, *x.shape[3:])
        parts = [jnp.where(real[None, :, :, None, None], jnp.take(flat, jnp.maximum(packed.slot_token, 0), axis=1), 0),
                 jnp.zeros((x.shape[0], rows, slots - plen + 1, *x.shape[3:]), x.dtype)]
        if prefix is not None:
            parts.insert(0, jnp.broadcast_to(prefix[:, None], (x.shape[0], rows, *prefix.shape[1:])))
        return jnp.concatenate(parts, axis=2)

    mask = jnp.concatenate([jnp.ones((rows, common), bool), real, jnp.zeros((rows, slots - plen + 1), bool)], 1)
    return KVCache(k=layout(k, prefix_k), v=layout(v, prefix_v), mask=mask)


def _id_table(ids: jax.Array, vocab: int) -> jax.Array:
    """(V,) bool: True at the (-1 padded) ``ids``."""
    return jnp.zeros((vocab,), bool).at[jnp.where(ids >= 0, ids, vocab)].set(True, mode="drop")


def _plain_step(step_fn, vocab, settings: DecodeSettings, mode: DecodeMode):
    """Loop body generating one token per row."""
    is_stop_vocab = _id_table(settings.stop_ids, vocab)
    is_never_vocab = _id_table(settings.never_ids, vocab)

    def body(s: DecodeState) -> DecodeState:
        logits, cache = step_fn(s.cache, s.token[:, None], s.position[:, None], s.index)
        logits = logits[:, 0].astype(jnp.float32)  # (B, V)
        key, sub = split_keys(s.key)
        masked = jnp.where(((s.step < settings.min_new_tokens) & is_stop_vocab[None, :]) | is_never_vocab[None, :],
                           NEG_INF, logits)
        token, processed = select_tokens(masked, sub, settings.temperature, settings.top_k,
                                         settings.top_p, greedy=mode.greedy, use_filter=mode.use_filter)
        logprob = processed if mode.processed_logprobs else gather_logprob(logits, token)
        token = jnp.where(s.done, settings.pad_id, token)
        logprob = jnp.where(s.done, 0.0, logprob)
        hit_stop = ~s.done & jnp.any(token[:, None] == settings.stop_ids[None, :], axis=-1)
        return s.replace(
            cache=cache,
            token=token,
            position=s.position + 1,
            index=s.index + 1,
            step=s.step + 1,
            done=s.done | hit_stop,
            tokens=jax.lax.dynamic_update_slice(s.tokens, token[:, None], (0, s.step)),
            logprobs=jax.lax.dynamic_update_slice(s.logprobs, logprob[:, None], (0, s.step)),
            lengths=s.lengths + (~s.done).astype(jnp.int32),
            stopped=s.stopped | hit_stop,
            key=key,
        )

    return body


def _write_rows(buffer: jax.Array, values: jax.Array, start: jax.Array) -> jax.Array:
    """buffer (B, W) with values (B, L) written at columns [start[b], start[b] + L)."""
    return jax.vmap(lambda buf, val, i: jax.lax.dynamic_update_slice(buf, val, (i,)))(buffer, values, start)


def _speculative_step(step_fn, vocab, settings: DecodeSettings, mode: DecodeMode):
    """Loop body verifying K prompt-lookup drafts per row: each row emits 1 to K + 1 tokens."""
    is_stop_vocab = _id_table(settings.stop_ids, vocab)
    is_never_vocab = _id_table(settings.never_ids, vocab)
    lookup = mode.lookup
    k = lookup.num_draft

    def body(s: DecodeState) -> DecodeState:
        drafts, num_valid = lookup_drafts(s.history, s.history_len, lookup)
        feed = jnp.concatenate([s.token[:, None], drafts], axis=1)  # (B, K + 1)
        offsets = jnp.arange(k + 1)
        logits, cache = step_fn(s.cache, feed, s.position[:, None] + offsets, s.index)
        logits = logits.astype(jnp.float32)  # (B, K + 1, V)
        key, sub = split_keys(s.key)
        generated = s.lengths[:, None] + offsets  # index of the token each position predicts
        masked = jnp.where(((generated < settings.min_new_tokens)[..., None] & is_stop_vocab) | is_never_vocab,
                           NEG_INF, logits)
        accept = functools.partial(accept_drafts, temperature=settings.temperature, top_k=settings.top_k,
                                   top_p=settings.top_p, greedy=mode.greedy, use_filter=mode.use_filter)
        if sub.ndim == 0:
            tokens, accepted, processed = accept(masked, drafts, num_valid, sub)
        else:  # one key per row: verify each row on its own
            tokens, accepted, processed = jax.vmap(
                lambda lg, d, n, kk: jax.tree.map(lambda x: x[0], accept(lg[None], d[None], n[None], kk))
            )(masked, drafts, num_valid, sub)
        logprobs = processed if mode.processed_logprobs else gather_logprob(logits, tokens)
        # emitted: tokens[:, :count], cut after the first stop token and at max_new_tokens
        is_stop = jnp.any(tokens[..., None] == settings.stop_ids, axis=-1) & (offsets <= accepted[:, None])
        first_stop = jnp.where(jnp.any(is_stop, axis=1), jnp.argmax(is_stop, axis=1), k + 1)
        count = jnp.minimum(jnp.minimum(accepted, first_stop) + 1, settings.max_new_tokens - s.lengths)
        count = jnp.where(s.done, 0, count)
        hit_stop = first_stop < count
        lengths = s.lengths + count
        last = jnp.take_along_axis(tokens, jnp.maximum(count - 1, 0)[:, None], axis=1)[:, 0]
        return s.replace(
            cache=cache,
            token=jnp.where(count > 0, last, s.token),
            position=s.position + count,
            index=s.index + count,
            step=s.step + 1,
            done=s.done | hit_stop | (lengths >= settings.max_new_tokens),
            tokens=_write_rows(s.tokens, tokens, s.lengths),
            logprobs=_write_rows(s.logprobs, logprobs, s.lengths),
            lengths=lengths,
            stopped=s.stopped | hit_stop,
            key=key,
            history=_write_rows(s.history, tokens, s.history_len),
            history_len=s.history_len + count,
        )

    return body


def _decode_loop(step_fn, vocab: int, loop: DecodeState, settings: DecodeSettings,
                 mode: DecodeMode) -> DecodeState:
    """The ``lax.while_loop`` shared by both decode paths.

    step_fn(cache, tokens (B, L), positions (B, L), index) -> (logits (B, L, V), cache).
    """
    if mode.lookup is None:
        body = _plain_step(step_fn, vocab, settings, mode)

        def cond(s: DecodeState):
            return (s.step < settings.max_new_tokens) & ~jnp.all(s.done)
    else:
        body = _speculative_step(step_fn, vocab, settings, mode)

        def cond(s: DecodeState):
            return ~jnp.all(s.done)

    return jax.lax.while_loop(cond, body, loop)


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("mode",), donate_argnums=(2,))
def _decode_generic(graphdef, state, loop: DecodeState, settings: DecodeSettings, *,
                    mode: DecodeMode) -> DecodeState:
    """Decode loop calling ``CausalLM.__call__`` (stacked KVCache)."""
    model = nnx.merge(graphdef, state)

    def step_fn(cache, tokens, positions, index):
        return model(tokens, positions, jnp.ones(tokens.shape, bool), cache=cache, cache_index=index)

    return _decode_loop(step_fn, model.config.vocab_size, loop, settings, mode)


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("mode",), donate_argnums=(2,))
def _decode_unrolled(config, weights: dict, loop: DecodeState, settings: DecodeSettings, *,
                     mode: DecodeMode) -> DecodeState:
    """Decode loop over the unrolled weights (``unroll_params``) and a ``LayerCache``."""

    def step_fn(cache, tokens, positions, index):
        hidden, cache = forward_hidden(weights, config, tokens, positions,
                                       jnp.ones(tokens.shape, bool), cache, index)
        return lm_logits(weights, hidden), cache

    return _decode_loop(step_fn, config.vocab_size, loop, settings, mode)


def decode(model, weights: dict | None, loop: DecodeState, request: Request,
           config: SamplerConfig, graph_and_state=None) -> DecodeState:
    """Runs the decode loop from ``loop`` (donated, but for its key, which may be the
    caller's) on the unrolled ``weights`` (or through ``model.__call__`` when None)."""
    settings = request.settings(config, model.config.placeholder_token_ids)
    mode = request.mode()
    loop = loop.replace(key=jnp.array(loop.key, copy=True))
    mesh = make_mesh(config.mesh)
    if weights is not None:
        return _decode_unrolled(model.config, replicate(weights, mesh), loop, settings, mode=mode)
    graphdef, state = graph_and_state if graph_and_state is not None else nnx.split(model)
    return _decode_generic(graphdef, replicate(state, mesh), loop, settings, mode=mode)


def compiled_program_counts() -> dict[str, int]:
    """Executables JAX holds for the sampler's prefill and decode programs (its own compile
    caches, read only): a new entry per new shape bucket or static setting."""
    return {"prefill": _prefill._cache_size(),
            "decode": _decode_unrolled._cache_size() + _decode_generic._cache_size()}


# ------------------------------------------------------------------------- public API
@dataclasses.dataclass(frozen=True)
class SamplerOutput:
    """Host-side result of ``generate_tokens`` (R = number of prompts, N = max_new_tokens).

    tokens (R, N) int32 (``pad_id`` after a stop / past the end), logprobs (R, N) float32
    (0 past the end), lengths (R,) int32 generated tokens (stop token included),
    stopped (R,) bool (a stop token ended the row), steps: decode-loop iterations (forward
    passes) the call ran (fewer than max(lengths) when drafted tokens were accepted).
    """

    tokens: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray
    stopped: np.ndarray
    steps: int = 0

    def row(self, i: int) -> tuple[list[int], list[float]]:
        n = int(self.lengths[i])
        return self.tokens[i, :n].tolist(), self.logprobs[i, :n].tolist()

    @classmethod
    def from_state(cls, out: DecodeState, rows: int, request: Request) -> "SamplerOutput":
        """The first ``rows`` rows of a finished loop, fetched to the host."""
        n = request.max_new_tokens
        tokens, logprobs, lengths, stopped, steps = jax.device_get(
            (out.tokens, out.logprobs, out.lengths, out.stopped, out.step))
        tokens = np.asarray(tokens)[:rows, :n].copy()
        logprobs = np.asarray(logprobs)[:rows, :n].copy()
        lengths = np.asarray(lengths)[:rows]
        # Columns never reached (early exit) or past a row's end: pads.
        past = np.arange(n)[None, :] >= lengths[:, None]
        tokens[past] = request.pad_id
        logprobs[past] = 0.0
        return cls(tokens=tokens, logprobs=logprobs, lengths=lengths,
                   stopped=np.asarray(stopped)[:rows], steps=int(steps))


def generation_slots(context: int, request: Request) -> int:
    """Cache slots a row needs: its cached context plus every slot the loop may write."""
    return context + request.max_new_tokens + request.draft_len


def start_decode(model, prompts: list[list[int]], key: jax.Array, request: Request,
                 config: SamplerConfig, graph_and_state=None, weights=None, images=None):
    """Prefill of a call: (loop state before step 0, rows R, prompt bucket P).

    ``key``: one PRNG key or one per prompt (see :func:`row_keys`). ``weights`` selects the
    unrolled path (LayerCache); None the generic one (KVCache). ``images``: see
    :func:`generate_tokens`.
    """
    check_images(model, prompts, images)
    mcfg = model.config
    longest = max(len(p) for p in prompts)
    if longest + request.max_new_tokens > mcfg.max_position_embeddings:
        raise ValueError(
            f"prompt ({longest}) + max_new_tokens ({request.max_new_tokens}) exceeds the model's "
            f"max_position_embeddings ({mcfg.max_position_embeddings})"
        )
    nbucket = bucket_size(request.max_new_tokens, config.gen_buckets, config.min_gen_bucket,
                          "max_new_tokens")
    rows = len(prompts)
    batch = config.batch_size(rows)
    keys = row_keys(key, rows)
    if keys is not None:  # dummy rows reuse the first row's key (their draws are discarded)
        key = jnp.concatenate([keys, jnp.broadcast_to(keys[:1], (batch - rows,))])
    # rows share a prefill when their tokens and their image objects are the same
    prefill = prompts if images is None else [p + [id(im) for im in (row or ())] + [len(row or ())]
                                              for p, row in zip(prompts, images)]
    unique, source = unique_rows(prefill) if config.share_prefix else (prompts, None)
    mesh = make_mesh(config.mesh)  # rows split over the devices, weights on every one
    if source is not None and len(unique) < rows:
        first = np.unique(source, return_index=True)[1]  # the first row of each distinct prompt
        distinct = [prompts[i] for i in first]
        images = None if images is None else [images[i] for i in first]
        source = np.concatenate([source, np.zeros((batch - rows,), np.int32)])  # dummies: any row
        row_valid = np.arange(batch) < rows
        prefill_batch = config.batch_size(len(unique))
    else:
        distinct, source, prefill_batch = prompts, None, batch
    # a prefix common to every distinct prompt is prefilled once, the rest packed without
    # padding where that pays (text models, one device)
    text_only = all(hasattr(model, a) for a in ("arrays", "prefill")) and not hasattr(model, "multimodal_inputs")
    plen = bucket_size(longest, config.prompt_buckets, config.min_prompt_bucket, "prompt length")
    common, packed = (prefill_plan(distinct, plen, prefill_batch, config) if text_only and mesh is None
                      else (0, None))
    ids, mask, valid = left_pad([p[common:] for p in distinct], plen - common, prefill_batch, request.pad_id)
    if common:  # layout [common prefix | rest left-padded to P - common]: the prefix at the same slots in every row
        ids = np.concatenate([np.broadcast_to(np.asarray(distinct[0][:common], np.int32), (len(ids), common)), ids], 1)
        mask = np.concatenate([np.ones((len(ids), common), bool), mask], 1)
    if source is None:
        row_valid = valid
    elif packed is not None:
        packed = packed.for_rows(source)
    positions = vision = None
    if images is not None:
        positions, vision, _ = model.multimodal_inputs(ids, mask, list(images) + [None] * (len(ids) - len(images)))
    k = request.draft_len
    history = history_len = None
    if k:
        history, history_len = (jnp.asarray(x) for x in right_pad(
            prompts, plen + nbucket + k + 1, batch, request.pad_id))
    graphdef, state = graph_and_state if graph_and_state is not None else nnx.split(model)
    ids, mask, source, row_valid, history, history_len = (
        None if x is None else shard_batch(x, mesh) if mesh is not None else jnp.asarray(x)
        for x in (ids, mask, source, row_valid, history, history_len))
    loop = _prefill(graphdef, replicate(state, mesh), ids, mask, source, row_valid, replicate(key, mesh),
                    history, history_len, slots=plen + nbucket + k, width=nbucket + (k + 1 if k else 0),
                    per_layer=weights is not None, positions=positions, vision=vision, common=common,
                    packed=None if packed is None else jax.tree.map(jnp.asarray, packed))
    return loop, rows, plen


def check_images(model, prompts: Sequence[Sequence[int]], images) -> None:
    """Raises for images a call cannot take: a text-only model, one list per prompt missing,
    or a prompt that ends inside an image (decoding continues with text positions)."""
    if images is None:
        return
    if not hasattr(model, "multimodal_inputs"):
        raise TypeError(f"{type(model).__name__} is a text-only model: it takes no images")
    if len(images) != len(prompts):
        raise ValueError(f"{len(images)} image lists for {len(prompts)} prompts")
    image_id = model.config.image_token_id
    if any(p[-1] == image_id for p in prompts):
        raise ValueError("a prompt with images must end with text, not an image token")


def generate_tokens(
    model,
    prompts: Sequence[Sequence[int]],
    key: jax.Array,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    stop_token_ids: Sequence[int] = (),
    min_new_tokens: int = 0,
    pad_id: int = 0,
    logprobs_mode: str = "raw",
    config: SamplerConfig = SamplerConfig(),
    graph_and_state: tuple[Any, Any] | None = None,
    weights: dict | None = None,
    prompt_lookup: PromptLookup | None = None,
    images: Sequence[Sequence[Any] | None] | None = None,
) -> SamplerOutput:
    """Samples continuations of token-id prompts with the jitted KV-cache sampler.

    Args:
      model: a ``jax_drive.models.CausalLM`` (nnx module with a ``config``).
      prompts: R non-empty token-id lists (any lengths; left-padded here).
      key: PRNG key, or R keys (a (R,) key array): row r then samples from ``key[r]`` only,
        whatever the other rows. Equal keys and inputs give equal outputs.
      max_new_tokens, temperature, top_p, top_k, stop_token_ids, min_new_tokens,
      logprobs_mode: see ``SamplingParams`` (temperature 0 = greedy).
      pad_id: token id used for padding (inputs and outputs).
      config: shape bucketing and prefix sharing.
      graph_and_state: ``nnx.split(model)`` when the caller already has it.
      weights: the model's unrolled decode weights when the caller keeps them
        (``DecodeWeightCache``); built here when None and ``config.unroll_layers``.
      prompt_lookup: speculative decoding by prompt lookup (None: one token per step).
        Greedy outputs are unchanged; sampled ones keep their distribution, not their values.
      images: for a vision-language model, per prompt the processed images whose
        ``<|image_pad|>`` tokens (already expanded) the prompt holds, in reading order (None
        or empty for a text-only prompt); the model lays them out (``multimodal_inputs``).

    Returns:
      SamplerOutput with (R, max_new_tokens) arrays.
    """
    prompts = [list(map(int, p)) for p in prompts]
    if not prompts:
        raise ValueError("no prompts")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    request = Request(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                      top_k=top_k, stop_token_ids=tuple(int(s) for s in stop_token_ids),
                      min_new_tokens=min_new_tokens, pad_id=pad_id, logprobs_mode=logprobs_mode,
                      prompt_lookup=prompt_lookup)
    request.check(model.config.vocab_size)
    check_token_ids(prompts, model.config.vocab_size)
    if config.unroll_layers and weights is None:
        weights = unrolled_weights(model)
    elif not config.unroll_layers:
        weights = None
    graph_and_state = graph_and_state if graph_and_state is not None else nnx.split(model)
    loop, rows, _ = start_decode(model, prompts, key, request, config, graph_and_state, weights, images)
    out = decode(model, weights, loop, request, config, graph_and_state)
    return SamplerOutput.from_state(out, rows, request)
