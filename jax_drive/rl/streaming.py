"""Log-probs of finished rollouts, streamed and with shared prompts (MTDrive's IPSS / IPTC).

MTDrive (section 3.4) removes two data-movement overheads of its veRL trainer:

* **IPSS** (inter-process streaming serialisation): rollouts finish at different times, so
  each finished one is processed by a thread pool while the others still generate, instead
  of the whole batch after the last one.
* **IPTC** (intra-process tensor cache): the log-prob recomputation, the reference model
  and the actor share inputs; IPTC computes them once and keeps them on the device.

In our single-process JAX trainer there is no serialisation; the work after a rollout that
can move or be shared is the **pi_old and pi_ref log-probs** of every row
(``recompute_old_logprobs``, the KL term). :class:`RowLogprobs` computes them

* as rows finish (``background=True``, IPSS): ``run_rollouts(on_finished=...)`` hands over
  the rows that stopped at turn j, and a worker thread scores them while turn j + 1
  generates;
* with each group's prompt computed once (``share_prefix=True``, IPTC): the G rows of a
  group start with the same turn-1 prompt, so its keys / values are computed once per group
  and model (and kept until the group's last row is scored), and each row only runs its own
  suffix (generated turns and feedback) on top of that cache.

Both give the log-probs of the plain path (one padded batch after the rollout) up to float
rounding (tested to 1e-5). A row's prefix is its prompt minus the last token (the one that
predicts the first generated token), so every scored position is in its suffix.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.configs import above, at_least
from jax_drive.models.layers import KVCache, init_cache, positions_from_mask
from jax_drive.models.transformer import forward_hidden, head_token_logprobs
from jax_drive.data.tokens import TokenRow
from jax_drive.rl.batching import bucket_length, pad_rows
from jax_drive.rl.optim import make_eval_fn


@dataclasses.dataclass(frozen=True)
class StreamConfig:
    """How :class:`RowLogprobs` computes.

    Attributes:
      background: score rows in a worker thread as they are submitted (IPSS); False: keep
        them and score everything in ``results()`` (one call per model).
      share_prefix: compute each group's prompt once per model (IPTC); False: whole rows.
      group_size: G, rows per group (row r belongs to group r // G).
      bucket_size: padded lengths are multiples of this (prompt and suffix separately).
      chunk_size: tokens per LM-head chunk (``head_token_logprobs``).
      temperature: log-probs under softmax(logits / T) (the rollout's sampling temperature).
    """

    background: bool = True
    share_prefix: bool = True
    group_size: int = 8
    bucket_size: int = 128
    chunk_size: int = 256
    temperature: float = 1.0

    def __post_init__(self):
        at_least(self, 1, "group_size", "bucket_size", "chunk_size")
        above(self, 0, "temperature")


def prompt_length(turn_ids: np.ndarray) -> int:
    """Tokens before the first generated one (turn id >= 0); the whole row if none."""
    generated = np.flatnonzero(np.asarray(turn_ids) >= 0)
    return int(generated[0]) if generated.size else int(len(turn_ids))


def row_batch_size(rows: int) -> int:
    """Rows of a compiled call: the next power of two (few distinct shapes)."""
    return 1 << max(0, rows - 1).bit_length()


# ------------------------------------------------------------------- pure functions
def prefix_cache(params: dict, config, ids: jax.Array, mask: jax.Array) -> KVCache:
    """Keys / values of U right-padded prefixes: ids, mask (U, P) -> KVCache (NL, U, P, Nk, D)
    (slots of padding masked out)."""
    cache = init_cache(config, ids.shape[0], ids.shape[1])
    positions = positions_from_mask(mask)
    _, cache = forward_hidden(params, config, ids, positions, mask, cache, jnp.int32(0), empty_cache=True)
    return cache


def suffix_logprobs(params: dict, config, cache: KVCache, ids: jax.Array, positions: jax.Array,
                    mask: jax.Array, targets: jax.Array, chunk_size: int, temperature: float) -> jax.Array:
    """(R, L) log p(targets) of R suffixes that continue cached prefixes.

    cache: (NL, R, P, Nk, D) prefix keys / values (row r's prefix); ids, positions, mask,
    targets: (R, L) right-padded suffixes, positions continuing each row's prefix. The
    suffix is written at slots [P, P + L) and attends to the real prefix slots and itself.
    """
    p, l = cache.k.shape[2], ids.shape[1]
    grow = ((0, 0), (0, 0), (0, l), (0, 0), (0, 0))
    cache = KVCache(k=jnp.pad(cache.k, grow), v=jnp.pad(cache.v, grow), mask=jnp.pad(cache.mask, ((0, 0), (0, l))))
    hidden, _ = forward_hidden(params, config, ids, positions, mask, cache, jnp.int32(p))
    return head_token_logprobs(params, hidden, targets, chunk_size, temperature)


def rows_to_batch(values: Sequence[np.ndarray], length: int, num_rows: int) -> np.ndarray:
    """Per-row values aligned with each row's tokens -> (num_rows, length) aligned with the
    training batch's targets (``out[i, t] = values[i][t + 1]``, 0 beyond the row)."""
    out = np.zeros((num_rows, length), np.float32)
    for i, v in enumerate(values):
        n = min(len(v) - 1, length)
        out[i, :n] = np.asarray(v, np.float32)[1:n + 1]
    return out


@functools.lru_cache(maxsize=8)
def _programs(graphdef, chunk_size: int, temperature: float):
    """Jitted ``(prefix(params, rest, batch), suffix(params, rest, batch))`` per model
    structure and settings, reused by every step's RowLogprobs (as the trainer's own step)."""
    prefix = make_eval_fn(graphdef, lambda m, b: prefix_cache(m.arrays(), m.config, b["ids"], b["mask"]))
    suffix = make_eval_fn(graphdef, lambda m, b: suffix_logprobs(
        m.arrays(), m.config, b["cache"], b["ids"], b["positions"], b["mask"], b["targets"], chunk_size, temperature))
    return prefix, suffix


# ------------------------------------------------------------------------- the class
@dataclasses.dataclass
class _Row:
    index: int
    ids: np.ndarray
    prompt: int  # prompt_length of the row


class RowLogprobs:
    """Scores rollout rows under several policies as they are submitted.

    Args:
      graphdef, rest: the split model (``jax_drive.rl.optim.split_model``).
      policies: name -> trainable state (e.g. {'old_logp': params, 'ref_logp': ref_params}).
      config: StreamConfig.
      logp_fn: jitted ``f(params, rest, batch) -> (B, L)`` log-probs of a padded batch (the
        trainer's own, for the unshared path).

    ``submit(rows, transcripts)`` is ``run_rollouts``' ``on_finished`` hook; ``results()``
    waits for the work and returns, per policy, one array per row (by row index) aligned
    with the row's tokens (entry t = log p(token t | tokens < t); entries of the prompt are 0 with
    ``share_prefix``, since no loss is put on them).
    """

    def __init__(self, graphdef, rest, policies: Mapping[str, Any], config: StreamConfig,
                 logp_fn: Callable):
        if not policies:
            raise ValueError("no policies to score")
        self.rest = rest
        self.policies = dict(policies)
        self.config = config
        self.logp_fn = logp_fn
        self._prefix_fn, self._suffix_fn = _programs(graphdef, config.chunk_size, config.temperature)
        self._values: dict[str, dict[int, np.ndarray]] = {name: {} for name in self.policies}
        self._prefixes: dict[tuple[str, int], tuple[jax.Array, jax.Array, jax.Array]] = {}
        self._pending_rows: dict[int, int] = {}  # group -> rows not scored yet
        self._deferred: list[_Row] = []
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="row-logprobs") \
            if config.background else None
        self._futures: list[concurrent.futures.Future] = []
        self.compute_seconds = 0.0  # time spent scoring (worker or results())
        self.wait_seconds = 0.0  # time results() blocked the caller

    # ------------------------------------------------------------------ intake
    def submit(self, rows: Sequence[int], transcripts: Sequence[Any]) -> None:
        """Queues finished rows (indices r = s * G + g and their ``Transcript``s)."""
        items = [_Row(int(r), np.asarray(t.tokens, np.int32), prompt_length(t.turn_ids))
                 for r, t in zip(rows, transcripts)]
        if not items:
            return
        if self._pool is None:
            self._deferred.extend(items)
        else:
            self._futures.append(self._pool.submit(self._score, items))

    def results(self) -> dict[str, dict[int, np.ndarray]]:
        """Waits for every submitted row; per policy, row index -> the row's array."""
        t0 = time.perf_counter()
        if self._deferred:
            items, self._deferred = self._deferred, []
            self._score(items)
        for future in self._futures:
            future.result()  # re-raises a worker's exception
        self._futures = []
        self.wait_seconds += time.perf_counter() - t0
        return {name: dict(values) for name, values in self._values.items()}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    # ------------------------------------------------------------------- work
    def _score(self, items: list[_Row]) -> None:
        t0 = time.perf_counter()
        self._score_policies(items)
        self.compute_seconds += time.perf_counter() - t0

    def _score_policies(self, items: list[_Row]) -> None:
        for name, params in self.policies.items():
            if self.config.share_prefix:
                values = self._score_shared(name, params, items)
            else:
                values = self._score_whole(params, items)
            for item, v in zip(items, values):
                self._values[name][item.index] = v
        if self.config.share_prefix:
            self._release(items)

    def _score_whole(self, params, items: list[_Row]) -> list[np.ndarray]:
        cfg = self.config
        length = bucket_length(max(len(i.ids) for i in items) - 1, cfg.bucket_size)
        rows = [TokenRow(i.ids, np.ones(len(i.ids), np.float32)) for i in items]
        batch = pad_rows(rows, length, 0, num_rows=row_batch_size(len(items)))
        keys = ("input_ids", "targets", "positions", "attention_mask")
        logp = np.asarray(self.logp_fn(params, self.rest, {k: jnp.asarray(batch[k]) for k in keys}))
        out = []
        for b, item in enumerate(items):
            v = np.zeros(len(item.ids), np.float32)
            v[1:] = logp[b, :len(item.ids) - 1]
            out.append(v)
        return out

    def _group_prefix(self, name: str, params, items: list[_Row]) -> dict[int, tuple]:
        """(k, v, mask) of each item's group prefix under ``params``, computing the missing
        ones in one call."""
        g_ = self.config.group_size
        missing = {}
        for item in items:
            group = item.index // g_
            if (name, group) not in self._prefixes and group not in missing:
                missing[group] = item.ids[:max(item.prompt - 1, 0)]
        if missing:
            groups = list(missing)
            width = bucket_length(max(max(len(p) for p in missing.values()), 1), self.config.bucket_size)
            batch = row_batch_size(len(groups))
            ids = np.zeros((batch, width), np.int32)
            mask = np.zeros((batch, width), bool)
            for u, g in enumerate(groups):
                ids[u, :len(missing[g])] = missing[g]
                mask[u, :len(missing[g])] = True
            cache = self._prefix_fn(params, self.rest, {"ids": jnp.asarray(ids), "mask": jnp.asarray(mask)})
            for u, g in enumerate(groups):
                self._prefixes[(name, g)] = (cache.k[:, u], cache.v[:, u], cache.mask[u])
        return {item.index // g_: self._prefixes[(name, item.index // g_)] for item in items}

    def _score_shared(self, name: str, params, items: list[_Row]) -> list[np.ndarray]:
        cfg = self.config
        prefixes = self._group_prefix(name, params, items)
        width = max(k.shape[1] for k, _, _ in prefixes.values())
        batch = row_batch_size(len(items))
        starts = [max(i.prompt - 1, 0) for i in items]
        length = bucket_length(max(len(i.ids) - 1 - s for i, s in zip(items, starts)), cfg.bucket_size)
        ids = np.zeros((batch, length), np.int32)
        targets = np.zeros((batch, length), np.int32)
        mask = np.zeros((batch, length), bool)
        positions = np.zeros((batch, length), np.int32)
        for b, (item, s) in enumerate(zip(items, starts)):
            n = len(item.ids) - 1 - s
            ids[b, :n] = item.ids[s:-1]
            targets[b, :n] = item.ids[s + 1:]
            mask[b, :n] = True
            positions[b] = s + np.arange(length)

        def padded(x, axis):  # a group's prefix widened to the call's prefix width
            pad = [(0, 0)] * x.ndim
            pad[axis] = (0, width - x.shape[axis])
            return jnp.pad(x, pad)

        parts = [prefixes[item.index // cfg.group_size] for item in items]
        parts += [parts[0]] * (batch - len(items))  # dummy rows
        cache = KVCache(k=jnp.stack([padded(k, 1) for k, _, _ in parts], axis=1),
                        v=jnp.stack([padded(v, 1) for _, v, _ in parts], axis=1),
                        mask=jnp.stack([padded(m, 0) for _, _, m in parts], axis=0))
        logp = np.asarray(self._suffix_fn(params, self.rest, {
            "cache": cache, "ids": jnp.asarray(ids), "positions": jnp.asarray(positions),
            "mask": jnp.asarray(mask), "targets": jnp.asarray(targets)}))
        out = []
        for b, (item, s) in enumerate(zip(items, starts)):
            v = np.zeros(len(item.ids), np.float32)
            v[s + 1:] = logp[b, :len(item.ids) - 1 - s]
            out.append(v)
        return out

    def _release(self, items: list[_Row]) -> None:
        """Drops the prefix caches of groups whose G rows are all scored."""
        g_ = self.config.group_size
        for item in items:
            group = item.index // g_
            left = self._pending_rows.get(group, g_) - 1
            self._pending_rows[group] = left
            if left == 0:
                for name in self.policies:
                    self._prefixes.pop((name, group), None)
