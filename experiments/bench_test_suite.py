"""How fast the test suite runs: a baseline commit's test files at that commit against the same
files in the working tree, in one run (issue 15's `make test` speed goal).

Arms, one after the other on this machine (``pytest -n WORKERS --dist loadfile``, as
``make test`` runs the suite):

* ``baseline``: the baseline commit's tree (``git archive``, no network), its own test files;
* ``current``: the same test files (those that still exist) in the working tree, with the
  suite's settings (tests compile at XLA's ``--xla_backend_optimization_level=0``, see
  tests/conftest.py);
* ``current_full_opt``: the same, with ``JAX_DRIVE_TEST_FULL_OPT=1`` (XLA's default
  optimisation), which separates the compile setting from the other changes.

Every arm starts with a cold XLA cache (its own empty HOME: the baseline kept a persistent
cache in ~/.cache/jax_drive_xla, which would make any run after the first look fast).

Reported per arm: wall seconds of the pytest process and its passed / skipped / failed
counts; the speed-up of each arm against the baseline.

    python experiments/bench_test_suite.py --json OUT
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from jax_drive.runinfo import InputError, add_output_args, command_line, require_min, run_main, run_metadata, write_json

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "45a19df"  # the tree issue 15 ("make test 25 % faster than today") was filed against
ARMS = ("baseline", "current", "current_full_opt")


def resolve_commit(rev: str) -> str:
    """The full hash of ``rev`` in this checkout (InputError if it names no commit)."""
    proc = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise InputError(f"--baseline {rev}: not a commit of this checkout")
    return proc.stdout.strip()


def export_tree(commit: str, into: Path) -> None:
    """The tracked files of ``commit`` under ``into`` (git archive, nothing fetched)."""
    archive = into / "tree.tar"
    with open(archive, "wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", commit], stdout=f, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()


def pytest_counts(output: str) -> dict[str, int]:
    """passed / skipped / failed / errors from pytest's last summary line (0 when absent)."""
    lines = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    counts = {"passed": 0, "skipped": 0, "failed": 0, "errors": 0}
    for n, word in re.findall(r"(\d+) (passed|skipped|failed|error)", lines[-1] if lines else ""):
        counts["errors" if word == "error" else word] += int(n)
    return counts


def run_arm(tree: Path, files: list[str], workers: int, env_extra: dict[str, str], progress: bool,
            home: Path) -> dict:
    """Runs ``files`` of ``tree`` with that tree's package first on the path and ``home`` as
    HOME (empty: older trees kept their XLA cache in ~/.cache, so every arm starts cold):
    wall seconds and counts."""
    env = dict(os.environ)
    for name in ("JAX_DRIVE_TEST_FULL_OPT", "JAX_COMPILATION_CACHE_DIR"):  # only what the arm asks for
        env.pop(name, None)
    env.update(PYTHONPATH=str(tree), JAX_PLATFORMS="cpu", HOME=str(home), **env_extra)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "-n", str(workers), "--dist", "loadfile", *files]
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if progress:
        print(proc.stdout[-600:], file=sys.stderr)
    return {"wall_s": round(wall, 1), "exit_code": proc.returncode, **pytest_counts(proc.stdout)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE, help=f"baseline commit (default {BASELINE})")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (make test: 2)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, some of {', '.join(ARMS)}")
    parser.add_argument("--only", nargs="+", default=None, metavar="FILE",
                        help="only these test files (names like test_models.py; default: all)")
    add_output_args(parser, json_required=True)
    args = parser.parse_args(argv)
    require_min(1, workers=args.workers)
    arms = [a for a in args.arms.split(",") if a]
    if not arms or set(arms) - set(ARMS):
        raise InputError(f"--arms must name some of {', '.join(ARMS)}, got {args.arms!r}")
    commit = resolve_commit(args.baseline)

    report = {"benchmark": "bench_test_suite", "baseline_commit": commit, "workers": args.workers, "arms": {},
              "timing": "wall seconds of one pytest process per arm (-n workers --dist loadfile), arms in sequence"}
    with tempfile.TemporaryDirectory(prefix="jax_drive_baseline_") as tmp:
        base = Path(tmp)
        export_tree(commit, base)
        baseline_files = sorted(f"tests/{p.name}" for p in (base / "tests").glob("test_*.py")
                                if args.only is None or p.name in args.only)
        unknown = sorted(set(args.only or ()) - {Path(f).name for f in baseline_files})
        if unknown:
            raise InputError(f"--only: {', '.join(unknown)} not a test file of {args.baseline}")
        files = [f for f in baseline_files if (ROOT / f).exists()]
        if not files:
            raise InputError(f"--baseline {args.baseline}: no test file of that commit exists in the working tree")
        report["files"] = files
        report["baseline_only_files"] = [f for f in baseline_files if f not in files]
        plans = {"baseline": (base, {}), "current": (ROOT, {}),
                 "current_full_opt": (ROOT, {"JAX_DRIVE_TEST_FULL_OPT": "1"})}
        for arm in arms:
            tree, extra = plans[arm]
            home = base / f"home_{arm}"
            home.mkdir()
            # the baseline runs all its files, the others those that still exist
            result = run_arm(tree, baseline_files if arm == "baseline" else files, args.workers, extra,
                             not args.no_progress, home)
            report["arms"][arm] = result
            print(f"{arm}: {result}", file=sys.stderr)
    if "baseline" in report["arms"]:
        base_wall = report["arms"]["baseline"]["wall_s"]
        report["faster_than_baseline"] = {arm: round(1 - r["wall_s"] / base_wall, 3)
                                          for arm, r in report["arms"].items() if arm != "baseline"}
    report["meta"] = run_metadata(command=command_line(__file__, argv))
    write_json(args.json, report)
    failed = any(r["exit_code"] != 0 for r in report["arms"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
