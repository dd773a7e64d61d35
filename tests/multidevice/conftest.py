"""Multi-device equivalence tests: 8 simulated CPU devices in one process.

XLA reads ``--xla_force_host_platform_device_count`` when JAX initialises its CPU backend, so
these tests run in their own pytest process (``make test`` runs this directory separately,
with the flag set, and leaves it out of the main run). The flag is added here too, so
``pytest tests/multidevice`` works on its own; if some earlier import already initialised
the backend with fewer devices, the ``devices`` fixture fails with instructions (never skips).
"""

import os

FLAG = "--xla_force_host_platform_device_count=8"
# XLA:CPU aborts the process when a device waits 40 s for its peers at a collective. The 8
# simulated devices share this machine's cores with everything else running, so one device's
# share of a trainer step can lag that long on a loaded 2-core host: wait 5 minutes instead.
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


@pytest.fixture(scope="session", autouse=True)
def devices():
    """The 8 simulated devices every test here needs."""
    found = jax.devices()
    if len(found) < NUM_DEVICES:
        pytest.fail(f"{len(found)} device(s): run this directory in its own process with "
                    f"XLA_FLAGS={FLAG} (as `make test` does)", pytrace=False)
    return found[:NUM_DEVICES]
