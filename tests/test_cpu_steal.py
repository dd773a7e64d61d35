"""The benchmarks' CPU-steal meter (jax_drive/cpu_steal.py)."""

import pytest

from jax_drive import cpu_steal


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


def _blocks(shares):
    """A timed block that reports the given steal shares in turn, numbering its attempts."""
    it = iter(enumerate(shares))

    def block():
        i, share = next(it)
        return {"attempt": i, "cpu_steal_share": share}

    return block


def test_screened_keeps_a_clean_first_attempt():
    kept, attempts = cpu_steal.screened(_blocks([0.01, 0.0]), max_steal=0.05, retries=3)
    assert kept["attempt"] == 0 and len(attempts) == 1


def test_screened_retimes_until_clean_and_keeps_the_clean_attempt():
    kept, attempts = cpu_steal.screened(_blocks([0.29, 0.12, 0.02, 0.0]), max_steal=0.05, retries=3)
    assert [a["attempt"] for a in attempts] == [0, 1, 2]
    assert kept["attempt"] == 2


def test_screened_stops_after_the_retries_and_keeps_the_least_stolen():
    kept, attempts = cpu_steal.screened(_blocks([0.3, 0.1, 0.2, 0.4, 0.0]), max_steal=0.05, retries=3)
    assert len(attempts) == 4  # the first plus three retries; the clean fifth is never run
    assert kept["attempt"] == 1


def test_screened_with_unknown_steal_or_screening_off_takes_one_attempt():
    kept, attempts = cpu_steal.screened(_blocks([None, 0.0]), max_steal=0.05, retries=3)
    assert kept["attempt"] == 0 and len(attempts) == 1
    kept, attempts = cpu_steal.screened(_blocks([0.5, 0.0]), max_steal=1.0, retries=3)
    assert kept["attempt"] == 0 and len(attempts) == 1
