"""Counting XLA compilations through JAX's public monitoring events.

JAX records ``/jax/core/compile/backend_compile_duration`` (``jax.monitoring``) each time it
builds an executable for a jitted function (a cache miss in this process; a hit in the
persistent compilation cache still builds one), with the function's name as ``fun_name``
(``"jit(name)"``). :class:`CompileCounter` listens to it while active, so a test can say
"this call compiled no new decode program", and a benchmark can report compile counts and
the seconds spent tracing, lowering and compiling (every ``/jax/core/compile/`` duration).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

from jax import monitoring

COMPILE_EVENTS = "/jax/core/compile/"  # prefix of the tracing, lowering and compiling durations
BACKEND_COMPILE_EVENT = COMPILE_EVENTS + "backend_compile_duration"


def program_name(fn: Callable) -> str:
    """The ``fun_name`` JAX reports for the jitted function ``fn``."""
    return f"jit({getattr(fn, '__name__', fn)})"


class CompileCounter:
    """Executables built per jitted function while the counter is active (a context manager).

    ``with CompileCounter() as compiles: ...`` then ``compiles.count(fn)`` (or
    ``compiles.counts[name]``); ``compiles.seconds``: the compile-time seconds JAX reported.
    Counts the compilations of every thread of the process; thread-safe; counters can nest.
    """

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.seconds = 0.0
        self._lock = threading.Lock()

    def _listen(self, event: str, duration: float, **fields) -> None:
        if not event.startswith(COMPILE_EVENTS):
            return
        with self._lock:
            self.seconds += float(duration)
            if event == BACKEND_COMPILE_EVENT:
                self.counts[str(fields.get("fun_name", ""))] += 1

    def __enter__(self) -> "CompileCounter":
        monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc) -> None:
        monitoring.unregister_event_duration_listener(self._listen)

    def count(self, *fns: Callable) -> int:
        """Executables built for the jitted functions ``fns`` (together)."""
        return sum(self.counts[program_name(fn)] for fn in fns)

    @property
    def total(self) -> int:
        """Executables built for any function."""
        return sum(self.counts.values())
