"""Streamed answers of ``jax-drive serve`` (``stream=true``): server-sent events, as OpenAI
and vLLM send them.

Each event is ``data: <json>\\n\\n`` and the stream ends with ``data: [DONE]\\n\\n``.
Completions chunks carry ``choices[].text``; chat chunks ``choices[].delta`` (first
``{"role": "assistant", "content": ""}`` for every choice, then ``{"content": ...}``). One
event per choice with news; the last event of a choice carries its ``finish_reason``; every
chunk carries the choice's new ``token_ids`` (the first completions chunk of a choice also
its ``prompt_token_ids``) and, when asked, their log-probs. With
``stream_options.include_usage`` every chunk has ``"usage": null`` and a last chunk with empty
``choices`` has the usage. An error after the stream started is an event
``{"error": {...}}`` (what the ``openai`` client raises as ``APIError``), then ``[DONE]``.

The text is detokenised incrementally (``ChoiceText``): each chunk decodes the choice's tokens
so far and sends what is new, holding back the characters that may still change: a character
whose other bytes are not generated yet (the tokenizer decodes such bytes as U+FFFD) and a
tail that could be the start of a stop string. The pieces add up to the text of the
non-streamed answer, and a stop string cuts where it cuts the non-streamed answer
(``protocol.first_stop``), whatever the chunk boundaries; the choice's row is then dropped from
the running batch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence

from jax_drive.serve.batcher import GenerationJob
from jax_drive.serve.errors import REQUEST_TIMEOUT, InvalidRequest, error_body
from jax_drive.serve.limits import timeout_error
from jax_drive.serve.protocol import (
    chat_logprobs,
    completion_logprobs,
    first_stop,
    response_id,
    token_strings,
    tokens_through,
    usage,
)

log = logging.getLogger("jax_drive.serve")

DONE_EVENT = b"data: [DONE]\n\n"
REPLACEMENT = "\ufffd"  # what a tokenizer decodes an incomplete UTF-8 sequence to


def sse_event(payload: dict) -> bytes:
    """One server-sent event carrying ``payload`` as JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode("utf-8") + b"\n\n"


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many characters at the end of ``text`` must wait for more tokens: a trailing run of
    U+FFFD (a character whose other bytes are still to come) and, before it, the longest tail
    that is the start of a stop string."""
    partial = len(text) - len(text.rstrip(REPLACEMENT))
    body = text[: len(text) - partial]
    longest = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(body)), longest, -1):
            if body.endswith(stop[:k]):
                longest = k
                break
    return partial + longest


@dataclasses.dataclass(frozen=True)
class ChoicePiece:
    """What a choice sends in one chunk: new text, the new tokens and their log-probs, and
    ``finish_reason`` in its last chunk."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str | None

    @property
    def empty(self) -> bool:
        return not self.text and not self.token_ids and self.finish_reason is None


class ChoiceText:
    """One choice's text, detokenised as its tokens arrive (see the module docstring).

    Args:
      decode: token ids -> text (the settings of the request: special tokens skipped or not).
      stops: the request's stop strings.
    """

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str] = ()):
        self._decode = decode
        self._stops = [s for s in stops if s]
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self._sent_chars = 0
        self._sent_tokens = 0
        self.finish_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def add(self, token_ids: Sequence[int], logprobs: Sequence[float],
            finish_reason: str | None) -> ChoicePiece:
        """Takes the next tokens (and the row's finish reason once it ended); returns what
        can be sent now. After a stop string the choice is finished (finish 'stop'), its
        tokens cut after the one that completes the string, and later tokens are ignored."""
        if self.finished:
            return ChoicePiece("", (), (), None)
        self.token_ids += [int(t) for t in token_ids]
        self.logprobs += [float(x) for x in logprobs]
        text = self._decode(self.token_ids)
        hit = first_stop(text, self._stops) if self._stops else None
        if hit is not None:
            start, end = hit
            keep = max(self._sent_tokens, tokens_through(self.token_ids, end, text, self._decode))
            del self.token_ids[keep:], self.logprobs[keep:]
            text_end, finish = start, "stop"
        elif finish_reason is not None:
            text_end, finish = len(text), finish_reason
        else:
            text_end, finish = len(text) - held_back(text, self._stops), None
        text_end = max(text_end, self._sent_chars)
        piece = ChoicePiece(text[self._sent_chars : text_end], tuple(self.token_ids[self._sent_tokens :]),
                            tuple(self.logprobs[self._sent_tokens :]), finish)
        self._sent_chars, self._sent_tokens = text_end, len(self.token_ids)
        self.finish_reason = finish
        return piece


