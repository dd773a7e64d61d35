"""`jax-drive serve` access control: the API key on every endpoint but /health, admin
endpoints that need a key and load only from --allowed-weights-dir with answers that do not
reveal whether a path exists, and 500 answers without internal exception text. In-process
servers over an engine stub (no sampling needed), driven by the `openai` client and raw
HTTP."""

from __future__ import annotations

import json
import logging
import os

import openai
import pytest
from flax import nnx

from jax_drive.models.export import export_peft, save_safetensors
from jax_drive.models.lora import apply_lora
from jax_drive.serve import PolicyServer, ServeConfig
from jax_drive.serve.security import AllowedDirs, bearer_matches, is_loopback
from serve_fakes import KEY, HeldEngine, post_json, raw_request, tiny_registry
from servers import inprocess_server


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """allowed/ (a valid adapter, a valid checkpoint, an invalid directory, a file, a link
    out) and outside/ (a valid adapter)."""
    root = tmp_path_factory.mktemp("admin")
    allowed, outside = root / "allowed", root / "outside"
    allowed.mkdir()
    outside.mkdir()
    registry = tiny_registry(HeldEngine())
    adapter_model = nnx.clone(registry.model)
    apply_lora(adapter_model, rank=2, alpha=4.0, rngs=nnx.Rngs(1))
    export_peft(adapter_model, allowed / "adapter")
    export_peft(adapter_model, outside / "adapter")
    save_safetensors(registry.model, allowed / "weights")
    (allowed / "empty").mkdir()
    (allowed / "file.txt").write_text("not a checkpoint")
    os.symlink(outside / "adapter", allowed / "link_out")
    return allowed, outside


@pytest.fixture(scope="module")
def keyed(dirs):
    """(url, server, engine): API key KEY, loads allowed from dirs[0]."""
    engine = HeldEngine()
    server = PolicyServer(tiny_registry(engine), ServeConfig(api_key=KEY, allowed_weights_dirs=(str(dirs[0]),)))
    with inprocess_server(server) as url:
        yield url, server, engine


@pytest.fixture(scope="module")
def keyless():
    """(url, server): no API key, no allowed directories (the default configuration)."""
    server = PolicyServer(tiny_registry(HeldEngine()))
    with inprocess_server(server) as url:
        yield url, server


ENDPOINTS = [("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
             ("POST", "/v1/load_lora_adapter"), ("POST", "/v1/unload_lora_adapter"),
             ("POST", "/update_weights_from_disk"), ("GET", "/openapi.json"), ("GET", "/docs"),
             ("GET", "/no/such/path")]


# ----------------------------------------------------------------------- pure pieces
def test_bearer_and_loopback_rules():
    assert bearer_matches("Bearer k1", "k1") and bearer_matches("bearer  k1 ", "k1")
    for header in (None, "", "k1", "Basic k1", "Bearer k2", "Bearer k1x", "Bearerk1"):
        assert not bearer_matches(header, "k1"), header
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.3.4.5", "localhost", "::1", "[::1]"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.4", "example.com", "10.0.0.1"))


def test_allowed_dirs_decide_from_the_path_text_then_resolve_links(dirs):
    allowed, outside = dirs
    rules = AllowedDirs([allowed])
    assert rules.confine(str(allowed / "adapter")) == allowed / "adapter"
    assert rules.confine(str(allowed / "missing" / "x")) == allowed / "missing" / "x"
    for path in (str(outside / "adapter"), str(allowed / ".." / "outside" / "adapter"), "/etc/passwd",
                 "/nonexistent", str(allowed / "link_out"), "", "a\x00b", str(allowed) + "_sibling"):
        assert rules.confine(path) is None, path
    with pytest.raises(ValueError, match="not a directory"):
        AllowedDirs([allowed / "file.txt"])


# --------------------------------------------------------------------------- the key
@pytest.mark.parametrize("method, path", ENDPOINTS)
def test_every_endpoint_but_health_needs_the_key(keyed, method, path):
    url, _, _ = keyed
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"X-Api-Key": KEY}):
        status, answer_headers, body = raw_request(url, method, path, b"{}" if method == "POST" else None,
                                                   {"Content-Type": "application/json", **headers})
        assert status == 401, (path, headers, status)
        assert answer_headers["www-authenticate"] == "Bearer"
        assert json.loads(body)["error"]["code"] == "invalid_api_key"


def test_health_is_public_but_its_details_need_the_key(keyed):
    url, _, _ = keyed
    status, _, body = raw_request(url, "GET", "/health")
    assert status == 200 and json.loads(body) == {"status": "ok"}
    status, _, body = raw_request(url, "GET", "/health", headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200 and {"engine_calls", "rows", "queued_rows", "weights_path"} <= set(json.loads(body))


def test_openai_client_with_and_without_the_key(keyed):
    url, _, _ = keyed
    wrong = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model="m", prompt="hi", max_tokens=1)
    right = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in right.models.list().data] == ["m"]
    assert right.completions.create(model="m", prompt="hi", max_tokens=1).choices[0].text == "\x02"


