"""Streaming (server-sent events) and cancellation in `jax-drive serve`.

References: a streamed answer must add up to the non-streamed answer of the same seeded
request (text, token ids, log-probs, finish reasons, usage), which the other serve tests
compare with ``JaxEngine.generate``; the incremental detokeniser must add up to the
tokenizer's decode of the whole answer and cut stop strings where ``truncate_at_stop`` cuts
the whole text. Cancellation is checked by decode-step counts and ordering (an engine whose
chunks the test lets through one by one), never by elapsed time.
"""

from __future__ import annotations

import http.client
import json
import threading
from urllib.parse import urlsplit

import jax
import numpy as np
import openai
import pytest

from jax_drive.models.tiny import byte_tokenizer, peaked_tiny_model
from jax_drive.sampling import Completion, JaxEngine, SamplingParams
from jax_drive.serve import BatcherConfig, GenerationJob, PolicyRegistry, PolicyServer, RequestBatcher, ServeConfig
from jax_drive.serve import ServeLimits
from jax_drive.serve.batcher import request_keys
from jax_drive.serve.protocol import CompletionRequest, first_stop, truncate_at_stop
from jax_drive.serve.streaming import REPLACEMENT, ChoiceText, held_back
from serve_fakes import KEY, WAIT_S, HeldEngine, send_and_hang_up, wait_for
from servers import inprocess_server

CHUNK_STEPS = 2
LONG = 40  # max_tokens of the requests that get cancelled (EOS off: they would run all of it)


# ------------------------------------------------------------------ detokenisation
TEXT = "go é🚗 left. 東京 stop here"


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


def _stream_text(tokenizer, ids, size: int, stops=(), finish="length"):
    """``ids`` through a ChoiceText ``size`` tokens at a time; the pieces."""
    choice = ChoiceText(lambda t: tokenizer.decode(t), stops)
    pieces = []
    for start in range(0, len(ids), size):
        part = ids[start : start + size]
        pieces.append(choice.add(part, [-0.5] * len(part), finish if start + size >= len(ids) else None))
        if choice.finished:
            break
    return pieces


def test_incremental_text_never_sends_a_broken_character_and_adds_up(tokenizer):
    ids = tokenizer.encode(TEXT)
    assert len(ids) > len(TEXT)  # multi-byte characters span several tokens
    for size in (1, 2, 3, 5):
        pieces = _stream_text(tokenizer, ids, size)
        assert "".join(p.text for p in pieces) == TEXT
        assert not any(REPLACEMENT in p.text for p in pieces), size
        assert [t for p in pieces for t in p.token_ids] == ids
        assert [p.finish_reason for p in pieces] == [None] * (len(pieces) - 1) + ["length"]
    # bytes that never become a character are sent as the whole answer has them, at the end
    broken = tokenizer.encode("ok é")[:-1]
    assert "".join(p.text for p in _stream_text(tokenizer, broken, 1)) == tokenizer.decode(broken)


@pytest.mark.parametrize("stops", [["🚗"], ["t. 東"], ["here"], ["left!"], ["京 s", "é"], [" stop", "東京 "], ["zz"]])
def test_stop_strings_cut_where_the_whole_answer_cuts_whatever_the_chunks(tokenizer, stops):
    ids = tokenizer.encode(TEXT)
    whole = Completion((1,), tuple(ids), TEXT, tuple([-0.5] * len(ids)), "length")
    ref_ids, _, ref_text, ref_finish = truncate_at_stop(whole, stops, tokenizer.decode)
    for size in (1, 2, 3, 4, 7):
        pieces = _stream_text(tokenizer, ids, size, stops)
        assert "".join(p.text for p in pieces) == ref_text, (stops, size)
        assert tuple(t for p in pieces for t in p.token_ids) == ref_ids, (stops, size)
        assert pieces[-1].finish_reason == ref_finish


def test_first_stop_is_the_one_completed_first():
    assert first_stop("xabcd", ["abcd", "xab"]) == (0, 3)  # "xab" ends first
    assert first_stop("xabc", ["ab", "xab"]) == (0, 3)  # same end: the earlier start
    assert first_stop("left", ["x"]) is None
    assert held_back("go le", ["left."]) == 2 and held_back("go l" + REPLACEMENT, ["left"]) == 2
    assert held_back("go", ["left"]) == 0