class StreamedAnswer:
    """One streamed request: its job's chunks in (from the batcher's thread), events out.

    Create it before submitting ``job`` (it sets ``job.on_chunk``), on the event loop.

    Args:
      job: the request's GenerationJob (rows prompt-major, n per prompt: row i is choice i).
      request: the parsed request (model, n, logprobs, stream_options, ...).
      prompts: token ids per prompt.
      stops: stop strings.
      tokenizer: decodes the tokens.
      in_pool: ``await in_pool(fn, *args)`` runs ``fn`` in the server's parse pool.
      counts: how streams ended ("done", "client_gone", "timeout", "error"), counted here.
    """

    def __init__(self, job: GenerationJob, request, prompts: list[list[int]], stops: Sequence[str],
                 tokenizer, in_pool, counts: Counter):
        self._job, self._request, self._prompts = job, request, prompts
        self._in_pool, self._counts = in_pool, counts
        self._chat = hasattr(request, "messages")
        self._tokenizer = tokenizer
        skip = bool(request.skip_special_tokens)
        self._choices = [ChoiceText(lambda ids: tokenizer.decode(list(ids), skip_special_tokens=skip), stops)
                         for _ in range(job.rows)]
        self._offsets = [0] * job.rows  # completions' text_offset, per choice
        self._opened = [False] * job.rows
        self._include_usage = bool(request.stream_options and request.stream_options.include_usage)
        self._id = response_id("chat.completion" if self._chat else "text_completion")
        self._created = int(time.time())
        self.outcome: str | None = None
        self._loop = asyncio.get_running_loop()
        self._items: asyncio.Queue = asyncio.Queue()
        job.on_chunk = self._post
        job.future.add_done_callback(self._post)

    def _post(self, item) -> None:
        """From the batcher's thread: a chunk (or the finished future) to the event loop."""
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the loop is closed: the server is stopping
            self._job.cancel()

    def close(self, outcome: str = "client_gone") -> None:
        """Ends the stream (once): unless it finished, its job's rows leave the batch."""
        if self.outcome is None:
            self.outcome = outcome
            self._counts[outcome] += 1
        if self.outcome != "done":
            self._job.cancel()

    # ------------------------------------------------------------------- events
    async def events(self, deadline: float | None, timeout_s: float | None) -> AsyncIterator[bytes]:
        """The SSE events, until ``[DONE]``; ``deadline`` (``time.monotonic()``) ends the
        stream with a timeout error event."""
        try:
            if self._chat:
                for row in range(self._job.rows):
                    yield sse_event(self._chat_chunk(row, {"role": "assistant", "content": ""}, None, None, ()))
            while not all(c.finished for c in self._choices):
                item = await self._next(deadline, timeout_s)
                if isinstance(item, concurrent.futures.Future):
                    raise self._failure(item)
                events, drops = await self._in_pool(self._advance, item)
                if drops:
                    self._job.drop_rows(drops)
                for event in events:
                    yield event
            if self._include_usage:
                yield sse_event(self._usage_chunk())
            yield DONE_EVENT
            self.close("done")
        except InvalidRequest as error:
            self.close("timeout" if error.status == REQUEST_TIMEOUT else "error")
            yield sse_event(error_body(str(error), "invalid_request_error", error.param, error.code))
            yield DONE_EVENT
        except Exception as error:  # noqa: BLE001 - logged in full, sent without details
            self.close("error")
            incident = uuid.uuid4().hex[:12]
            log.error("internal error %s in a streamed answer", incident, exc_info=error)
            yield sse_event(error_body(f"internal server error (incident {incident}; the server log has "
                                       "the details)", "internal_server_error"))
            yield DONE_EVENT
        finally:
            self.close()

    async def _next(self, deadline: float | None, timeout_s: float | None):
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return await asyncio.wait_for(self._items.get(), remaining)
        except asyncio.TimeoutError:
            raise timeout_error(timeout_s or 0.0) from None

    def _failure(self, future: concurrent.futures.Future) -> Exception:
        """Why the job ended before every choice finished."""
        if future.cancelled():
            return InvalidRequest("the request was cancelled (the server is stopping)", code="cancelled")
        error = future.exception()
        if error is None:
            return RuntimeError("the engine ended the call without finishing every row")
        if isinstance(error, ValueError) and not isinstance(error, InvalidRequest):
            return InvalidRequest(str(error))  # values the request checks did not catch
        return error

    def _advance(self, deltas) -> tuple[list[bytes], list[int]]:
        """(events, rows to drop) for one chunk of row deltas (runs in the parse pool)."""
        events, drops = [], []
        for delta in deltas:
            choice = self._choices[delta.row]
            if choice.finished:
                continue
            piece = choice.add(delta.token_ids, delta.logprobs, delta.finish_reason)
            if piece.finish_reason is not None and delta.finish_reason is None:
                drops.append(delta.row)  # a stop string ended the choice while its row runs on
            if not piece.empty:
                events.append(sse_event(self._chunk(delta.row, piece)))
        return events, drops

    # ------------------------------------------------------------------- chunks
    def _tokens(self, ids) -> list[str]:
        decode_one = lambda i: self._tokenizer.decode([i], skip_special_tokens=False)  # noqa: E731
        return token_strings(ids, decode_one, self._request.return_tokens_as_token_ids)

    def _envelope(self, choices: list[dict]) -> dict:
        body = {"id": self._id, "object": "chat.completion.chunk" if self._chat else "text_completion",
                "created": self._created, "model": self._request.model, "choices": choices}
        if self._include_usage:
            body["usage"] = None
        return body

    def _chat_chunk(self, row: int, delta: dict, finish, logprobs, ids) -> dict:
        return self._envelope([{"index": row, "delta": delta, "logprobs": logprobs,
                                "finish_reason": finish, "token_ids": list(ids)}])

    def _chunk(self, row: int, piece: ChoicePiece) -> dict:
        if self._chat:
            logprobs = chat_logprobs(self._tokens(piece.token_ids), piece.logprobs) if self._request.logprobs else None
            delta = {"content": piece.text} if piece.text else {}
            return self._chat_chunk(row, delta, piece.finish_reason, logprobs, piece.token_ids)
        logprobs = None
        if self._request.logprobs is not None:
            tokens = self._tokens(piece.token_ids)
            logprobs = completion_logprobs(tokens, piece.logprobs, self._offsets[row])
            self._offsets[row] += sum(len(t) for t in tokens)
        choice = {"index": row, "text": piece.text, "logprobs": logprobs,
                  "finish_reason": piece.finish_reason, "token_ids": list(piece.token_ids)}
        if not self._opened[row]:
            self._opened[row] = True
            choice["prompt_token_ids"] = list(self._prompts[row // self._request.n])
        return self._envelope([choice])

    def _usage_chunk(self) -> dict:
        body = self._envelope([])
        prompt_tokens = sum(len(p) for p in self._prompts) * self._request.n
        body["usage"] = usage(prompt_tokens, sum(len(c.token_ids) for c in self._choices))
        return body
