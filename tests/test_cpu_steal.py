"""The benchmarks' CPU-steal meter (experiments/cpu_steal.py)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import cpu_steal  # noqa: E402


def test_steal_share_is_the_stolen_fraction_of_elapsed_cpu_time():
    assert cpu_steal.steal_share((10, 1000), (40, 1200)) == pytest.approx(0.15)
    assert cpu_steal.steal_share((10, 1000), (10, 1000)) is None  # no tick elapsed
    assert cpu_steal.steal_share(None, (10, 1000)) is None


def test_cpu_times_reads_the_aggregate_line(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 5 20 800 10 1 2 12 30 0\ncpu0 50 2 10 400 5 0 1 6 15 0\n")
    monkeypatch.setattr(cpu_steal, "_PROC_STAT", stat)
    assert cpu_steal.cpu_times() == (12, 950)  # guest time is inside user already


def test_cpu_times_without_proc_stat_is_none(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_steal, "_PROC_STAT", tmp_path / "missing")
    assert cpu_steal.cpu_times() is None