def test_stream_options_need_stream():
    CompletionRequest(model="m", prompt="x", stream=True, stream_options={"include_usage": True})
    for bad in ({"stream_options": {"include_usage": True}}, {"stream": True, "stream_options": {"x": 1}}):
        with pytest.raises(ValueError):
            CompletionRequest(model="m", prompt="x", **bad)


# -------------------------------------------------------------------- the batcher
@pytest.fixture(scope="module")
def model():
    return peaked_tiny_model(vocab_size=259, scale=6.0)


def _no_eos(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_tokens, stop_token_ids=())


def test_a_cancelled_job_leaves_the_running_call_and_the_other_rows_are_unchanged(model, tokenizer):
    """Job A (2 rows, streamed) cancels itself on its first chunk; job B shares the call. A's
    first chunk is one step; B's completions equal the one-call sampler's; A's rows are
    dropped and get no further chunk."""
    engine = JaxEngine(model, tokenizer)
    batcher = RequestBatcher(lambda name: engine, BatcherConfig(max_batch_rows=3, max_wait_s=WAIT_S,
                                                                chunk_steps=4)).start()
    params = _no_eos(12)
    chunks = []
    a = GenerationJob("m", [[5, 6, 7]] * 2, params, seed=1)

    def on_chunk(deltas):
        chunks.append(deltas)
        a.cancel()

    a.on_chunk = on_chunk
    b = GenerationJob("m", [[9, 8]], params, seed=2)
    try:
        batcher.submit(a)
        result = batcher.submit(b).result(timeout=WAIT_S)
    finally:
        batcher.stop()
    assert len(chunks) == 1 and [len(d.token_ids) for d in chunks[0]] == [1, 1]
    assert batcher.dropped_rows == 2 and list(batcher.batch_sizes) == [3]
    keys = jax.random.wrap_key_data(np.concatenate([jax.random.key_data(request_keys(1, 2)),
                                                    jax.random.key_data(request_keys(2, 1))]))
    reference = engine.generate([[5, 6, 7]] * 2 + [[9, 8]], params, keys)[2]
    assert result[0].token_ids == reference.token_ids and result[0].logprobs == reference.logprobs


def test_the_next_call_does_not_wait_for_dropped_rows(model, tokenizer):
    """A call whose every row is dropped ends at the next chunk: its step count is that of
    the chunks run, not its max_tokens, and the next job runs in a call of its own after it."""
    engine = JaxEngine(model, tokenizer)
    batcher = RequestBatcher(lambda name: engine, BatcherConfig(max_wait_s=0.0, chunk_steps=4)).start()
    a = GenerationJob("m", [[3, 4]], _no_eos(LONG), seed=3)
    a.on_chunk = lambda deltas: a.cancel()
    try:
        batcher.submit(a)
        batcher.submit(GenerationJob("m", [[3, 4]], _no_eos(8), seed=3)).result(timeout=WAIT_S)
    finally:
        batcher.stop()
    assert list(batcher.call_steps) == [1, 8] and batcher.dropped_rows == 1


def test_an_engine_without_chunks_streams_in_one_piece():
    engine = HeldEngine()
    batcher = RequestBatcher(lambda name: engine, BatcherConfig(max_wait_s=0.0)).start()
    got = []
    job = GenerationJob("m", [[1, 2], [3]], SamplingParams(max_new_tokens=1), on_chunk=got.append)
    try:
        result = batcher.submit(job).result(timeout=WAIT_S)
    finally:
        batcher.stop()
    assert [[(d.row, d.token_ids, d.finish_reason) for d in chunk] for chunk in got] == [
        [(0, (2,), "length"), (1, (1,), "length")]]
    assert [c.token_ids for c in result] == [(2,), (1,)]


# ------------------------------------------------------------------------ over HTTP
class ChunkGate:
    """Lets a stream's chunks through: all (default), or up to a count the test sets."""

    def __init__(self):
        self._cond = threading.Condition()
        self._allowed: int | None = None
        self.passed = 0
        self.waiting = False

    def allow(self, chunks: int | None) -> None:
        """Lets ``chunks`` more chunks through (None: every chunk from now on)."""
        with self._cond:
            self._allowed = None if chunks is None else self.passed + chunks
            self._cond.notify_all()

    def wait_turn(self) -> None:
        with self._cond:
            self.waiting = True
            ok = self._cond.wait_for(lambda: self._allowed is None or self.passed < self._allowed, WAIT_S)
            self.waiting = False
            if not ok:
                raise RuntimeError("the test never let the chunk through")
            self.passed += 1