def test_a_server_without_a_key_serves_but_refuses_every_admin_endpoint(keyless, dirs):
    url, server = keyless
    client = openai.OpenAI(base_url=url + "/v1", api_key="anything", max_retries=0)
    assert client.completions.create(model="m", prompt="abc", max_tokens=1).choices[0].text == "\x03"
    for path, payload in (("/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(dirs[0] / "adapter")}),
                          ("/v1/unload_lora_adapter", {"lora_name": "a"}),
                          ("/update_weights_from_disk", {"model_path": str(dirs[0] / "weights")})):
        status, body = post_json(url, path, payload, key=None)
        assert status == 403 and "--api-key" in body["error"]["message"], (path, body)
    assert server.registry.names() == ["m"] and server.registry.weights_path is None


def test_a_keyed_server_without_allowed_dirs_loads_nothing(dirs):
    server = PolicyServer(tiny_registry(HeldEngine()), ServeConfig(api_key=KEY))
    with inprocess_server(server) as url:
        status, body = post_json(url, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(dirs[0] / "adapter")})
        assert status == 403 and "--allowed-weights-dir" in body["error"]["message"]
    assert server.registry.names() == ["m"]


# ------------------------------------------------------------- path confinement
def test_admin_loads_are_confined_and_never_tell_whether_a_path_exists(keyed, dirs):
    url, server, _ = keyed
    allowed, outside = dirs

    def load(path):
        return post_json(url, "/v1/load_lora_adapter", {"lora_name": "probe", "lora_path": path})

    # outside the allowed directory: one 403, whether the path exists, is a valid adapter or not
    outside_answers = [load(p) for p in (str(outside / "adapter"), str(outside / "missing"), "/etc",
                                         "/etc/passwd", "/no/such/dir", str(allowed / ".." / "outside" / "adapter"),
                                         str(allowed / "link_out"))]
    assert {status for status, _ in outside_answers} == {403}
    assert len({json.dumps(body, sort_keys=True) for _, body in outside_answers}) == 1, outside_answers
    # inside: missing, an empty directory and a file get one and the same 400
    inside_answers = [load(str(allowed / name)) for name in ("missing", "empty", "file.txt", "weights")]
    assert {status for status, _ in inside_answers} == {400}
    assert len({json.dumps(body, sort_keys=True) for _, body in inside_answers}) == 1, inside_answers
    for _, body in outside_answers + inside_answers:
        message = body["error"]["message"]
        assert "exist" not in message and str(allowed) not in message and "/etc" not in message
    assert server.registry.names() == ["m"]
    # a valid adapter inside loads, and the name rules still answer by name
    status, body = load(str(allowed / "adapter"))
    assert status == 200 and server.registry.names() == ["m", "probe"], body
    status, body = load(str(allowed / "adapter"))
    assert status == 400 and "already been loaded" in body["error"]["message"]
    assert post_json(url, "/v1/unload_lora_adapter", {"lora_name": "probe"})[0] == 200


def test_weight_reloads_are_confined_the_same_way(keyed, dirs):
    url, server, _ = keyed
    allowed, outside = dirs

    def reload(path):
        return post_json(url, "/update_weights_from_disk", {"model_path": path})

    outside_answers = [reload(p) for p in ("/etc", "/no/such", str(outside / "adapter"))]
    assert {s for s, _ in outside_answers} == {403} and len({json.dumps(b) for _, b in outside_answers}) == 1
    inside_answers = [reload(str(allowed / name)) for name in ("missing", "empty", "adapter", "file.txt")]
    assert {s for s, _ in inside_answers} == {400} and len({json.dumps(b) for _, b in inside_answers}) == 1
    assert server.registry.weights_path is None
    status, _ = reload(str(allowed / "weights"))
    assert status == 200 and server.registry.weights_path == str(allowed / "weights")


# ------------------------------------------------------------------- 500 answers
def test_internal_errors_are_logged_but_never_sent(caplog):
    secret = "RuntimeError detail /srv/private/secret.bin"
    server = PolicyServer(tiny_registry(HeldEngine(fail_with=RuntimeError(secret))), ServeConfig(api_key=KEY))
    client = openai.OpenAI(base_url="http://unused/v1", api_key=KEY, max_retries=0)
    with caplog.at_level(logging.ERROR, logger="jax_drive.serve"), inprocess_server(server) as url:
        client = client.with_options(base_url=url + "/v1")
        with pytest.raises(openai.InternalServerError) as info:
            client.completions.create(model="m", prompt="x", max_tokens=1)
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=1)
    body = info.value.body
    text = json.dumps(body)
    assert body["type"] == "internal_server_error" and "incident" in body["message"]
    assert "secret" not in text and "RuntimeError" not in text and "/srv" not in text
    assert secret in caplog.text  # the operator sees it
