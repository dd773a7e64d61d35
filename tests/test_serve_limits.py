"""`jax-drive serve` limits: body size (413), prompts x n, prompt tokens and max_tokens
(400), wall time (408, the job dropped), the queued-rows bound (429 + Retry-After), and a
client that hangs up (its queued job dropped). In-process servers over an engine the test
holds and releases, so every check is about order and counts, never about elapsed time."""

from __future__ import annotations

import concurrent.futures
import json

import openai
import pytest

from jax_drive.serve import BatcherConfig, PolicyServer, ServeConfig, ServeLimits
from jax_drive.serve.batcher import GenerationJob, QueueFull, RequestBatcher
from jax_drive.sampling import SamplingParams
from serve_fakes import KEY, HeldEngine, post_json, raw_request, send_and_hang_up, tiny_registry, wait_for
from servers import inprocess_server

SMALL = ServeLimits(max_body_bytes=4096, max_request_rows=4, max_prompt_tokens=64, max_tokens=8,
                    request_timeout_s=None)


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def small():
    """(url, server, engine) with the SMALL limits and a free-running engine."""
    engine = HeldEngine()
    server = PolicyServer(tiny_registry(engine), ServeConfig(limits=SMALL, api_key=KEY, default_max_tokens=4))
    with inprocess_server(server) as url:
        yield url, server, engine


# ------------------------------------------------------------------- the settings
def test_limit_settings_are_checked():
    for bad in ({"max_body_bytes": 0}, {"max_tokens": -1}, {"request_timeout_s": float("nan")},
                {"request_timeout_s": float("inf")}):
        with pytest.raises(ValueError, match="finite number > 0"):
            ServeLimits(**bad)
    with pytest.raises(ValueError, match="--max-request-rows .* --max-queued-rows"):
        ServeConfig(limits=ServeLimits(max_request_rows=300))  # default queue bound 256
    with pytest.raises(ValueError, match="--default-max-tokens"):
        ServeConfig(limits=ServeLimits(max_tokens=8), default_max_tokens=16)
    assert ServeLimits.off() == ServeLimits(None, None, None, None, None)
    ServeConfig(limits=ServeLimits.off(), batcher=BatcherConfig(max_queued_rows=None))


# ------------------------------------------------------------ 400 / 413 per request
def test_requests_at_the_limits_are_served(small):
    url, _, engine = small
    client = _client(url)
    answer = client.completions.create(model="m", prompt=[[1] * 16, [2] * 16], n=2, max_tokens=8)
    assert len(answer.choices) == 4 and answer.usage.prompt_tokens == 64  # exactly at both limits
    chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], n=2,
                                          max_completion_tokens=8)
    assert len(chat.choices) == 2
    assert raw_request(url, "POST", "/v1/completions", json.dumps(
        {"model": "m", "prompt": "x" * 40, "max_tokens": 2}).ljust(4096).encode(),
        {"Authorization": f"Bearer {KEY}"})[0] == 200  # a 4096-byte body


@pytest.mark.parametrize("kwargs, match", [
    ({"prompt": "hi", "n": 5}, "at most 4 per request .--max-request-rows"),
    ({"prompt": ["a", "b", "c"], "n": 2}, "6 completions .3 prompt.s. x n=2"),
    ({"prompt": [[7]] * 1000}, "--max-request-rows"),
    ({"prompt": "x" * 65}, "more than 64 tokens .*--max-prompt-tokens"),
    ({"prompt": [[1] * 20, [2] * 20], "n": 2}, "--max-prompt-tokens"),
    ({"prompt": "hi", "max_tokens": 9}, "max_tokens is 9; this server allows at most 8 .--max-tokens-limit"),
])
def test_requests_over_a_limit_get_400_naming_it(small, kwargs, match):
    url, server, engine = small
    before = len(engine.calls)
    with pytest.raises(openai.BadRequestError, match=match):
        _client(url).completions.create(model="m", max_tokens=kwargs.pop("max_tokens", 2), **kwargs)
    assert len(engine.calls) == before  # refused before anything was queued