class GatedStream:
    """A ``DecodeStream`` whose chunks wait for the gate; with ``fail_after`` it raises after
    that many chunks (an engine failing mid-stream)."""

    def __init__(self, inner, gate: ChunkGate, fail_after: int | None):
        self._inner, self._gate, self._fail_after, self._count = inner, gate, fail_after, 0

    def __iter__(self):
        return self

    def __next__(self):
        self._gate.wait_turn()
        if self._fail_after is not None and self._count >= self._fail_after:
            raise RuntimeError("engine exploded at /secret/path")
        self._count += 1
        return next(self._inner)

    @property
    def chunk_steps(self):
        return self._inner.chunk_steps

    @chunk_steps.setter
    def chunk_steps(self, value):
        self._inner.chunk_steps = value

    def cancel(self, rows):
        self._inner.cancel(rows)

    def completions(self):
        return self._inner.completions()


class GatedEngine:
    def __init__(self, inner: JaxEngine):
        self.inner, self.gate, self.fail_after = inner, ChunkGate(), None

    def generate(self, prompts, params, key):
        return self.inner.generate(prompts, params, key)

    def stream(self, prompts, params, key, **kwargs):
        return GatedStream(self.inner.stream(prompts, params, key, **kwargs), self.gate, self.fail_after)


@pytest.fixture(scope="module")
def stack(model, tokenizer):
    """(url, server, gated engine): the tiny model behind a gate, chunks of 2 steps."""
    engine = GatedEngine(JaxEngine(model, tokenizer))
    registry = PolicyRegistry(model, tokenizer, "m", engine_factory=lambda m: engine)
    config = ServeConfig(BatcherConfig(max_batch_rows=8, max_wait_s=0.0, chunk_steps=CHUNK_STEPS), api_key=KEY,
                         limits=ServeLimits(max_request_rows=4, max_tokens=LONG))
    server = PolicyServer(registry, config)
    with inprocess_server(server) as url:
        yield url, server, engine


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=stack[0] + "/v1", api_key=KEY, max_retries=0, timeout=WAIT_S)


@pytest.fixture(autouse=True)
def _open_gate(request):
    """Before a test on the gated stack: no call left running by the one before (it would take
    the chunks the test lets through); after it: the gate open."""
    if "stack" in request.fixturenames:
        server = request.getfixturevalue("stack")[1]
        wait_for(lambda: server.batcher.running_rows == 0, "the previous test's call to end")
    yield
    if "stack" in request.fixturenames:
        engine = request.getfixturevalue("stack")[2]
        engine.gate.allow(None)
        engine.fail_after = None


