"""Response parsing: a server's answer -> ``Completion``, or a typed ``ParseFailure``.

:func:`read_completion` and :func:`read_prompt_logprobs` never raise on what a server sends
(any JSON value): an answer they cannot use comes back as a :class:`ParseFailure` naming the
endpoint and the problem. :func:`parse_completion_choice` and :func:`parse_prompt_logprobs`
are the engine's boundary: they raise the failure as an ``OpenAIEngineError``.

Generated token ids: vLLM and jax-drive return them; llama.cpp reports only token texts,
which :class:`TokenPieces` maps back to ids where that is exact ("pieces"); otherwise the
text is re-tokenized locally ("retokenized": possibly not the sampled ids, no log-probs).
Where the ids and log-probs came from is in ``Completion.metadata`` (:class:`RemoteMetadata`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any, Literal

from jax_drive.sampling.engine import Completion
from jax_drive.sampling.remote.dialects import ServerDialect
from jax_drive.sampling.remote.errors import OpenAIEngineError

_TOKEN_ID_RE = re.compile(r"^token_id:(\d+)$")
_NUMBER_ERRORS = (TypeError, ValueError, OverflowError)


@dataclasses.dataclass(frozen=True)
class RemoteMetadata:
    """Where a remote completion's ids and log-probs came from.

    Attributes:
      server: dialect name.
      token_ids_source: 'server' (reported by the server), 'pieces' (each returned token
        text mapped to its unique vocabulary id: exact), 'retokenized' (the text encoded
        with the local tokenizer: possibly not the sampled ids) or 'none' (no tokenizer).
      logprobs_source: 'server' (the sampled tokens' log-probs, aligned with the ids) or
        'none' (unavailable: ``logprobs`` holds NaN).
      logprobs_mode: 'raw' / 'processed' as the server computed them, None if unavailable.
      stop_token_included: a stop token that ended the completion is the last id (False
        on llama.cpp, which never returns it).
      prompt_tokens_match: the server saw the prompt as our token ids (True), saw a
        different count of tokens (False), or we cannot tell (None).
      seed: the seed sent with the request.
    """

    server: str
    token_ids_source: Literal["server", "pieces", "retokenized", "none"]
    logprobs_source: Literal["server", "none"]
    logprobs_mode: str | None
    stop_token_included: bool
    prompt_tokens_match: bool | None
    seed: int | None

    @property
    def exact(self) -> bool:
        """Ids are the sampled ids and log-probs are theirs: usable for training."""
        return (
            self.token_ids_source in ("server", "pieces")
            and self.logprobs_source == "server"
            and self.prompt_tokens_match is not False
        )


@dataclasses.dataclass(frozen=True)
class ParseFailure:
    """An answer that could not be used: the endpoint (``where``) and what was wrong."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"

    def error(self) -> OpenAIEngineError:
        return OpenAIEngineError(str(self))


class _Malformed(Exception):
    """Raised inside this module only; the readers turn it into a ParseFailure."""


# ---------------------------------------------------------------- token-text mapping
def _byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level BPE: the printable character standing for each byte value."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\xa1"), ord("\xac") + 1))
        + list(range(ord("\xae"), ord("\xff") + 1))
    )
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class TokenPieces:
    """Maps the per-token texts a server reports back to vocabulary ids.

    llama.cpp prints each generated token as its bytes decoded as UTF-8 with invalid bytes
    dropped (special tokens as ''). A token whose bytes are valid UTF-8 by themselves prints
    exactly its text, and byte-level BPE gives every byte string one id, so such a "whole"
    piece names one id. When the pieces put together equal the completion text, no token
    ended inside a UTF-8 character (that would drop bytes from the pieces which the text
    keeps), so every piece is a whole token. The one case this cannot see: bytes that never
    form valid UTF-8, which the text drops as well.

    Built once from the local tokenizer (byte-level BPE: each token's exact bytes; other
    tokenizers: their own one-token decode).
    """

    def __init__(self, tokenizer):
        specials: set[int] = set()
        added = getattr(getattr(tokenizer, "backend", None), "get_added_tokens_decoder", None)
        if added is not None:
            specials = {int(i) for i, tok in added().items() if getattr(tok, "special", False)}
        decoder = _byte_decoder()
        whole: dict[str, int | None] = {}
        for idx in range(int(tokenizer.vocab_size)):
            text = None if idx in specials else self._whole_text(tokenizer, idx, decoder)
            if text:
                whole[text] = None if text in whole else idx  # None: two ids print alike
        self._whole = whole

    @staticmethod
    def _whole_text(tokenizer, idx: int, decoder: dict[str, int]) -> str | None:
        """The token's text when its bytes are valid UTF-8 by themselves, else None."""
        token = tokenizer.id_to_token(idx)
        if token is None:
            return None
        if all(c in decoder for c in token):
            try:
                return bytes(decoder[c] for c in token).decode("utf-8")
            except UnicodeDecodeError:
                return None
        text = tokenizer.decode([idx], skip_special_tokens=False)
        return None if "\ufffd" in text else text

    def id_for(self, piece: str) -> int | None:
        """The id of a whole token printed as ``piece`` (None: none or ambiguous)."""
        return self._whole.get(piece)

    def ids_for_pieces(self, pieces: Sequence[str], text: str) -> list[int] | None:
        """Ids of a completion's token texts, or None when they cannot be named exactly."""
        if "".join(pieces) != text:
            return None
        ids = [self.id_for(piece) for piece in pieces]
        return None if any(i is None for i in ids) else ids  # type: ignore[return-value]


