"""Every entry point checks what it will write and the numbers it is given before any model,
JAX or Ray starts; results JSON is strict; a local Ray instance never outlives its driver.

The exit-code tests run each command or script in one probe process and look at what it
imported: an entry point refused before its heavy imports leaves jax, flax, torch,
transformers and Ray (and, for the `jax-drive` commands, numpy) out of ``sys.modules``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from jax_drive.runinfo import SIGTERM_EXIT_CODE, output_dir, output_file

ROOT = Path(__file__).resolve().parents[1]
CLI_HEAVY = ("jax", "jaxlib", "flax", "numpy", "torch", "transformers", "ray")
SCRIPT_HEAVY = ("jax", "jaxlib", "flax", "torch", "transformers", "ray")  # scripts may import numpy first

# Paths no entry point can write, whoever runs the tests (root writes through permission bits,
# not into /proc or /sys). "{tmp}/afile" is a regular file made by the test.
BAD_FILES = ("/proc/x.json", "{tmp}/afile/x.json", "/sys/x.json", "{tmp}")
BAD_DIRS = ("/proc/run", "{tmp}/afile", "{tmp}/afile/run", "/sys/run")

# The arguments each command needs besides the output being tested ("{out}": a positional output).
CLI_BASE = {
    "score": [],
    "data build": ["--kind", "single", "--scenes", "2", "--out", "{tmp}/ok/d.jsonl"],
    "chat": ["--prompt", "hi"],
    "convert": ["smollm2-135m-instruct", "{out}"],
    "train": ["--preset", "smoke"],
    "sim run": ["--scenario", "tv_red_light"],
    "coop": ["--scenario", "tv_red_light"],
    "coop-rl": ["--preset", "smoke"],
    "scale-out run": ["--scenario", "tv_red_light", "--results", "{tmp}/ok/results"],
    "scale-out status": ["--results", "{tmp}"],
    "scale-out carla-pool": ["--carla-root", "{tmp}"],
    "scale-out job sft": ["--data", "{tmp}/afile"],
    "scale-out job grpo": [],
    "scale-out job score": [],
    "scale-out job episodes": ["--scenario", "tv_red_light"],
}
# Every output of every command: (command, flag as argparse names it).
CLI_OUTPUTS = {
    ("score", "--json"), ("score", "--csv"), ("score", "--plot"), ("data build", "--out"), ("data build", "--card"),
    ("chat", "--json"), ("convert", "out"), ("train", "--out"), ("train", "--json"), ("sim run", "--json"),
    ("sim run", "--plot"), ("sim run", "--replay"), ("coop", "--json"), ("coop", "--run-dir"),
    ("coop-rl", "--out"), ("coop-rl", "--json"),
    ("scale-out run", "--results"), ("scale-out run", "--json"), ("scale-out run", "--xla-cache"),
    ("scale-out status", "--json"), ("scale-out carla-pool", "--json"), ("scale-out job sft", "--out"),
    ("scale-out job grpo", "--out"), ("scale-out job score", "--json"), ("scale-out job episodes", "--json"),
}
# Non-finite numbers: (argv, the flag the message names).
CLI_NON_FINITE = [
    (["chat", "--prompt", "hi", "--temperature", "nan"], "--temperature"),
    (["chat", "--prompt", "hi", "--top-p=inf"], "--top-p"),
    (["score", "--hard-fraction", "nan"], "--hard-fraction"),
    (["data", "build", "--kind", "qa", "--scenes", "2", "--out", "{tmp}/ok/d.jsonl", "--hard-fraction", "nan"],
     "--hard-fraction"),
    (["data", "build", "--kind", "rl", "--scenes", "2", "--out", "{tmp}/ok/d.jsonl", "--easy-ratio", "inf"],
     "--easy-ratio"),
    (["scale-out", "run", "--scenario", "tv_red_light", "--results", "{tmp}/ok/r", "--max-time", "nan"], "--max-time"),
    (["scale-out", "run", "--scenario", "tv_red_light", "--results", "{tmp}/ok/r", "--task-timeout=-inf"],
     "--task-timeout"),
    (["scale-out", "carla-pool", "--carla-root", "{tmp}", "--ready-timeout", "nan"], "--ready-timeout"),
]


def _env(**extra) -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", **extra)


def _leaf_parsers(parser: argparse.ArgumentParser, prefix: tuple = ()):
    """(command words, parser) of every runnable (sub)command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _leaf_parsers(sub, prefix + (name,))
            return
    yield prefix, parser


