"""The PDM benchmark run summary (experiments/summarize_bench_pdm.py) on hand-made runs."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import summarize_bench_pdm as summary  # noqa: E402


def _run(speedups, attempts=None, chunk=None):
    """A bench_pdm-shaped result with rows for batches 256, 1024, 2048 and 4096."""
    rows = []
    for batch, speedup in zip((256, 1024, 2048, 4096), speedups):
        row = {"batch": batch, "speedup": speedup, "jax_s": batch / 25000.0}
        if attempts is not None:
            row["attempts"] = attempts.get(batch, [{"jax_s": row["jax_s"], "cpu_steal_share": 0.0}])
            row["speedup_first_attempt"] = speedup
        rows.append(row)
    result = {"per_batch": rows, "time_4096_s": 0.15, "max_abs_pdms_diff": 1e-7}
    if chunk is not None:
        result["pdm_chunk_size"] = chunk
    return result


def test_goal_is_judged_at_every_batch_from_1024_only():
    met = summary.run_summary("x_run3.json", _run([50.0, 120.0, 101.0, 140.0]))
    assert met["met"] and met["run"] == 3 and met["min_speedup"] == 101.0  # batch 256 is not judged
    missed = summary.run_summary("x_run4.json", _run([150.0, 120.0, 99.9, 140.0]))
    assert not missed["met"]


def test_versions_and_tally():
    runs = [summary.run_summary(f"r_run{i}.json", r) for i, r in enumerate([
        _run([1, 120, 90, 130]),
        _run([1, 120, 110, 130], attempts={}),
        _run([1, 150, 160, 170], attempts={}, chunk=512),
        _run([1, 140, 150, 160], attempts={}, chunk=512),
    ])]
    assert [r["version"] for r in runs] == ["unscreened", "screened, chunk 0", "screened, chunk 512",
                                            "screened, chunk 512"]
    tally = summary.tally(runs)
    assert tally["unscreened"] == {"runs": 1, "met": 0, "met_first_attempt": 0, "min_speedup": 90}
    assert tally["screened, chunk 512"]["met"] == 2 and tally["screened, chunk 512"]["min_speedup"] == 140


def test_steal_vs_slowdown_compares_blocks_with_the_fastest_clean_one():
    attempts = {1024: [{"jax_s": 0.06, "cpu_steal_share": 0.3}, {"jax_s": 0.04, "cpu_steal_share": 0.0}],
                2048: [{"jax_s": 0.09, "cpu_steal_share": 0.1}, {"jax_s": 0.08, "cpu_steal_share": 0.01}]}
    out = summary.steal_vs_slowdown([_run([1, 150, 150, 150], attempts=attempts, chunk=512)])
    points = sorted(map(tuple, out["points"]))
    assert points[-1] == pytest.approx((0.3, 1.5))  # 0.06 s against the clean 0.04 s
    assert (0.1, pytest.approx(0.09 / 0.08)) in [(s, pytest.approx(v)) for s, v in points]
    assert out["pearson_r"] > 0.9


def test_main_writes_summary_and_plot(tmp_path):
    paths = []
    for i, result in enumerate([_run([1, 120, 130, 140], attempts={}, chunk=512),
                                _run([1, 95, 130, 140], attempts={}, chunk=512)]):
        path = tmp_path / f"bench_pdm_idle_run{i}.json"
        path.write_text(json.dumps(result))
        paths.append(str(path))
    out, png = tmp_path / "summary.json", tmp_path / "runs.png"
    assert summary.main(paths + ["--json", str(out), "--plot", str(png)]) == 0
    written = json.loads(out.read_text())
    assert written["tally"]["screened, chunk 512"]["met"] == 1
    assert png.stat().st_size > 10_000
