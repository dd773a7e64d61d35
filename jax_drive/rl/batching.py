"""Token batches for training: length bucketing and padding of token rows
(:class:`jax_drive.data.tokens.TokenRow`: ids and per-token loss weights). Rows are
right-padded to a bucketed length. The model predicts token ``t + 1`` from the prefix up to
``t``, so the arrays given to the loss are shifted:

* ``input_ids[b, t] = ids[t]``, ``targets[b, t] = ids[t + 1]``;
* ``loss_mask[b, t] = weight[t + 1]`` (the target's weight);
* ``attention_mask`` marks real tokens, ``positions = cumsum(mask) - 1`` (0 on padding).

Rows of a vision-language policy also carry their images (``TokenRow.images``, each
``<|image_pad|>`` run already expanded): :func:`add_images` then replaces ``positions`` by
rows-first M-RoPE positions (B, 3, L) and adds a per-row ``vision`` layout, so a batch still
splits into mini-batches by rows; :func:`batch_token_logprobs` feeds either kind of batch
to the model.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.data.tokens import TokenRow
from jax_drive.sampling.grammar.tables import allowed_classes, replay_states, token_allowed
from kernels import AllowedTokens


def bucket_length(n: int, bucket_size: int, max_length: int | None = None) -> int:
    """Smallest multiple of ``bucket_size`` >= n (capped at max_length rounded up)."""
    length = -(-max(n, 1) // bucket_size) * bucket_size
    if max_length is not None:
        length = min(length, -(-max_length // bucket_size) * bucket_size)
    return length


def pad_rows(rows: Sequence[TokenRow], length: int, pad_id: int, extra: dict[str, Sequence[np.ndarray]] | None = None,
             num_rows: int | None = None) -> dict[str, np.ndarray]:
    """Right-pads rows into shifted training arrays of shape (B, length).

    Args:
      rows: B rows (truncated to ``length + 1`` tokens).
      length: padded length L of the model inputs.
      pad_id: padding token id.
      extra: optional per-token float arrays aligned with each row's ``ids`` (e.g. sampling
        log-probs, advantages); they are shifted like ``weight`` (value of the target token).
      num_rows: pad the batch itself to this many rows (all-padding rows, zero mask).
    Returns:
      dict with input_ids, targets (B, L) int32, attention_mask (B, L) bool,
      positions (B, L) int32, loss_mask (B, L) float32 and every key of ``extra`` (B, L).
    """
    b = len(rows) if num_rows is None else num_rows
    if b < len(rows):
        raise ValueError(f"num_rows {num_rows} < {len(rows)} rows")
    ids = np.full((b, length + 1), pad_id, np.int32)
    weight = np.zeros((b, length + 1), np.float32)
    real = np.zeros((b, length + 1), bool)
    extras = {k: np.zeros((b, length + 1), np.float32) for k in (extra or {})}
    for i, row in enumerate(rows):
        n = min(len(row), length + 1)
        ids[i, :n] = row.ids[:n]
        weight[i, :n] = row.weight[:n]
        real[i, :n] = True
        for k, values in (extra or {}).items():
            extras[k][i, :n] = np.asarray(values[i], np.float32)[:n]
    attention = real[:, :-1]
    out = {
        "input_ids": ids[:, :-1],
        "targets": ids[:, 1:],
        "attention_mask": attention,
        "positions": np.maximum(np.cumsum(attention, axis=1) - 1, 0).astype(np.int32),
        "loss_mask": weight[:, 1:] * real[:, 1:],
    }
    for k, v in extras.items():
        out[k] = v[:, 1:]
    return out


# ----------------------------------------------------------------------------- images
def add_images(batch: dict, rows: Sequence[TokenRow], model) -> dict:
    """``batch`` (:func:`pad_rows` of ``rows``, maybe padded with empty rows) with the rows'
    images: ``positions`` becomes rows-first M-RoPE positions (B, 3, L) and ``vision`` a
    per-row layout (``model.row_inputs``). Unchanged when no row has images."""
    images = [tuple(r.images) for r in rows]
    if not any(images):
        return batch
    if not hasattr(model, "row_inputs"):
        raise TypeError(f"{type(model).__name__} is a text-only model: its rows cannot hold images")
    images += [()] * (batch["input_ids"].shape[0] - len(rows))
    positions, vision = model.row_inputs(batch["input_ids"], batch["attention_mask"], images)
    return {**batch, "positions": np.moveaxis(np.asarray(positions), 0, 1), "vision": vision}


GRAMMAR_KEYS = ("turn_id", "grammar_id", "grammar_budget")  # a batch's per-row grammar data


def answer_allowed(tables, batch: dict) -> tuple[AllowedTokens, jax.Array]:
    """The tokens the sampler's grammar mask allowed at each target of a training batch.

    Each answer (a run of targets with the same ``turn_id`` >= 0; a session turn) restarts its
    row's automaton at state 0 with the row's budget, and the states are replayed from the
    targets (``grammar.replay_states``), so the log-softmax runs over exactly the tokens the
    sampler allowed, the finish-in-budget rule included. Targets outside answers are unmasked.

    Args:
      tables: ``GrammarTables`` of the rollout's grammars (the same compiled automata).
      batch: ``targets``, ``turn_id`` (B, L) int (-1 off answers), ``grammar_id`` (B,) int32,
        ``grammar_budget`` (B,) int32 (``max_new_tokens`` per turn).
    Returns:
      (``kernels.AllowedTokens`` for the targets, (B,) bool: the row's tokens were all legal).
      A row with a token its grammar refuses (an answer from a server whose automaton spells
      text differently) is scored unmasked rather than with log-prob -inf.
    """
    turn = jnp.asarray(batch["turn_id"], jnp.int32)
    answer = turn >= 0
    starts = answer & (turn != jnp.pad(turn[:, :-1], ((0, 0), (1, 0)), constant_values=-1))
    grammar = jnp.asarray(batch["grammar_id"], jnp.int32)
    targets = jnp.asarray(batch["targets"], jnp.int32)
    states, remaining = replay_states(tables, grammar, targets, batch["grammar_budget"], starts)
    legal = jnp.all(token_allowed(tables, grammar[:, None], states, remaining, targets) | ~answer, axis=1)
    classes = allowed_classes(tables, grammar[:, None], states, remaining)
    classes = classes | ~(answer & legal[:, None])[..., None]
    return AllowedTokens(classes, tables.token_class, jnp.broadcast_to(grammar[:, None], turn.shape)), legal


def batch_token_logprobs(model, batch: dict, chunk_size: int = 256, temperature: float = 1.0, grammar=None):
    """(B, L) ``model.token_logprobs`` of a training batch's targets (with its images, if any).

    grammar: the rollout's ``GrammarTables`` when its answers were sampled under grammars; the
    batch then carries :data:`GRAMMAR_KEYS` and every answer token is scored under the masked
    policy (:func:`answer_allowed`; a forced token has log-prob 0 and no gradient).
    """
    positions, extra = batch["positions"], {}
    if "vision" in batch:
        positions, extra = jnp.moveaxis(positions, 1, 0), {"vision": batch["vision"]}
    if grammar is not None:
        extra["allowed"] = answer_allowed(grammar, batch)[0]
    return model.token_logprobs(batch["input_ids"], positions, batch["attention_mask"], batch["targets"],
                                chunk_size=chunk_size, temperature=temperature, **extra)


def bucketed_batches(lengths: Sequence[int], batch_size: int, rng: np.random.Generator,
                     pool_batches: int = 16, shuffle: bool = True) -> list[np.ndarray]:
    """Index batches grouped by similar length (less padding, few distinct shapes).

    Indices are shuffled, cut into pools of ``pool_batches * batch_size``, each pool sorted by
    length and cut into batches; the batch order is shuffled again. Every index appears once;
    the last batch may be smaller.
    """
    n = len(lengths)
    order = rng.permutation(n) if shuffle else np.arange(n)
    lengths = np.asarray(lengths)
    batches = []
    pool = max(1, pool_batches) * batch_size
    for start in range(0, n, pool):
        chunk = order[start:start + pool]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches.extend(chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size))
    if shuffle:
        perm = rng.permutation(len(batches))
        batches = [batches[i] for i in perm]
    return batches


def iterate_epochs(num_items: int, lengths: Sequence[int], batch_size: int, seed: int, shuffle: bool = True) -> Iterable[tuple[int, np.ndarray]]:
    """Endless (epoch, index batch) stream, deterministic in (seed, epoch)."""
    epoch = 0
    while True:
        rng = np.random.default_rng([seed, epoch])
        for batch in bucketed_batches(lengths, batch_size, rng, shuffle=shuffle):
            yield epoch, batch
        epoch += 1