def test_a_huge_prompt_list_is_refused_before_tokenising():
    """200,000 one-token prompts in a 0.8 MB body (under the default 1 MiB body limit; such a
    body once asked for a 193 GB allocation): 400 by the row limit, from the list length."""
    server = PolicyServer(tiny_registry(HeldEngine()), ServeConfig(api_key=KEY))  # default limits
    body = json.dumps({"model": "m", "prompt": [[7]] * 200_000, "max_tokens": 1}).encode()
    assert len(body) < (1 << 20)
    with inprocess_server(server) as url:
        status, answer = post_json(url, "/v1/completions", body)
    assert status == 400 and "--max-request-rows" in answer["error"]["message"]
    assert server.registry.engine("m").calls == []


def test_chat_max_completion_tokens_and_n_are_limited_too(small):
    url, _, _ = small
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError, match="--max-tokens-limit"):
        _client(url).chat.completions.create(model="m", messages=messages, max_completion_tokens=9)
    with pytest.raises(openai.BadRequestError, match="--max-request-rows"):
        _client(url).chat.completions.create(model="m", messages=messages, n=5)
    with pytest.raises(openai.BadRequestError, match="--max-prompt-tokens"):
        _client(url).chat.completions.create(model="m", messages=[{"role": "user", "content": "y" * 60}])


def test_bodies_over_the_size_limit_get_413_before_they_are_read(small):
    url, _, engine = small
    with pytest.raises(openai.APIStatusError) as info:
        _client(url).completions.create(model="m", prompt="x" * 5000, max_tokens=1)
    assert info.value.status_code == 413 and "--max-body-bytes" in info.value.message
    # announced by Content-Length: answered without waiting for the (never sent) body
    status, _, body = raw_request_with_partial_body(url, declared=10 << 20, sent=b'{"model": "m"')
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
    # chunked (no Content-Length): counted while reading
    status, _, _ = raw_request(url, "POST", "/v1/completions", iter([b"{" + b" " * 3000] * 3),
                               {"Authorization": f"Bearer {KEY}"})  # an iterable: http.client sends it chunked
    assert status == 413