class EventReader:
    """A streamed request over http.client: ``status``, then the events as they arrive
    (dicts, and "[DONE]"); ``hang_up()`` closes the connection."""

    def __init__(self, url: str, path: str, payload: dict, key: str = KEY):
        parts = urlsplit(url)
        self._connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=WAIT_S)
        self._connection.request("POST", path, json.dumps(payload).encode(),
                                 {"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        self.response = self._connection.getresponse()
        self.status = self.response.status

    def __iter__(self):
        while line := self.response.readline():
            if line.startswith(b"data: "):
                data = line[len(b"data: "):].strip()
                yield "[DONE]" if data == b"[DONE]" else json.loads(data)

    def first_tokens(self) -> dict:
        """Reads up to the first event with tokens."""
        for event in self:
            if event != "[DONE]" and any(c.get("token_ids") for c in event["choices"]):
                return event
        raise AssertionError("the stream ended without tokens")

    def hang_up(self) -> None:
        self.response.close()
        self._connection.close()


def _joined(chunks, chat: bool) -> dict:
    """Per choice index: (text, token ids, log-probs, finish reasons seen) from streamed chunks."""
    out: dict = {}
    for chunk in chunks:
        for c in chunk.choices:
            text, ids, lps, finishes = out.setdefault(c.index, ["", [], [], []])
            piece = (c.delta.content if chat else c.text) or ""
            out[c.index][0] = text + piece
            ids += c.model_extra["token_ids"]
            if c.logprobs is not None:
                lps += [x.logprob for x in c.logprobs.content] if chat else c.logprobs.token_logprobs
            finishes.append(c.finish_reason)
    return out


def test_streamed_completions_add_up_to_the_whole_answer(client, stack):
    kwargs = dict(model="m", prompt=["turn left", "go"], n=2, max_tokens=12, seed=5, logprobs=1)
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage  # the usage chunk, last
    assert all(c.usage is None for c in chunks[:-1]) and len({c.id for c in chunks}) == 1
    joined = _joined(chunks, chat=False)
    assert sorted(joined) == [0, 1, 2, 3]
    for choice in whole.choices:
        text, ids, lps, finishes = joined[choice.index]
        assert (text, ids) == (choice.text, choice.model_extra["token_ids"])
        np.testing.assert_array_equal(lps, choice.logprobs.token_logprobs)
        assert finishes[-1] == choice.finish_reason and set(finishes[:-1]) <= {None}
        assert len(finishes) > 2  # several chunks
    # the raw events: text_offset runs on across chunks, [DONE] ends the stream
    events = list(EventReader(stack[0], "/v1/completions", {**kwargs, "stream": True}))
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    first = [e["choices"][0] for e in events[:-1] if e["choices"][0]["index"] == 0]
    assert first[0]["prompt_token_ids"] == byte_tokenizer().encode("turn left")
    offsets = [o for c in first for o in c["logprobs"]["text_offset"]]
    assert offsets == whole.choices[0].logprobs.text_offset


def test_streamed_chat_adds_up_to_the_whole_answer(client):
    kwargs = dict(model="m", messages=[{"role": "user", "content": "Light is red."}], n=2, max_tokens=10,
                  seed=8, logprobs=True)
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    assert [c.choices[0].delta.role for c in chunks[:2]] == ["assistant", "assistant"]  # the role first
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    joined = _joined(chunks, chat=True)
    for choice in whole.choices:
        text, ids, lps, finishes = joined[choice.index]
        assert (text, ids) == (choice.message.content, choice.model_extra["token_ids"])
        np.testing.assert_array_equal(lps, [x.logprob for x in choice.logprobs.content])
        assert finishes[-1] == choice.finish_reason and set(finishes[:-1]) <= {None}


def test_streamed_stop_strings_match_the_whole_answer(client, stack):
    base = dict(model="m", prompt=[11, 12, 13], max_tokens=24, seed=2, temperature=0.0)
    text = client.completions.create(**base).choices[0].text
    dropped = stack[1].batcher.dropped_rows
    for stop in (text[3:5], text[10:11], [text[6:9], text[4:6]]):
        whole = client.completions.create(**base, stop=stop).choices[0]
        stream = _joined(client.completions.create(**base, stop=stop, stream=True), chat=False)[0]
        assert (stream[0], stream[1], stream[3][-1]) == (whole.text, whole.model_extra["token_ids"], "stop")
    assert stack[1].batcher.dropped_rows > dropped  # a stopped choice's row left the batch


def test_the_first_tokens_go_out_after_the_first_chunk(stack):
    """The gate lets one chunk through: its tokens must reach the client while the call is
    held before its second chunk (a server that sent at the end would never send them)."""
    url, server, engine = stack
    engine.gate.allow(1)
    passed = engine.gate.passed
    reader = EventReader(url, "/v1/completions", {"model": "m", "prompt": [4, 5], "max_tokens": 12, "seed": 1,
                                                  "stream": True})
    assert reader.status == 200 and reader.response.getheader("content-type").startswith("text/event-stream")
    first = reader.first_tokens()["choices"][0]
    assert len(first["token_ids"]) == 1 and first["finish_reason"] is None  # a one-step first chunk
    wait_for(lambda: engine.gate.waiting, "the call to wait at its second chunk")
    assert engine.gate.passed == passed + 1
    engine.gate.allow(None)
    rest = list(reader)
    assert rest[-1] == "[DONE]" and rest[-2]["choices"][0]["finish_reason"] == "length"


def test_limits_key_and_refusals_come_before_the_stream(client, stack):
    url = stack[0]
    with pytest.raises(openai.BadRequestError, match="--max-request-rows"):
        list(client.completions.create(model="m", prompt="x", n=5, stream=True))
    with pytest.raises(openai.BadRequestError, match="--max-tokens-limit"):
        list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                            max_tokens=LONG + 1, stream=True))
    with pytest.raises(openai.NotFoundError):
        list(client.completions.create(model="nope", prompt="x", stream=True))
    with pytest.raises(openai.BadRequestError, match="stream_options"):
        client.completions.create(model="m", prompt="x", extra_body={"stream_options": {"include_usage": True}})
    bad_key = EventReader(url, "/v1/completions", {"model": "m", "prompt": "x", "stream": True}, key="wrong")
    assert bad_key.status == 401 and bad_key.response.getheader("content-type") == "application/json"


