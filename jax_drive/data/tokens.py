"""Chat samples as token rows: tokenised conversations with per-token loss weights.

A training row is a token sequence ``ids`` (length n) and a per-token ``weight`` of the same
length marking the tokens that carry loss (assistant tokens in SFT, generated tokens in RL).
Rows of a vision-language policy also carry their processed images (``TokenRow.images``,
each ``<|image_pad|>`` run already expanded). Padding rows into training batches is the
trainer's business (:mod:`jax_drive.rl.batching`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Sequence

import numpy as np

from jax_drive.configs import one_of


@dataclasses.dataclass(frozen=True)
class TokenRow:
    """One tokenised sample. ids, weight: (n,) int32 / float32; images: the processed images
    whose (expanded) pad tokens ``ids`` holds, in reading order (empty for text)."""

    ids: np.ndarray
    weight: np.ndarray
    images: tuple = ()

    def __len__(self) -> int:
        return int(self.ids.shape[0])


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
    one_of("train_on", train_on, TRAIN_ON)
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
    one_of("train_on", train_on, TRAIN_ON)
    if isinstance(dataset, (str, os.PathLike)):
        items = _jsonl_items(dataset)
    else:
        items = [(f"sample {i}", item) for i, item in enumerate(dataset)]
    out = []
    for where, item in items:
        messages = item.get("messages") if isinstance(item, dict) else item
        own = item.get("train_on", train_on) if isinstance(item, dict) else train_on
        try:
            one_of("train_on", own, TRAIN_ON)
            out.append((_check_messages(messages), own))
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
    if not out:
        raise ValueError("empty dataset")
    return out


def as_conversations(dataset: Any) -> list[list[dict]]:
    """A path to JSONL, a list of message lists or a list of {'messages': ...} dicts -> list of message lists."""
    return [m for m, _ in chat_samples(dataset)]