# ------------------------------------------------------------------- field readers
def _finish_reason(value: Any) -> str:
    if value in ("stop", "length"):
        return value
    raise _Malformed(f"unexpected finish_reason {value!r}")


def _single_choice(answer: Any) -> dict:
    if not isinstance(answer, dict):
        raise _Malformed("answer is not a JSON object")
    if "error" in answer and "choices" not in answer:
        raise _Malformed(f"server error: {answer['error']}")
    choices = answer.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        got = len(choices) if isinstance(choices, list) else type(choices).__name__
        raise _Malformed(f"expected 1 choice, got {got}")
    return choices[0]


def _as_logprob(value: Any) -> float:
    if value is None:
        return float("nan")
    try:
        return float(value)
    except _NUMBER_ERRORS:
        raise _Malformed(f"log-prob {value!r} is not a number") from None


def _int_list(values: Any, what: str) -> tuple[int, ...]:
    if not isinstance(values, list):
        raise _Malformed(f"malformed {what}")
    try:
        return tuple(int(i) for i in values)
    except _NUMBER_ERRORS:
        raise _Malformed(f"malformed {what}") from None


def _list_field(container: dict, name: str, what: str) -> list:
    value = container.get(name)
    if not value:
        return []
    if not isinstance(value, list):
        raise _Malformed(f"malformed {what}")
    return value


def _token_id(token: Any) -> int | None:
    if isinstance(token, str):
        m = _TOKEN_ID_RE.match(token)
        if m:
            return int(m.group(1))
    return None


def _recover_ids(
    choice: dict,
    tokens: Sequence[Any],
    logprobs: Sequence[float],
    text: str,
    tokenizer,
    pieces: TokenPieces | None,
    completion_tokens: int | None,
) -> tuple[tuple[int, ...], tuple[float, ...], str, str]:
    """(ids, logprobs, token_ids_source, logprobs_source) for one choice."""
    server_ids: Any = choice.get("token_ids")
    if server_ids is None and tokens:
        parsed = [_token_id(t) for t in tokens]
        if all(i is not None for i in parsed):
            server_ids = parsed
    if server_ids is not None:
        ids = _int_list(server_ids, "token_ids")
        if logprobs and len(logprobs) != len(ids):
            raise _Malformed(f"{len(ids)} token ids but {len(logprobs)} log-probs")
        if logprobs:
            return ids, tuple(logprobs), "server", "server"
        return ids, tuple(float("nan") for _ in ids), "server", "none"
    if tokens and len(tokens) != len(logprobs):
        raise _Malformed(f"{len(tokens)} tokens but {len(logprobs)} log-probs")
    complete = completion_tokens is None or completion_tokens == len(tokens)
    if tokens and complete and pieces is not None and all(isinstance(t, str) for t in tokens):
        ids = pieces.ids_for_pieces(tokens, text)
        if ids is not None:
            return tuple(ids), tuple(logprobs), "pieces", "server"
    if tokenizer is None:
        return (), (), "none", "none"
    ids = tuple(int(i) for i in tokenizer.encode(text)) if text else ()
    return ids, tuple(float("nan") for _ in ids), "retokenized", "none"


def _prompt_match(answer: dict, choice: dict, usage: dict, prompt_ids: Sequence[int] | None,
                  sent_token_ids: bool) -> tuple[tuple[int, ...], bool | None]:
    """(the prompt ids to report, whether the server saw our prompt tokens or None)."""
    server_prompt = choice.get("prompt_token_ids") or answer.get("prompt_token_ids")
    if prompt_ids is None:
        return (() if server_prompt is None else _int_list(server_prompt, "prompt_token_ids")), None
    pids = tuple(int(t) for t in prompt_ids)
    if sent_token_ids:
        return pids, True
    if server_prompt is not None:
        return pids, _int_list(server_prompt, "prompt_token_ids") == pids
    if isinstance(usage.get("prompt_tokens"), int):
        return pids, usage["prompt_tokens"] == len(pids)
    return pids, None


