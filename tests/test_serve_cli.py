"""`jax-drive serve` deployment checks at the command line: a non-loopback --host needs an
API key (or --allow-unauthenticated) and is warned about, admin directories need a key,
limit flags are checked (exit 2 naming the flag, before the model stack is imported), and a
port in use exits 1 with the reason before any URL is printed."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from jax_drive.cli import build_parser, main
from jax_drive.cli.serve import _api_key, check_deployment
from jax_drive.serve.limits import DEFAULT_MAX_QUEUED_ROWS, ServeLimits

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("jax", "jaxlib", "flax", "numpy", "fastapi", "uvicorn")


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def _env() -> dict:
    """This environment without an API key, importing this checkout."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_DRIVE_API_KEY"}
    return env | {"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}


@pytest.mark.parametrize("argv, message", [
    (["--host", "0.0.0.0"], "--host 0.0.0.0 accepts connections from other machines: give --api-key"),
    (["--host", "192.168.7.7"], "or --allow-unauthenticated"),
    (["--allowed-weights-dir", "/tmp"], "--allowed-weights-dir enables loading from disk, which needs an API key"),
    (["--api-key", "k", "--allowed-weights-dir", "/no/such/dir"], "--allowed-weights-dir '/no/such/dir' is not a directory"),
    (["--api-key", " "], "--api-key must be non-empty"),
    (["--request-timeout", "nan"], "--request-timeout must be a finite number"),
    (["--request-timeout", "-1"], "--request-timeout must be >= 0"),
    (["--max-body-bytes", "-5"], "--max-body-bytes must be >= 0"),
    (["--max-request-rows", "300"], "--max-request-rows (300) must be <= --max-queued-rows (256)"),
    (["--max-request-rows", "0"], "--max-request-rows (off) must be <= --max-queued-rows"),
    (["--max-tokens-limit", "8"], "--default-max-tokens (16) must be <= --max-tokens-limit (8)"),
    (["--decode-chunk-steps", "0"], "--decode-chunk-steps must be >= 1"),
])
def test_unsafe_or_bad_settings_exit_2_naming_the_flag(argv, message, capsys, monkeypatch):
    monkeypatch.delenv("JAX_DRIVE_API_KEY", raising=False)
    assert main(["serve", "--model", "/never/loaded", *argv]) == 2
    assert message in capsys.readouterr().err


def test_refusals_come_before_the_model_stack_is_imported():
    probe = ("import json, sys\nfrom jax_drive.cli import main\n"
             "code = main(['serve', '--host', '0.0.0.0', '--max-queued-rows', '4'])\n"
             f"print(json.dumps({{'code': code, 'heavy': sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})}}))")
    proc = subprocess.run([sys.executable, "-c", probe], env=_env(), cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found == {"code": 2, "heavy": []}, proc.stderr
    assert "--max-request-rows (128) must be <= --max-queued-rows (4)" in proc.stderr


def test_non_loopback_hosts_warn_and_the_key_comes_from_the_environment(monkeypatch):
    assert check_deployment(_args("--host", "127.0.0.1"), None) == []
    assert check_deployment(_args("--host", "localhost"), None) == []
    keyed = check_deployment(_args("--host", "0.0.0.0"), "k")
    assert len(keyed) == 1 and "plain HTTP" in keyed[0]
    open_ = check_deployment(_args("--host", "0.0.0.0", "--allow-unauthenticated"), None)
    assert len(open_) == 2 and "anyone who reaches this port" in open_[1]
    monkeypatch.setenv("JAX_DRIVE_API_KEY", "from-env")
    assert _api_key(_args()) == "from-env" and _api_key(_args("--api-key", "flag")) == "flag"
    monkeypatch.setenv("JAX_DRIVE_API_KEY", "")
    assert _api_key(_args()) is None


def test_help_shows_the_limit_defaults():
    text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()
    defaults = ServeLimits()
    for flag, value in (("--max-body-bytes", defaults.max_body_bytes), ("--max-request-rows", defaults.max_request_rows),
                        ("--max-prompt-tokens", defaults.max_prompt_tokens),
                        ("--max-tokens-limit", defaults.max_tokens), ("--request-timeout", 600),
                        ("--max-queued-rows", DEFAULT_MAX_QUEUED_ROWS)):
        assert flag in text and f"(default {value})" in " ".join(text.split()), flag


def test_a_port_in_use_exits_1_before_printing_the_url(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "jax_drive.cli", "serve", "--model", str(tmp_path / "unused"),
                               "--port", str(port)], env=_env(), cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert f"error: cannot listen on 127.0.0.1:{port}: Address already in use" in proc.stderr
    assert "http://" not in proc.stderr + proc.stdout and "Traceback" not in proc.stderr


def test_model_and_adapter_errors_name_their_flag(tmp_path, capsys, monkeypatch):
    from jax_drive.models.export import save_safetensors
    from jax_drive.models.tiny import tiny_policy
    from jax_drive.serve.launch import free_port

    monkeypatch.delenv("JAX_DRIVE_API_KEY", raising=False)
    model, _, tokenizer = tiny_policy(lora_rank=None)
    save_safetensors(model, tmp_path / "ckpt", tokenizer=tokenizer)
    cases = [(["--model", str(tmp_path / "missing")], f"--model {tmp_path / 'missing'}: "),
             (["--model", str(tmp_path / "ckpt"), "--lora", f"a={tmp_path / 'no_adapter'}"],
              f"--lora a={tmp_path / 'no_adapter'}: "),
             (["--served-model-name", " "], "--served-model-name must be non-empty"),
             (["--max-loras", "1", "--lora", "a=/x", "--lora", "b=/y"], "2 --lora adapters exceed --max-loras 1")]
    for argv, message in cases:
        assert main(["serve", "--port", str(free_port()), *argv]) == 2, argv
        assert message in capsys.readouterr().err, argv