def _fill(args: list[str], tmp: Path) -> list[str]:
    return [a.replace("{tmp}", str(tmp)) for a in args]


def _output_cases(tmp: Path) -> tuple[set, list]:
    """The outputs the parser declares, and (argv, flag, bad path) for each output and bad path."""
    from jax_drive.cli import build_parser

    found, cases = set(), []
    for words, parser in _leaf_parsers(build_parser()):
        command = " ".join(words)
        for action in parser._actions:
            if action.type not in (output_file, output_dir):
                continue
            flag = "/".join(action.option_strings) or action.dest
            found.add((command, flag))
            for bad in (BAD_FILES if action.type is output_file else BAD_DIRS):
                bad = bad.replace("{tmp}", str(tmp))
                base = CLI_BASE[command]
                if not action.option_strings:
                    argv = [bad if a == "{out}" else a for a in base]
                elif action.option_strings[0] in base:
                    argv = list(base)
                    argv[argv.index(action.option_strings[0]) + 1] = bad
                else:
                    argv = base + [action.option_strings[0], bad]
                cases.append(([*words, *_fill(argv, tmp)], flag, bad))
    return found, cases


PROBE = """
import contextlib, io, json, sys
from jax_drive.cli import main
heavy_roots = set(sys.argv[2].split(","))
rows = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code
    rows.append({"code": code, "err": err.getvalue(),
                 "heavy": sorted(m for m in sys.modules if m.split(".")[0] in heavy_roots)})
print(json.dumps(rows))
"""


def _probe_cli(cases: list[list[str]], cwd: Path) -> list[dict]:
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(cases), ",".join(CLI_HEAVY)], env=_env(),
                          cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.fixture
def scratch(tmp_path) -> Path:
    (tmp_path / "afile").write_text("a regular file")
    (tmp_path / "ok").mkdir()
    return tmp_path


def test_every_command_refuses_an_unwritable_output_before_heavy_imports(scratch):
    found, cases = _output_cases(scratch)
    assert found == CLI_OUTPUTS  # every output flag is checked while parsing (type output_file / output_dir)
    non_finite = [(_fill(argv, scratch), flag, "must be a finite number") for argv, flag in CLI_NON_FINITE]
    rows = _probe_cli([argv for argv, _, _ in cases + non_finite], scratch)
    for (argv, flag, expected), row in zip(cases + non_finite, rows):
        assert row["code"] == 2, (argv, row["err"])
        assert f"argument {flag}: " in row["err"] and expected in row["err"], (argv, row["err"])
        assert row["heavy"] == [], (argv, row["heavy"])
    assert sorted(p.name for p in scratch.iterdir()) == ["afile", "ok"] and not any((scratch / "ok").iterdir())


def test_every_choice_is_listed_in_help():
    """A flag with a closed set of values names every value in its command's --help (a metavar
    hides argparse's own {a,b} list, so the help text must carry it then)."""
    from jax_drive.cli import build_parser

    checked = 0
    for words, parser in _leaf_parsers(build_parser()):
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            if action.option_strings and action.choices is not None:
                missing = [c for c in action.choices if str(c) not in text]
                assert not missing, (" ".join(words), action.option_strings[0], missing)
                checked += 1
    assert checked >= 10


def test_default_run_directories_are_checked_before_heavy_imports(tmp_path):
    (tmp_path / "runs").write_text("not a directory")  # the commands' default output root
    rows = _probe_cli([["train", "--preset", "smoke"], ["coop", "--scenario", "tv_red_light"]], tmp_path)
    for flag, row in zip(("--out runs", "--run-dir runs/coop/tv_red_light/cpu-demo"), rows):
        assert row["code"] == 2 and f"error: {flag}" in row["err"] and "runs is a file, not a directory" in row["err"]
        assert row["heavy"] == []


# ------------------------------------------------------------------ experiments/ scripts
# Scripts with no output to check: a module other scripts import, and the results index
# (it writes experiments/results/INDEX.md, in the checkout).
NOT_ENTRY_POINTS = {"cpu_steal", "results_index"}
SCRIPT_BASE = {"mtdrive": ["--preset", "smoke"], "mtdrive_reeval": ["{tmp}", "--eval-scenes", "2"],
               "mtdrive_seeds": ["{tmp}"], "navsim_parity": ["compare", "--navsim", "{tmp}/afile"]}
