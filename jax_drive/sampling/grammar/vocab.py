"""Each token id's exact bytes, read from the project's own tokenizer objects.

The grammar compiler walks a byte-level automaton, so it needs, for every token id, the
bytes the token adds to the answer. Byte-level BPE tokenizers (GPT-2 style: the GGUF-embedded
SmolLM2 tokenizer, Qwen2.5's, :func:`jax_drive.models.tiny.byte_tokenizer`) spell each byte
as one printable character; :func:`byte_decoder` inverts that spelling. Special tokens and
stop ids are never part of a constrained answer's text: their bytes are None here (stop ids
are handled by the tables: allowed exactly in accepting states). Ids from the tokenizer's
size up to the model's vocabulary size (embedding rows without a token) are never allowed.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Sequence

from jax_drive.sampling.grammar.regex import GrammarError


@functools.lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """The printable character that spells each byte in a byte-level BPE vocabulary -> the byte.

    Bytes that are printable and not whitespace (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``)
    spell themselves; the other 68 take the code points 256, 257, ... in byte order.
    """
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    spelled = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in spelled:
            spelled[b] = 256 + extra
            extra += 1
    return {chr(code): b for b, code in spelled.items()}


@dataclasses.dataclass(frozen=True, eq=False)
class TokenVocabulary:
    """A tokenizer as the compiler sees it.

    Fields:
      token_bytes: per token id of the tokenizer, the bytes it writes, or None for ids that
        never appear inside a constrained answer (special tokens and stop ids).
      stop_ids: ids that end an answer (allowed exactly in accepting states).
      vocab_size: V, the model's logit width (>= len(token_bytes); the extra ids are never allowed).
      fingerprint: a hash of all the above (the compiled-grammar cache key).
    """

    token_bytes: tuple[bytes | None, ...]
    stop_ids: tuple[int, ...]
    vocab_size: int
    fingerprint: str


def _backend_of(tokenizer):
    backend = getattr(tokenizer, "backend", None)
    if backend is None:
        raise GrammarError(f"{type(tokenizer).__name__} has no `backend` tokenizers.Tokenizer: "
                           "pass a jax_drive.models.Tokenizer")
    return backend


def _is_byte_level(backend) -> bool:
    import tokenizers

    return isinstance(backend.decoder, tokenizers.decoders.ByteLevel)


def token_vocabulary(tokenizer, vocab_size: int | None = None,
                     stop_ids: Sequence[int] | None = None) -> TokenVocabulary:
    """Builds the :class:`TokenVocabulary` of a byte-level BPE ``jax_drive.models.Tokenizer``.

    Args:
      tokenizer: a ``jax_drive.models.Tokenizer`` (or a wrapper exposing ``backend``).
      vocab_size: the model's logit width V (default: the tokenizer's size).
      stop_ids: ids that end an answer (default: ``tokenizer.eos_token_ids``).
    Raises GrammarError for a tokenizer that is not byte-level BPE, a token spelled with
    characters outside the byte alphabet, or ids out of range.
    """
    backend = _backend_of(tokenizer)
    if not _is_byte_level(backend):
        raise GrammarError("grammars need a byte-level BPE tokenizer (GPT-2 / SmolLM2 / Qwen2.5 style); "
                           f"this one decodes with {type(backend.decoder).__name__}")
    size = backend.get_vocab_size(with_added_tokens=True)
    vocab_size = size if vocab_size is None else int(vocab_size)
    if vocab_size < size:
        raise GrammarError(f"vocab_size {vocab_size} is smaller than the tokenizer's {size} ids")
    stops = tuple(int(i) for i in (tokenizer.eos_token_ids if stop_ids is None else stop_ids))
    if any(not 0 <= i < vocab_size for i in stops):
        raise GrammarError(f"stop ids {stops} must lie in [0, {vocab_size})")
    decode = byte_decoder()
    spelled: list[bytes | None] = [None] * size
    for text, idx in backend.get_vocab(with_added_tokens=False).items():
        try:
            spelled[idx] = bytes(decode[ch] for ch in text)
        except KeyError:
            raise GrammarError(f"token {idx} ({text!r}) is not spelled in the byte-level alphabet") from None
    for idx, added in backend.get_added_tokens_decoder().items():
        # special tokens (chat markers, BOS/EOS) are never answer text; other added tokens
        # are matched literally on their content
        spelled[idx] = None if added.special else added.content.encode("utf-8")
    for idx in stops:
        if idx < size:
            spelled[idx] = None
    digest = hashlib.sha256(f"{vocab_size}|{stops}|".encode())
    for token in spelled:
        digest.update(b"\xff" * 4 if token is None else len(token).to_bytes(4, "little") + token)
    return TokenVocabulary(tuple(spelled), stops, vocab_size, digest.hexdigest()[:32])


# The compiler appends this byte to every grammar's regex and gives it a token of its own
# (see compile.py), so tokens that contain it are left out of every grammar: no grammar can
# produce a NUL byte.
SENTINEL_BYTE = b"\x00"


def outlines_vocabulary(vocabulary: TokenVocabulary):
    """outlines-core's ``Vocabulary`` of ``vocabulary``: every answer token's bytes -> its ids,
    plus two ids no model token has: V (outlines' end-of-sequence, unused by our tables) and
    V + 1 for :data:`SENTINEL_BYTE`."""
    from outlines_core import Vocabulary

    by_bytes: dict[bytes, list[int]] = {}
    for idx, token in enumerate(vocabulary.token_bytes):
        if token and SENTINEL_BYTE not in token:
            by_bytes.setdefault(token, []).append(idx)
    by_bytes[SENTINEL_BYTE] = [vocabulary.vocab_size + 1]
    return Vocabulary(vocabulary.vocab_size, by_bytes)
