"""CPU time stolen by the hypervisor, for benchmarks on shared virtual machines.

On this project's VM the ``st`` column of ``vmstat`` reaches 5-30 % at times: the host runs
other guests on our cores, and a timed call then takes longer for reasons outside the
program. Benchmarks record the stolen share over each timed block so a slow figure can be
told apart from a slow program. Linux only (``/proc/stat``); elsewhere the share is None.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

_PROC_STAT = Path("/proc/stat")


def cpu_times() -> tuple[int, int] | None:
    """(stolen, total) jiffies summed over all CPUs since boot, or None without /proc/stat.

    The aggregate ``cpu`` line lists user, nice, system, idle, iowait, irq, softirq, steal,
    guest, guest_nice; guest time is already counted in user/nice, so it is left out of the
    total."""
    try:
        line = _PROC_STAT.read_text().splitlines()[0]
    except OSError:
        return None
    fields = line.split()
    if fields[0] != "cpu" or len(fields) < 9:
        return None
    values = [int(v) for v in fields[1:9]]
    return values[7], sum(values)


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """Fraction of CPU time stolen between two ``cpu_times()`` readings (None if unknown or
    if no time passed at the kernel's tick resolution)."""
    if before is None or after is None:
        return None
    total = after[1] - before[1]
    if total <= 0:
        return None
    return (after[0] - before[0]) / total


def screened(time_block: Callable[[], dict], max_steal: float, retries: int) -> tuple[dict, list[dict]]:
    """Run ``time_block() -> dict with a "cpu_steal_share" key`` until its steal share is at
    most ``max_steal`` or ``retries`` extra attempts are spent; returns (the attempt with the
    least steal, the earliest among equals; every attempt in order). An unknown share (None,
    no /proc/stat) is accepted as is."""
    attempts = [time_block()]
    while len(attempts) <= retries and (attempts[-1]["cpu_steal_share"] or 0.0) > max_steal:
        attempts.append(time_block())
    kept = min(attempts, key=lambda a: a["cpu_steal_share"] or 0.0)
    return kept, attempts