# Outputs besides --json: (script, flag, bad path).
SCRIPT_OUTPUTS = [("ablation_mtgrpo", "--out", "{tmp}/afile"), ("interdrive", "--work-dir", "{tmp}/afile/run"),
                  ("talking_vehicles", "--run-dir", "/proc/run"), ("bench_ray", "--xla-cache", "/sys/cache"),
                  ("mtdrive", "--out", "/proc/run"), ("mtdrive_reeval", "--out-root", "{tmp}/afile")]
# Outputs of a subcommand other than SCRIPT_BASE's: (script, arguments, flag, bad path).
SCRIPT_SUBCOMMAND_OUTPUTS = [("navsim_parity", ["cases", "--out", "/proc/run"], "--out", "/proc/run")]
SCRIPT_NON_FINITE = [("score_planners", "--hard-fraction", "nan"), ("bench_draw", "--noise", "nan"),
                     ("coop_baselines", "--id-max-time", "inf"), ("bench_rollout", "--temperature", "nan"),
                     ("bench_serve", "--max-wait-ms", "inf"), ("bench_pdm", "--max-steal", "nan")]

SCRIPT_PROBE = """
import contextlib, io, json, os, runpy, sys
experiments = sys.argv[1]
sys.path.insert(0, experiments)
heavy_roots = set(sys.argv[3].split(","))
rows = []
for name, args in json.loads(sys.argv[2]):
    err = io.StringIO()
    sys.argv = [os.path.join(experiments, name + ".py"), *args]
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
            code = None
        except SystemExit as stop:
            code = stop.code
    rows.append({"code": code, "err": err.getvalue(),
                 "heavy": sorted(m for m in sys.modules if m.split(".")[0] in heavy_roots)})
print(json.dumps(rows))
"""


def _scripts() -> list[str]:
    found = [p.relative_to(ROOT / "experiments").with_suffix("").as_posix()
             for p in sorted((ROOT / "experiments").glob("*.py")) + sorted((ROOT / "experiments").glob("*/*.py"))]
    return [name for name in found if name not in NOT_ENTRY_POINTS]


