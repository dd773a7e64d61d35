"""Request planning: how one sampler call (or one session turn) lays out its rows.

:func:`plan_prefill` is a pure function of the prompts, the request and the sampler config
(no model, no device work) returning a frozen :class:`PrefillPlan`: the bucketed prompt
length ``P``, generation bucket ``N`` and batch ``B``; which rows repeat another row's prompt
(those are prefilled once and their cache rows broadcast); the prefix every distinct prompt
shares (prefilled once for the whole call); whether the rest is packed several to a row
(``packing``) or left-padded; and the host arrays the prefill program takes.
:func:`plan_continuation` does the same for a session turn (``ContinuationPlan``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from jax_drive.parallel import make_mesh
from jax_drive.sampling.packing import PackedPrompts, pack_prompt_parts
from jax_drive.sampling.request import Request
from jax_drive.sampling.shapes import SamplerConfig, bucket_size, grid_down, left_pad, next_power_of_two, right_pad
from jax_drive.sampling.state import output_width

MIN_COMMON_PREFIX = 16  # shorter common prefixes are not worth a separate prefill pass
# Left-padded prefills only: the rows' own parts then attend over all cache slots instead of
# causally in blocks over the prompt alone (up to ~2x the attention work at long prompts), so
# a shared part under this fraction of the longest prompt would cost more than it saves.
# Packed parts attend to the prefix and their own piece only: any shared part pays there.
MIN_COMMON_FRACTION = 0.25


def unique_rows(rows: Sequence[Sequence[int]]) -> tuple[list[list[int]], np.ndarray]:
    """Distinct token lists in first-seen order, and for each row the index of its list.

    Returns: (unique lists, source (R,) int32) with ``rows[r] == unique[source[r]]``.
    """
    index: dict[tuple[int, ...], int] = {}
    source = np.asarray([index.setdefault(tuple(r), len(index)) for r in rows], np.int32)
    return [list(r) for r in index], source


def common_prefix_length(rows: Sequence[Sequence[int]], min_fraction: float = MIN_COMMON_FRACTION) -> int:
    """Tokens that every one of >= 2 rows starts with and that the call prefills once:
    their longest common prefix, leaving each row at least one token of its own, rounded
    down on the grid (``shapes.grid_down``: the prefill compiles once per value, and at most a
    third of the shared part is given up); 0 below :data:`MIN_COMMON_PREFIX` tokens or
    ``min_fraction`` of the longest row (a left-padded prefill: :data:`MIN_COMMON_FRACTION`;
    a packed one: 0), or with fewer than two rows."""
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


def generation_slots(context: int, request: Request) -> int:
    """Cache slots a row needs: its cached context plus every slot the loop may write."""
    return context + request.max_new_tokens + request.draft_len


@dataclasses.dataclass(frozen=True, eq=False)
class PrefillPlan:
    """The layout of one sampler call (R prompt rows, B loop rows, U prefill rows).

    Attributes:
      rows: R, the real rows; batch: B >= R (dummy rows pad it to its bucket and to the mesh).
      prompt_len: P, the prompt bucket (the cache's first P - 1 slots hold the prompt, the
        last prompt token is the first decode step's input).
      gen_len: N, the generation bucket; draft_len: K, drafts per step (0: no prompt lookup).
      common: C, leading columns shared by every prefill row (prefilled once; 0: none).
      prefill_rows: the prompt row behind each prefill row (the first row of each distinct
        prompt when rows repeat prompts, else every row).
      source: (B,) int32, the prefill row of each loop row, or None when the prefill rows are
        the loop rows.
      ids, mask: (U, P) int32 / bool, the prefill rows [common prefix | rest left-padded].
      row_valid: (B,) bool, False for dummy rows.
      packed: the columns C .. P - 2 packed without padding (seen from the loop rows), or None.
      history, history_len: (B, T) int32 / (B,) int32, each row's prompt for prompt lookup
        (None without).
    """

    rows: int
    batch: int
    prompt_len: int
    gen_len: int
    draft_len: int
    common: int
    prefill_rows: tuple[int, ...]
    source: np.ndarray | None
    ids: np.ndarray
    mask: np.ndarray
    row_valid: np.ndarray
    packed: PackedPrompts | None
    history: np.ndarray | None
    history_len: np.ndarray | None

    @property
    def slots(self) -> int:
        """Cache slots S = P + N + K."""
        return self.prompt_len + self.gen_len + self.draft_len

    @property
    def width(self) -> int:
        """Output columns of the loop state."""
        return output_width(self.gen_len, self.draft_len)


def plan_prefill(prompts: Sequence[Sequence[int]], request: Request, config: SamplerConfig, *,
                 max_positions: int, packable: bool = True,
                 share_keys: Sequence[Sequence[int]] | None = None) -> PrefillPlan:
    """Plans the prefill of ``prompts`` (R non-empty token lists).

    Args:
      max_positions: the model's ``max_position_embeddings``.
      packable: the model may prefill a common prefix and packed parts (text models; the
        plan also needs a single device).
      share_keys: per prompt, what must be equal for two rows to share a prefill (default:
        their tokens; prompts with images add the images' identities).
    Raises:
      ValueError: a prompt plus ``max_new_tokens`` beyond ``max_positions``, or a length
        beyond the largest fixed bucket.
    """
    longest = max(len(p) for p in prompts)
    if longest + request.max_new_tokens > max_positions:
        raise ValueError(
            f"prompt ({longest}) + max_new_tokens ({request.max_new_tokens}) exceeds the model's "
            f"max_position_embeddings ({max_positions})"
        )
    gen_len = config.gen_bucket(request.max_new_tokens)
    rows = len(prompts)
    batch = config.batch_size(rows)
    source = unique_rows(prompts if share_keys is None else share_keys)[1] if config.share_prefix else None
    if source is not None and source.max() + 1 < rows:
        prefill_rows = tuple(int(i) for i in np.unique(source, return_index=True)[1])  # first row of each
        source = np.concatenate([source, np.zeros((batch - rows,), np.int32)])  # dummies: any row
        prefill_batch = config.batch_size(len(prefill_rows))
    else:
        prefill_rows, source, prefill_batch = tuple(range(rows)), None, batch
    distinct = [list(prompts[i]) for i in prefill_rows]
    plen = config.prompt_bucket(longest)
    common, packed = (prefill_plan(distinct, plen, prefill_batch, config)
                      if packable and make_mesh(config.mesh) is None else (0, None))
    ids, mask, valid = left_pad([p[common:] for p in distinct], plen - common, prefill_batch, request.pad_id)
    if common:  # layout [common prefix | rest left-padded to P - common]: the prefix at the same slots in every row
        ids = np.concatenate([np.broadcast_to(np.asarray(distinct[0][:common], np.int32), (len(ids), common)), ids], 1)
        mask = np.concatenate([np.ones((len(ids), common), bool), mask], 1)
    row_valid = valid if source is None else np.arange(batch) < rows
    if packed is not None and source is not None:
        packed = packed.for_rows(source)
    k = request.draft_len
    history = history_len = None
    if k:
        history, history_len = right_pad(prompts, plen + gen_len + k + 1, batch, request.pad_id)
    return PrefillPlan(rows=rows, batch=batch, prompt_len=plen, gen_len=gen_len, draft_len=k, common=common,
                       prefill_rows=prefill_rows, source=source, ids=ids, mask=mask, row_valid=row_valid,
                       packed=packed, history=history, history_len=history_len)


@dataclasses.dataclass(frozen=True, eq=False)
class ContinuationPlan:
    """The layout of one session turn for one device batch (R continuing rows, B loop rows).

    Attributes:
      rows: R; batch: B; gen_len: N; draft_len: K.
      take: (B,) int32, the kept cache row each loop row continues.
      chunk, chunk_len: (B, A) int32 right-padded / (B,) int32: the tokens written into the
        cache this turn (the pending token, then the appended ones but the last).
      slot: (B,) int64, where each row's chunk starts (its pending token's slot).
      position: (B,) int64, the RoPE position of each chunk's first token.
      pending: (B,) int32, the token the first decode step feeds (the last appended one).
      slots: the cache length for the turn.
      history, history_len: the rows' whole contexts for prompt lookup (None without).
    """

    rows: int
    batch: int
    gen_len: int
    draft_len: int
    take: np.ndarray
    chunk: np.ndarray
    chunk_len: np.ndarray
    slot: np.ndarray
    position: np.ndarray
    pending: np.ndarray
    slots: int
    history: np.ndarray | None
    history_len: np.ndarray | None

    @property
    def start(self) -> np.ndarray:
        """(B,) the slot of each row's pending token after the chunk is written."""
        return self.slot + self.chunk_len

    @property
    def width(self) -> int:
        return output_width(self.gen_len, self.draft_len)


def plan_continuation(contexts: Sequence[Sequence[int]], appended: Sequence[Sequence[int]], take: Sequence[int],
                      slot: Sequence[int], shift: Sequence[int], request: Request,
                      config: SamplerConfig) -> ContinuationPlan:
    """Plans a session turn of R rows kept in one device batch.

    Args:
      contexts: per row, its tokens so far (the last one pending: fed, not yet cached).
      appended: per row, the tokens that follow (may be empty).
      take: per row, its row in the kept cache; slot: its pending token's cache slot.
      shift: per row, the RoPE position of a context token minus its index (0 for text).
    """
    rows = len(contexts)
    batch = config.batch_size(rows)
    # cache [pending] + appended[:-1] from the pending token's slot on; appended[-1] is pending next
    chunks = [[c[-1]] + list(a[:-1]) if a else [] for c, a in zip(contexts, appended)]
    width = max(len(c) for c in chunks)
    width = bucket_size(width, None, config.min_prompt_bucket, "appended tokens") if width else 0
    chunk, chunk_len = right_pad(chunks, width, batch, request.pad_id)
    slots_at = np.zeros((batch,), np.int64)
    slots_at[:rows] = slot
    position = np.zeros((batch,), np.int64)
    position[:rows] = [len(c) - 1 + s for c, s in zip(contexts, shift)]
    start = slots_at + chunk_len
    needed = max(int((slots_at + width).max()), generation_slots(int(start.max()), request))
    take_rows = np.zeros((batch,), np.int32)
    take_rows[:rows] = take
    after = [list(c) + list(a) for c, a in zip(contexts, appended)]
    pending = np.full((batch,), request.pad_id, np.int32)
    pending[:rows] = [c[-1] for c in after]
    gen_len, k = config.gen_bucket(request.max_new_tokens), request.draft_len
    history = history_len = None
    if k:
        longest = max(len(c) for c in after)
        history, history_len = right_pad(after, next_power_of_two(longest) + gen_len + k + 1, batch, request.pad_id)
    return ContinuationPlan(rows=rows, batch=batch, gen_len=gen_len, draft_len=k, take=take_rows, chunk=chunk,
                            chunk_len=chunk_len, slot=slots_at, position=position, pending=pending,
                            slots=bucket_size(needed, None, 16, "cache slots"), history=history,
                            history_len=history_len)