def test_an_engine_failure_after_the_stream_started_ends_it_with_an_error_event(client, stack):
    url, server, engine = stack
    engine.fail_after = 1
    stream = client.completions.create(model="m", prompt=[6, 6], max_tokens=12, seed=0, stream=True)
    with pytest.raises(openai.APIError) as info:
        for _ in stream:
            pass
    assert "internal server error (incident" in info.value.message and "secret" not in info.value.message
    events = list(EventReader(url, "/v1/completions", {"model": "m", "prompt": [6, 6], "max_tokens": 12,
                                                       "stream": True}))
    assert events[-1] == "[DONE]" and events[-2]["error"]["type"] == "internal_server_error"
    assert not [s for s in server.status_counts if s >= 500] and server.stream_counts["error"] >= 2


@pytest.mark.parametrize("streamed", [True, False])
def test_a_client_that_hangs_up_has_its_rows_dropped_from_the_running_call(stack, streamed):
    """The call holds at its second chunk while the client goes away; once the server has
    noticed, the gate opens: the call ends at the next chunk (a few steps, not max_tokens),
    and the next request runs in a call of its own."""
    url, server, engine = stack
    batcher = server.batcher
    calls, dropped = batcher.engine_calls, batcher.dropped_rows
    gone, hung_up = server.stream_counts["client_gone"], server.status_counts[499]
    engine.gate.allow(1)
    payload = {"model": "m", "prompt": [1, 2, 3], "max_tokens": LONG, "ignore_eos": True, "seed": 4}

    def call_held():
        wait_for(lambda: engine.gate.waiting and batcher.engine_calls == calls + 1, "the call to hold")

    if streamed:
        reader = EventReader(url, "/v1/completions", {**payload, "stream": True})
        reader.first_tokens()
        call_held()
        reader.hang_up()
        wait_for(lambda: server.stream_counts["client_gone"] == gone + 1, "the server to notice the hang-up")
    else:
        send_and_hang_up(url, "/v1/completions", json.dumps(payload).encode(), before_close=call_held)
        wait_for(lambda: server.status_counts[499] == hung_up + 1, "the server to notice the hang-up")
    engine.gate.allow(None)
    after = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=WAIT_S)
    assert after.completions.create(model="m", prompt=[9], max_tokens=3, seed=0).usage.completion_tokens == 3
    steps = list(batcher.call_steps)[-2:]
    assert steps[0] <= 1 + 2 * CHUNK_STEPS and steps[1] == 3, steps  # not LONG
    assert batcher.dropped_rows == dropped + 1 and batcher.engine_calls == calls + 2


def test_a_stream_past_its_time_limit_ends_with_a_timeout_event(model, tokenizer, stack):
    """A server with a 2 s limit; the gate holds the call after the first chunk, so the
    limit passes mid-stream: an error event with code request_timeout, and the rows leave
    the call once the gate opens."""
    engine = stack[2]
    registry = PolicyRegistry(model, tokenizer, "m", engine_factory=lambda m: engine)
    config = ServeConfig(BatcherConfig(max_wait_s=0.0, chunk_steps=CHUNK_STEPS), api_key=KEY,
                         limits=ServeLimits(request_timeout_s=2.0))
    server = PolicyServer(registry, config)
    engine.gate.allow(1)
    with inprocess_server(server) as url:
        reader = EventReader(url, "/v1/completions", {"model": "m", "prompt": [2, 2], "max_tokens": LONG,
                                                      "ignore_eos": True, "stream": True})
        reader.first_tokens()
        events = list(reader)  # blocks until the limit ends the stream
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "request_timeout"
        assert server.stream_counts["timeout"] == 1
        engine.gate.allow(None)
        wait_for(lambda: server.batcher.call_steps, "the call to end")
    assert server.batcher.dropped_rows == 1 and server.batcher.call_steps[0] <= 1 + 2 * CHUNK_STEPS