def test_every_script_refuses_an_unwritable_output_before_heavy_imports(scratch):
    cases = [(name, [*SCRIPT_BASE.get(name, []), "--json", "/proc/x.json"], "--json", "/proc/x.json")
             for name in _scripts() if name != "mtdrive_reeval"]  # mtdrive_reeval writes into run directories
    cases += [(name, [*SCRIPT_BASE.get(name, []), flag, bad], flag, bad) for name, flag, bad in SCRIPT_OUTPUTS]
    cases += SCRIPT_SUBCOMMAND_OUTPUTS
    cases += [(name, [f"{flag}={value}", "--json", "{tmp}/ok/out.json"], flag, "")
              for name, flag, value in SCRIPT_NON_FINITE]
    cases = [(name, _fill(args, scratch), flag, bad.replace("{tmp}", str(scratch))) for name, args, flag, bad in cases]
    proc = subprocess.run([sys.executable, "-c", SCRIPT_PROBE, str(ROOT / "experiments"),
                           json.dumps([(name, args) for name, args, _, _ in cases]), ",".join(SCRIPT_HEAVY)],
                          env=_env(), cwd=scratch, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for (name, args, flag, bad), row in zip(cases, json.loads(proc.stdout)):
        assert row["code"] == 2, (name, args, row["err"][-2000:])
        assert flag in row["err"] and bad in row["err"] and "error" in row["err"], (name, row["err"][-2000:])
        assert row["heavy"] == [], (name, row["heavy"])
    assert not any((scratch / "ok").iterdir()) and sorted(p.name for p in scratch.iterdir()) == ["afile", "ok"]


# ------------------------------------------------------------------ numbers and strict results
@pytest.mark.parametrize("setting, message", [
    (["--set", "rl.optim.learning_rate=nan"], "--set rl.optim.learning_rate=nan: learning_rate must be"),
    (["--set", "rl.optim.learning_rate=inf"], "--set rl.optim.learning_rate=inf: learning_rate must be"),
    (["--set", "rl.loss.clip_eps=nan"], "--set rl.loss.clip_eps=nan: must be a finite number"),
    (["--set", "rl.rollout.caption.radius=-inf"], "--set rl.rollout.caption.radius=-inf: must be a finite number"),
    (["--preset-file", "{tmp}/p.json"], "p.json: rl.loss.kl_clamp=nan: must be a finite number"),
])
def test_train_refuses_non_finite_settings(setting, message, tmp_path, capsys):
    from jax_drive.cli import main

    (tmp_path / "p.json").write_text('{"rl": {"loss": {"kl_clamp": NaN}}}')  # json.load reads NaN
    argv = ["train", "--preset", "smoke", "--out", str(tmp_path / "run"), *_fill(setting, tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "error" in err
    assert not (tmp_path / "run").exists()


def test_train_stops_with_exit_1_and_one_line_when_a_step_is_not_finite(tmp_path, capsys, monkeypatch):
    """The trainers raise NonFiniteError (tests/test_rl_loop.py, tests/test_rl_e2e.py); the command
    turns it into one line naming the step, the quantity and the kept checkpoint, exit 1, and no
    results file."""
    import jax_drive.pipelines.mtdrive as mtdrive
    from jax_drive.cli import main
    from jax_drive.rl.loop import NonFiniteError

    def non_finite_run(*_, **__):
        raise NonFiniteError("grpo step 2: loss is nan (non-finite); the last finite state is checkpoint 1 in x")

    monkeypatch.setattr(mtdrive, "run_mtdrive", non_finite_run)
    out = tmp_path / "run"
    assert main(["train", "--preset", "smoke", "--out", str(out), "--json", str(tmp_path / "r.json")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: grpo step 2: loss is nan") and "checkpoint 1" in err and "skip_nonfinite" in err
    assert "Traceback" not in err and not (out / "results.json").exists() and not (tmp_path / "r.json").exists()


def test_coop_table_shows_the_timeout_rate():
    from jax_drive.pipelines.talking_vehicles import table_rows

    agg = {"CR": {"mean": 0.0, "se": 0.0}, "SR": {"mean": 0.0, "se": 0.0}, "TR": {"mean": 100.0, "se": 0.0}}
    result = {"scenarios": {"tv_red_light": {"aggregate": agg}}, "average": {"aggregate": agg}}
    head, keys, row = table_rows({"zero_shot": result}, ["tv_red_light"], keys=("CR", "SR", "TR")).splitlines()
    assert head.split() == ["method", "red_light", "average"] and keys.split() == ["CR", "SR", "TR"] * 2
    assert row.split()[0] == "zero_shot" and row.split()[1::2] == ["0.0±", "0.0±", "100.0±"] * 2
    assert table_rows({"zero_shot": result}, ["tv_red_light"]).splitlines()[1].split() == ["CR", "SR"] * 2


# ------------------------------------------------------------------ scale-out: a local Ray instance
RAY_DRIVER = """
import os, sys, time
import ray
from jax_drive.distributed.pool import ray_session

with ray_session("local", num_cpus=1) as resources:
    @ray.remote
    class Helper:
        def pid(self):
            return os.getpid()

    helper = Helper.remote()
    print("up", ray.get(helper.pid.remote()), resources.get("CPU"), flush=True)
    time.sleep(600)
"""


def _processes_naming(text: str) -> list[int]:
    """Processes whose command line or environment holds ``text``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f, open(f"/proc/{entry}/environ", "rb") as g:
                if text.encode() in f.read() + g.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


@pytest.mark.slow
def test_local_ray_ignores_other_clusters_and_shuts_down_on_sigterm(tmp_path):
    # Ray's temp root, short (Ray's socket paths must fit 107 bytes): every helper carries it in its environment
    ray_tmp = Path(tempfile.mkdtemp(prefix="jdr", dir="/tmp"))
    (ray_tmp / "ray_current_cluster").write_text("127.0.0.1:9\n")  # what a `ray start` session leaves
    env = _env(RAY_TMPDIR=str(ray_tmp), RAY_ADDRESS="127.0.0.1:9")  # and a cluster nobody runs
    proc = subprocess.Popen([sys.executable, "-c", RAY_DRIVER], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("up "):
                break
        assert lines and lines[-1].startswith("up "), "".join(lines)[-3000:]  # a local instance of its own
        _, helper_pid, cpus = lines[-1].split()
        assert float(cpus) == 1.0 and int(helper_pid) in _processes_naming(str(ray_tmp))
        before = _processes_naming(str(ray_tmp))
        assert len(before) >= 3  # the driver, Ray's own processes and the actor
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == SIGTERM_EXIT_CODE, proc.stdout.read()[-3000:]
        deadline = time.monotonic() + 60  # a bound for the check, not a speed claim
        while _processes_naming(str(ray_tmp)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _processes_naming(str(ray_tmp)) == []
    finally:
        for pid in _processes_naming(str(ray_tmp)):  # only what this test started
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(ray_tmp, ignore_errors=True)
