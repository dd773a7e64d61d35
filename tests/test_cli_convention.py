"""The entry-point convention (jax_drive.runinfo) on the `jax-drive` commands and the
experiments/ scripts: a cheap parser, --json / --no-progress, exit code 2 with a message on
bad input, no results file written by a failed run."""

from __future__ import annotations

import json
import shlex
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jax_drive.cli import main

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("jax", "jaxlib", "flax", "numpy", "torch", "transformers", "ray")

def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")


def test_building_the_parser_imports_nothing_heavy():
    probe = f"""
import json, sys
import jax_drive.cli as cli
parser = cli.build_parser()
commands = sorted(parser._subparsers._group_actions[0].choices)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
print(json.dumps({{"commands": commands, "heavy": heavy, "expected": sorted(cli.COMMAND_MODULES)}}))
"""
    proc = subprocess.run([sys.executable, "-c", probe], env=_env(), cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["commands"] == found["expected"] and "sim" in found["commands"]  # every command registered
    assert found["heavy"] == []


def _exit_code(argv: list[str]) -> int:
    """main(argv), with argparse's own exits (SystemExit) as codes too."""
    try:
        return main(argv)
    except SystemExit as stop:
        return int(stop.code)


@pytest.mark.parametrize("argv, message", [
    (["chat", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
    (["chat", "--temperature", "-1", "--prompt", "hi", "--model", "/nonexistent"], "temperature"),
    (["chat", "--json", "{tmp}/reply.json"], "needs --prompt"),
    (["convert", "/nonexistent", "{tmp}/full"], "is not empty"),
    (["convert", "/nonexistent", "{tmp}/full/file.txt"], "file.txt is a file, not a directory"),
    (["sim", "run", "--scenario", "tv_red_light", "--episodes", "0", "--json", "{tmp}/m.json"],
     "--episodes must be >= 1"),
    (["sim", "run", "--scenario", "bogus", "--json", "{tmp}/m.json"], "bogus"),
    (["serve", "--max-batch-rows", "0"], "--max-batch-rows must be >= 1"),
    (["serve", "--port", "70000"], "--port must be <= 65535"),
    (["serve", "--lora", "no-equals-sign"], "--lora takes NAME=PATH"),
    (["scale-out", "run", "--scenario", "tv_red_light", "--results", "{tmp}/r", "--workers", "0"],
     "--workers must be >= 1"),
    (["coop", "--scenario", "tv_red_light", "--episodes", "0", "--json", "{tmp}/m.json"], "--episodes must be >= 1"),
    (["coop", "--scenario", "bogus", "--json", "{tmp}/m.json"], "bogus"),
    (["scale-out", "carla-pool", "--carla-root", "{tmp}", "--ready-timeout", "-1"], "--ready-timeout must be >= 0"),
])
def test_cli_commands_exit_2_with_a_message_on_bad_values(argv, message, tmp_path, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "file.txt").write_text("x")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "error" in err
    assert not (tmp_path / "reply.json").exists() and not (tmp_path / "m.json").exists()


def test_cli_argparse_errors_exit_2(capsys):
    assert _exit_code(["sim", "run", "--scenario", "tv_red_light", "--episodes", "many"]) == 2
    assert "invalid int value: 'many'" in capsys.readouterr().err


# ------------------------------------------------------------------ experiments/ scripts
def _zero(flag: str) -> tuple[list[str], str]:
    """A count flag set to 0 and require_min's message for it."""
    return [flag, "0"], f"{flag} must be >= 1, got 0"


# script -> arguments that are bad before anything heavy is imported, and the message.
SCRIPTS = {
    "bench_ipss": _zero("--group"),
    "diagnostics/bench_matmul": _zero("--repeats"),
    "bench_negotiation": _zero("--groups"),
    "interdrive": (["--engine", "openai"], "--engine openai needs --url"),
    "bench_mesh": _zero("--repeats"),
    "bench_models": _zero("--batch"),
    "bench_sampler": (["--batches", "1", "9"], "at most 8 prompts"),
    "bench_sampler_features": (["--prompts", "9"], "--prompts: at most 8"),
    "bench_serve": (["--max-wait-ms", "-1"], "--max-wait-ms must be >= 0"),
    "bench_sim": _zero("--episodes"),
    "bench_train": _zero("--length"),
    "bench_vlm": _zero("--repeats"),
    "coop_baselines": (["--reuse-tv", "/nonexistent.json"], "--reuse-tv /nonexistent.json"),
    "diagnostics/memory_logprob": (["--sections", "update,bogus"], "--sections must name some of"),
    "bench_ray": (["--workers", "1,two"], "--workers wants comma-separated integers"),
    "bench_rollout": _zero("--group"),
    "bench_coop": _zero("--episodes"),
    "talking_vehicles": (["--method", "silent", "--method", "silent"], "--method names a method twice"),
    "bench_test_suite": _zero("--workers"),
}


def _script(name: str, *args: str, importtime: bool = False) -> subprocess.CompletedProcess:
    env = _env()
    if importtime:
        env["PYTHONPROFILEIMPORTTIME"] = "1"
    return subprocess.run([sys.executable, str(ROOT / "experiments" / f"{name}.py"), *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_script_help_names_a_required_json_and_the_progress_switch(name):
    proc = _script(name, "--help")
    assert proc.returncode == 0, proc.stderr
    usage = " ".join(proc.stdout.split("\n\n")[0].split())  # "usage: ..." up to the first blank line
    assert "--json OUT" in usage and "[--json" not in usage  # required: no default results path
    assert "--no-progress" in proc.stdout
    assert "--skip-" not in proc.stdout  # peers are switched off with --no-<peer>


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_script_bad_value_exits_2_before_heavy_imports(name, tmp_path):
    args, message = SCRIPTS[name]
    out = tmp_path / "out.json"
    proc = _script(name, *args, "--json", str(out), importtime=True)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"error: {message}" in proc.stderr or message in proc.stderr
    imported = {m.group(1).split(".")[0] for m in re.finditer(r"^import time:.*\|\s+(\S+)$", proc.stderr, re.M)}
    assert imported and not imported & {"jax", "torch", "transformers", "flax", "ray"}
    assert not out.exists()


def test_chat_one_shot_writes_json_with_meta(tmp_path, capsys):
    from jax_drive.models.export import save_safetensors
    from jax_drive.models.tiny import tiny_policy

    model, _, tokenizer = tiny_policy(lora_rank=None)
    save_safetensors(model, tmp_path / "ckpt", tokenizer=tokenizer)
    out = tmp_path / "reply.json"
    assert main(["chat", "--model", str(tmp_path / "ckpt"), "--prompt", "hi", "--max-new-tokens", "3",
                 "--json", str(out)]) == 0
    reply = json.loads(out.read_text())
    assert reply["meta"]["command"] == "chat" and "date_utc" in reply["meta"]
    assert reply["meta"]["invocation"] == shlex.join(["jax-drive", "chat", "--model", str(tmp_path / "ckpt"), "--prompt",
                                                      "hi", "--max-new-tokens", "3", "--json", str(out)])
    assert 1 <= reply["num_tokens"] <= 3 and reply["messages"][0] == {"role": "user", "content": "hi"}
    assert reply["reply"] == capsys.readouterr().out.strip()


def test_score_planner_names_match_the_evaluation_api():
    from jax_drive.cli.score import PLANNER_NAMES
    from jax_drive.evaluate import PLANNERS

    assert sorted(PLANNER_NAMES) == sorted(PLANNERS)