# --------------------------------------------------------------------------- readers
def _read_completion(answer: Any, chat: bool, dialect: ServerDialect, logprobs_mode: str | None,
                     prompt_ids: Sequence[int] | None, sent_token_ids: bool, tokenizer,
                     pieces: TokenPieces | None, seed: int | None) -> Completion:
    choice = _single_choice(answer)
    lp = choice.get("logprobs") or {}
    if not isinstance(lp, dict):
        raise _Malformed("logprobs is not an object")
    if chat:
        content = _list_field(lp, "content", "logprobs.content")
        if not all(isinstance(c, dict) for c in content):
            raise _Malformed("malformed logprobs.content")
        tokens = [c.get("token") for c in content]
        raw_lps = [c.get("logprob") for c in content]
        message = choice.get("message")
        text = str((message if isinstance(message, dict) else {}).get("content") or "")
    else:
        tokens = _list_field(lp, "tokens", "logprobs.tokens")
        raw_lps = _list_field(lp, "token_logprobs", "logprobs.token_logprobs")
        text = str(choice.get("text") or "")
    logprobs = [_as_logprob(x) for x in raw_lps]
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    completion_tokens = usage.get("completion_tokens")
    ids, lps, ids_source, lp_source = _recover_ids(
        choice, tokens, logprobs, text, tokenizer, pieces,
        completion_tokens if isinstance(completion_tokens, int) else None,
    )
    if lp_source == "server" and any(math.isnan(x) for x in lps):
        lp_source = "none"
    pids, match = _prompt_match(answer, choice, usage, prompt_ids, sent_token_ids)
    finish = _finish_reason(choice.get("finish_reason"))
    metadata = RemoteMetadata(
        server=dialect.name,
        token_ids_source=ids_source,
        logprobs_source=lp_source,
        logprobs_mode=logprobs_mode if lp_source == "server" else None,
        stop_token_included=dialect.stop_token_in_output and finish == "stop" and bool(ids),
        prompt_tokens_match=match,
        seed=seed,
    )
    return Completion(pids, ids, text, lps, finish, metadata)


def read_completion(
    answer: Any,
    *,
    chat: bool,
    dialect: ServerDialect,
    logprobs_mode: str | None,
    prompt_ids: Sequence[int] | None,
    sent_token_ids: bool,
    tokenizer=None,
    pieces: TokenPieces | None = None,
    seed: int | None = None,
) -> Completion | ParseFailure:
    """The completion in a one-choice answer of /v1/completions (``chat=False``) or
    /v1/chat/completions (``chat=True``), or a ParseFailure; never raises on the answer.

    Args:
      answer: decoded JSON body (any JSON value).
      dialect: the server's dialect.
      logprobs_mode: the mode the server computed log-probs in.
      prompt_ids: our token ids of the prompt (None: unknown locally).
      sent_token_ids: the prompt went out as token ids (so the server saw exactly them).
      tokenizer, pieces: local tokenizer and its ``TokenPieces`` to recover ids.
      seed: the request's seed (recorded in the metadata).
    """
    where = "chat/completions" if chat else "completions"
    try:
        return _read_completion(answer, chat, dialect, logprobs_mode, prompt_ids, sent_token_ids, tokenizer,
                                pieces, seed)
    except _Malformed as problem:
        return ParseFailure(where, str(problem))


def parse_completion_choice(answer: Any, **fields) -> Completion:
    """:func:`read_completion` (same arguments), a failure raised as ``OpenAIEngineError``."""
    result = read_completion(answer, **fields)
    if isinstance(result, ParseFailure):
        raise result.error()
    return result


def _read_prompt_logprobs(answer: Any, prompt_ids: Sequence[int]) -> list[float]:
    choice = _single_choice(answer)
    entries = choice.get("prompt_logprobs") or answer.get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) != len(prompt_ids):
        raise _Malformed("prompt_logprobs missing or of the wrong length")
    out = []
    for token, entry in zip(list(prompt_ids)[1:], entries[1:]):
        if not isinstance(entry, dict):
            raise _Malformed("malformed prompt_logprobs entry")
        value = entry.get(str(int(token)), entry.get(f"token_id:{int(token)}"))
        if isinstance(value, dict):
            value = value.get("logprob")
        if value is None:
            raise _Malformed(f"no prompt log-prob for token {token}")
        out.append(_as_logprob(value))
    return out


def read_prompt_logprobs(answer: Any, prompt_ids: Sequence[int]) -> list[float] | ParseFailure:
    """Log-probs of prompt tokens 1.. from a vLLM answer with ``prompt_logprobs`` (entries
    keyed by token id, the first one None): len(prompt_ids) - 1 floats, or a ParseFailure."""
    try:
        return _read_prompt_logprobs(answer, prompt_ids)
    except _Malformed as problem:
        return ParseFailure("completions", str(problem))


def parse_prompt_logprobs(answer: Any, prompt_ids: Sequence[int]) -> list[float]:
    """:func:`read_prompt_logprobs`, a failure raised as ``OpenAIEngineError``."""
    result = read_prompt_logprobs(answer, prompt_ids)
    if isinstance(result, ParseFailure):
        raise result.error()
    return result
