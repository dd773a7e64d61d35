"""Token batches for training: tokenised chat samples, length bucketing and padding.

A training row is a token sequence ``ids`` (length n) and a per-token ``weight`` mask of the
same length marking the tokens that carry loss (assistant tokens in SFT, generated tokens in
RL). Rows are right-padded to a bucketed length. The model predicts token ``t + 1`` from the
prefix up to ``t``, so the arrays given to the loss are shifted:

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

import dataclasses
import json
import os
from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.sampling.grammar.tables import allowed_classes, replay_states, token_allowed
from kernels import AllowedTokens


@dataclasses.dataclass(frozen=True)
class TokenRow:
    """One tokenised sample. ids, weight: (n,) int32 / float32; images: the processed images
    whose (expanded) pad tokens ``ids`` holds, in reading order (empty for text)."""

    ids: np.ndarray
    weight: np.ndarray
    images: tuple = ()

    def __len__(self) -> int:
        return int(self.ids.shape[0])


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
def with_images(row: TokenRow, images: Sequence, tokenizer) -> TokenRow:
    """A row tokenised with one ``<|image_pad|>`` per image (``ImageTokenizer.encode``) with
    its processed images attached and each pad expanded to its image's token count
    (``tokenizer.expand``; the weight is repeated with its token)."""
    if not images:
        return row
    if not hasattr(tokenizer, "expand"):
        raise TypeError("a row with images needs an image tokenizer (jax_drive.models.qwen2_5_vl.ImageTokenizer)")
    ids, weight = tokenizer.expand(row.ids, images, row.weight)
    return TokenRow(np.asarray(ids, np.int32), np.asarray(weight, np.float32), tuple(images))


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


# ----------------------------------------------------------------------------- chat samples
TRAIN_ON = ("all", "last")  # which assistant messages of a chat sample carry loss

def _check_messages(messages: Any) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise ValueError("a chat sample is a non-empty list of {'role', 'content'} messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} must be a dict with string 'role' and 'content', got {m!r}")
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError("a chat sample needs at least one assistant message")
    return messages


def tokenize_chat(tokenizer, messages: list[dict], train_on: str = "all") -> TokenRow:
    """Tokenise a conversation; weight 1 on assistant content (+ its end-of-turn marker).

    The conversation is rendered with the chat template one message at a time; each piece
    is the text the template adds for that message, and each assistant piece is split into
    the header the template adds before generation (weight 0) and the answer (weight 1).

    Args:
      tokenizer: has ``apply_chat_template(messages, add_generation_prompt)`` and ``encode``.
      messages: [{'role', 'content'}, ...] with at least one assistant message.
      train_on: 'all' (every assistant message) or 'last' (only the final assistant message).
    Raises:
      ValueError if the template renders a prefix inconsistently (not append-only).
    """
    messages = _check_messages(messages)
    if train_on not in TRAIN_ON:
        raise ValueError(f"train_on must be one of {TRAIN_ON}, got {train_on!r}")
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ids: list[int] = []
    weight: list[float] = []
    done = ""
    for i, m in enumerate(messages):
        full = tokenizer.apply_chat_template(messages[: i + 1], add_generation_prompt=False)
        if not full.startswith(done):
            raise ValueError("the chat template is not append-only; cannot locate assistant tokens")
        if m["role"] == "assistant":
            head = tokenizer.apply_chat_template(messages[:i], add_generation_prompt=True) if i else ""
            if not (head.startswith(done) and full.startswith(head)):
                raise ValueError("the chat template is not append-only; cannot locate assistant tokens")
            pieces = [(head[len(done):], 0.0), (full[len(head):], 1.0 if (train_on == "all" or i == last) else 0.0)]
        else:
            pieces = [(full[len(done):], 0.0)]
        for text, w in pieces:
            if text:
                tok = tokenizer.encode(text)
                ids.extend(tok)
                weight.extend([w] * len(tok))
        done = full
    return TokenRow(np.asarray(ids, np.int32), np.asarray(weight, np.float32))


def _jsonl_items(path: str | os.PathLike) -> list[tuple[str, Any]]:
    """(location, parsed line) of every non-empty line of a JSONL file."""
    items = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                items.append((f"{path}:{lineno}", json.loads(line)))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({error})") from None
    if not items:
        raise ValueError(f"{path}: no samples")
    return items


def chat_samples(dataset: Any, train_on: str = "all") -> list[tuple[list[dict], str]]:
    """(messages, train_on) of every sample of a chat dataset.

    ``dataset``: a JSONL path (lines ``{"messages": [...]}`` or bare lists), a list of
    message lists, or a list of ``{"messages": ...}`` dicts. A dict sample may carry its own
    ``"train_on"`` ('all' or 'last'; e.g. a recovery sample whose first answer is a
    deliberately malformed one that must not be learned); otherwise ``train_on`` applies.
    Other keys are ignored. Raises ValueError naming the bad sample.
    """
    if train_on not in TRAIN_ON:
        raise ValueError(f"train_on must be one of {TRAIN_ON}, got {train_on!r}")
    if isinstance(dataset, (str, os.PathLike)):
        items = _jsonl_items(dataset)
    else:
        items = [(f"sample {i}", item) for i, item in enumerate(dataset)]
    out = []
    for where, item in items:
        messages = item.get("messages") if isinstance(item, dict) else item
        own = item.get("train_on", train_on) if isinstance(item, dict) else train_on
        try:
            if own not in TRAIN_ON:
                raise ValueError(f"train_on must be one of {TRAIN_ON}, got {own!r}")
            out.append((_check_messages(messages), own))
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
    if not out:
        raise ValueError("empty dataset")
    return out


def as_conversations(dataset: Any) -> list[list[dict]]:
    """A path to JSONL, a list of message lists or a list of {'messages': ...} dicts -> list of message lists."""
    return [m for m, _ in chat_samples(dataset)]


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
