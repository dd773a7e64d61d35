"""Multi-process tests: real JAX processes (the multi-controller runtime, gloo collectives)
started by our launchers, checked against this pytest process as the 1-process x 8-device run.

Like tests/multidevice, this directory runs in its own pytest process (``make test`` runs it
separately; the main run leaves it out): this process simulates 8 CPU devices, set before
JAX starts. The processes it launches inherit the environment (the run's compilation cache
directory from tests/conftest.py, the test XLA flags) with their own device count.
"""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

FLAG = "--xla_force_host_platform_device_count=8"
# as in tests/multidevice: a loaded 2-core host can keep a device from its peers for long
PATIENCE = ("--xla_cpu_collective_call_warn_stuck_timeout_seconds=60",
            "--xla_cpu_collective_call_terminate_timeout_seconds=300")
_flags = os.environ.get("XLA_FLAGS", "")
for _flag in (FLAG, *PATIENCE):
    if _flag.split("=")[0] not in _flags:
        _flags = f"{_flags} {_flag}".strip()
os.environ["XLA_FLAGS"] = _flags

import jax  # noqa: E402
import pytest  # noqa: E402

NUM_DEVICES = 8
ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session", autouse=True)
def devices():
    """The 8 simulated devices of this process (the single-process reference)."""
    found = jax.devices()
    if len(found) < NUM_DEVICES:
        pytest.fail(f"{len(found)} device(s): run this directory in its own process with "
                    f"XLA_FLAGS={FLAG} (as `make test` does)", pytrace=False)
    return found[:NUM_DEVICES]


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