def raw_request_with_partial_body(url, declared: int, sent: bytes):
    """Sends headers announcing ``declared`` bytes and only ``sent``, then reads the answer."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
        sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n").encode() + sent)
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _content_length(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), head, body


def _content_length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 1 << 30


# --------------------------------------------------------- queue, timeout, hang-ups
def test_the_batcher_refuses_jobs_past_its_queue_bound():
    engine = HeldEngine(hold=True)
    batcher = RequestBatcher(lambda name: engine, BatcherConfig(max_batch_rows=2, max_wait_s=0.0,
                                                                max_queued_rows=3)).start()
    params = SamplingParams(max_new_tokens=1)
    try:
        running = batcher.submit(GenerationJob("m", [[1], [1]], params))
        wait_for(engine.entered.is_set, "the first batch to start")
        queued = [batcher.submit(GenerationJob("m", [[2], [2]], params)), batcher.submit(GenerationJob("m", [[3]], params))]
        assert batcher.queued_rows == 3
        with pytest.raises(QueueFull, match="queue bound of 3"):
            batcher.submit(GenerationJob("m", [[4]], params))
        engine.release()
        for future in [running, *queued]:
            assert len(future.result(timeout=60)) >= 1
        assert batcher.queued_rows == 0
        batcher.submit(GenerationJob("m", [[5]] * 3, params)).result(timeout=60)  # room again
    finally:
        engine.release()
        batcher.stop()


def test_a_full_queue_answers_429_with_retry_after_and_the_queued_requests_are_served():
    engine = HeldEngine(hold=True)
    config = ServeConfig(BatcherConfig(max_batch_rows=2, max_wait_s=0.0, max_queued_rows=4),
                         limits=ServeLimits(max_request_rows=4), api_key=KEY)
    server = PolicyServer(tiny_registry(engine), config)
    with inprocess_server(server) as url, concurrent.futures.ThreadPoolExecutor(4) as pool:
        client = _client(url)
        first = pool.submit(client.completions.create, model="m", prompt=[[1], [1]], max_tokens=1)
        wait_for(engine.entered.is_set, "the first batch to start")
        queued = [pool.submit(client.completions.create, model="m", prompt=[[2], [2]], max_tokens=1)
                  for _ in range(2)]
        wait_for(lambda: server.batcher.queued_rows == 4, "4 rows queued")
        status, headers, body = raw_request(url, "POST", "/v1/completions", json.dumps(
            {"model": "m", "prompt": [3], "max_tokens": 1}).encode(), {"Authorization": f"Bearer {KEY}"})
        assert status == 429 and headers["retry-after"] == "1"
        assert json.loads(body)["error"]["code"] == "queue_full"
        with pytest.raises(openai.RateLimitError):
            client.completions.create(model="m", prompt=[3], max_tokens=1)
        engine.release()
        assert [len(f.result(timeout=60).choices) for f in [first, *queued]] == [2, 2, 2]
    assert [3] not in engine.rows()


def test_a_request_past_its_time_limit_gets_408_and_its_queued_rows_are_dropped():
    engine = HeldEngine(hold=True)
    config = ServeConfig(BatcherConfig(max_batch_rows=1, max_wait_s=0.0),
                         limits=ServeLimits(request_timeout_s=5.0), api_key=KEY)
    server = PolicyServer(tiny_registry(engine), config)
    with inprocess_server(server) as url, concurrent.futures.ThreadPoolExecutor(2) as pool:
        client = _client(url)

        def ask(prompt):
            with pytest.raises(openai.APIStatusError) as info:
                client.completions.create(model="m", prompt=prompt, max_tokens=1)
            return info.value

        running = pool.submit(ask, [1])
        wait_for(engine.entered.is_set, "the first batch to start")
        queued = pool.submit(ask, [9, 9])
        wait_for(lambda: server.batcher.queued_rows == 1, "the second request to be queued")
        for future in (running, queued):  # the engine is held: neither can finish in time
            error = future.result(timeout=60)
            assert error.status_code == 408 and "--request-timeout" in error.message
        engine.release()
        wait_for(lambda: server.batcher.cancelled_rows == 1, "the timed-out queued job to be dropped")
    assert engine.rows() == [[1]]  # the queued request never reached the engine


def test_a_client_that_hangs_up_has_its_queued_job_dropped():
    engine = HeldEngine(hold=True)
    config = ServeConfig(BatcherConfig(max_batch_rows=1, max_wait_s=0.0), api_key=KEY)
    server = PolicyServer(tiny_registry(engine), config)
    with inprocess_server(server) as url, concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(post_json, url, "/v1/completions", {"model": "m", "prompt": [1], "max_tokens": 1})
        wait_for(engine.entered.is_set, "the first batch to start")
        send_and_hang_up(url, "/v1/completions", json.dumps({"model": "m", "prompt": [8, 8, 8], "max_tokens": 1,
                                                             "n": 2}).encode(),
                         before_close=lambda: wait_for(lambda: server.batcher.queued_rows == 2, "the job queued"))
        wait_for(lambda: server.status_counts[499] == 1, "the server to notice the hang-up")
        send_and_hang_up(url, "/v1/completions", b'{"model": "m", "pro', declared=500)  # mid-body
        wait_for(lambda: server.status_counts[499] == 2, "the server to notice the mid-body hang-up")
        engine.release()
        assert running.result(timeout=60)[0] == 200
        wait_for(lambda: server.batcher.cancelled_rows == 2, "the hung-up job to be dropped")
        assert post_json(url, "/v1/completions", {"model": "m", "prompt": [2], "max_tokens": 1})[0] == 200
    assert engine.rows() == [[1], [2]] and server.batcher.queued_rows == 0
