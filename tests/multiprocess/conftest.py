"""Multi-process tests: real JAX processes (the multi-controller runtime, gloo collectives)
started by our launchers, checked against this pytest process as the 1-process x 8-device run.

Like tests/multidevice, this directory runs in its own pytest process (``make test`` runs it
separately; the main run leaves it out): this process simulates 8 CPU devices, set before
JAX starts. The processes it launches inherit the environment (the run's compilation cache
directory from tests/conftest.py, the test XLA flags) with their own device count.
"""

import importlib.util
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest


def _load(path: Path, name: str):
    """A module of another test directory, by path (its conftest is not importable by name)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# the 8 simulated devices (and the patient collective timeouts) of tests/multidevice, set
# before JAX starts; its ``devices`` fixture fails (never skips) with fewer
_multidevice = _load(Path(__file__).resolve().parents[1] / "multidevice" / "conftest.py", "multidevice_conftest")
devices = _multidevice.devices
NUM_DEVICES = _multidevice.NUM_DEVICES

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def child_environment(**extra) -> dict:
    """This process's environment for launched processes: our code first on the path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Launch:
    """`jax-drive scale-out launch ...` as a child process whose output lines are collected
    (and echoed, so a failing test shows them)."""

    def __init__(self, args: list[str], **env):
        self.lines: list[str] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "jax_drive.cli", "scale-out", "launch", *args],
                                     cwd=ROOT, env=child_environment(**env), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            print(line, end="", flush=True)

    def wait_for(self, text: str, timeout: float) -> str:
        """The first line holding ``text``; fails after ``timeout`` s or when the launcher ends first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if text in line:
                    return line
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.2)
        self.kill()
        pytest.fail(f"no line with {text!r} within {timeout:.0f} s; last lines:\n" + "\n".join(self.lines[-30:]))

    def wait(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the launcher did not finish within {timeout:.0f} s; last lines:\n" + "\n".join(self.lines[-30:]))
        self._reader.join(timeout=10)
        return rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


def launch(args: list[str], timeout: float, **env) -> Launch:
    """Runs a launch to its end (failing the test after ``timeout`` s); returns it."""
    run = Launch(args, **env)
    run.returncode = run.wait(timeout)
    return run
