"""What the ``smoke`` presets of the three pipelines produce, reduced to comparable numbers.

The pipelines' top floors were redesigned without changing their results; this module runs
each ``smoke`` pipeline and reduces its results to the numbers a refactor must keep
(evaluation metrics, loss curves, data counts, per-method and per-arm rates). The values
recorded before the redesign are in ``tests/data/smoke_reference.json``; the tests compare
fresh runs against them with :func:`differences` (TalkingVehicles and InterDrive in
tests/test_smoke_reference*.py; MTDrive on the uninterrupted ``jax-drive train --preset smoke``
run of tests/test_mtdrive_runs.py, which runs that pipeline anyway).

The reference was recorded with free (unconstrained) answers. The ``smoke`` presets now sample
their answers under grammars (``constrain_answers``, docs/structured.md), with answer budgets
that hold the grammars; :data:`UNCONSTRAINED` turns that off and restores the budgets of the
recording, so the comparison still proves that the redesign changed nothing in that setting.
The negotiator's RL stage came later too: the recorded setting runs without it (``rl.steps=0``).

    python tests/smoke_reference.py tests/data/smoke_reference.json   # (re-)record
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

REFERENCE = os.path.join(os.path.dirname(__file__), "data", "smoke_reference.json")
MTDRIVE_KEYS = ("pdms_first", "pdms_final", "format_rate", "turns_mean")
RL_KEYS = ("pdms_final", "loss", "reward_mean")
# --set overrides giving each pipeline's smoke preset the unconstrained setting it was recorded in.
UNCONSTRAINED = {
    "mtdrive": {"constrain_answers": False, "max_new_tokens": 24, "rl.rollout.sampling.max_new_tokens": 24},
    "talking_vehicles": {"agent.constrain_answers": False, "learning.constrain_answers": False,
                         "learning.reflection_tokens": 8, "learning.discussion_tokens": 8},
    "interdrive": {"constrain_answers": False, "consensus_tokens": 8, "rl.steps": 0},
}


def recorded() -> dict:
    """The values recorded before the redesign: {"mtdrive", "talking_vehicles", "interdrive"}."""
    with open(REFERENCE) as f:
        return json.load(f)


def differences(got, want, path: str = "") -> list[str]:
    """Differences between two reduced results (floats within 1e-5 relative, the rest equal)."""
    import pytest

    if isinstance(want, dict):
        if set(got) != set(want):
            return [f"{path}: keys {sorted(got)} != {sorted(want)}"]
        return [d for k in want for d in differences(got[k], want[k], f"{path}/{k}")]
    if isinstance(want, list):
        if len(got) != len(want):
            return [f"{path}: {len(got)} items != {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in differences(g, w, f"{path}[{i}]")]
    if isinstance(want, float):
        return [] if got == pytest.approx(want, rel=1e-5, abs=1e-6) else [f"{path}: {got} != {want}"]
    return [] if got == want else [f"{path}: {got!r} != {want!r}"]


def _round(x, digits: int = 6):
    if isinstance(x, float):
        return round(x, digits)
    if isinstance(x, dict):
        return {k: _round(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_round(v, digits) for v in x]
    return x


def reduce_mtdrive(results: dict) -> dict:
    """Per evaluated policy the mean metrics; SFT and RL curves; data and curation counts."""
    return _round({
        "stages": {name: {k: s["mean"][k] for k in MTDRIVE_KEYS} for name, s in results["stages"].items()},
        "sft_loss": [h["loss"] for h in results["sft_history"]],
        "rl": [{k: h[k] for k in RL_KEYS if k in h} for h in results["rl_history"]],
        "sft_data": {k: results["data_card"][k] for k in ("single", "multi", "qa", "kept")},
        "rl_curation": results["rl_curation"].get("category_counts"),
    })


def reduce_talking_vehicles(results: dict) -> dict:
    """Per method: the average CR / SR / TR over scenarios and the parse-failure counts."""
    return _round({method: {"average": {k: r["average"]["aggregate"][k]["mean"] for k in ("CR", "SR", "TR")},
                            "parse_failures": r["parse_failures"], "episodes": r["episodes"]}
                   for method, r in results.items()})


def reduce_interdrive(report: dict) -> dict:
    """Table 2 (DS / SR means per arm and setting), the probe's agreement, Fig. 5 means."""
    return _round({"table2": {setting: {arm: {k: agg[k]["mean"] for k in ("DS", "RC", "IS", "SR")}
                                        for arm, agg in rows.items()}
                              for setting, rows in report["table2"].items()},
                   "probe": {k: report["probe"][k] for k in ("n", "agreement", "model")},
                   "sft_steps": report["sft"]["steps"],
                   "fig5": {k: report["fig5"][k]["mean"] for k in ("with_critic", "without_critic")}})


def run_mtdrive_smoke(out_dir: str) -> dict:
    """The MTDrive smoke pipeline in the recorded (unconstrained) setting, reduced."""
    from jax_drive.configs import override
    from jax_drive.pipelines.mtdrive import run_mtdrive
    from jax_drive.pipelines.mtdrive.presets import PRESETS

    preset = override(PRESETS["smoke"], UNCONSTRAINED["mtdrive"])
    return reduce_mtdrive(run_mtdrive(preset, out_dir, progress=False, log=lambda m: None))


def run_talking_vehicles_smoke(run_dir: str) -> dict:
    """The TalkingVehicles smoke pipeline in the recorded (unconstrained) setting, reduced."""
    from jax_drive.configs import override
    from jax_drive.pipelines import talking_vehicles as TV

    preset = override(TV.PRESETS["smoke"], UNCONSTRAINED["talking_vehicles"])
    return reduce_talking_vehicles(TV.run(preset, list(TV.METHODS), run_dir, progress=False))


def run_interdrive_smoke(work_dir: str) -> dict:
    """The InterDrive smoke script in the recorded (unconstrained) setting, reduced."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
    import interdrive as script  # noqa: E402

    out = os.path.join(work_dir, "interdrive.json")
    settings = [arg for path, value in UNCONSTRAINED["interdrive"].items() for arg in ("--set", f"{path}={value}")]
    script.main(["--preset", "smoke", "--work-dir", work_dir, "--json", out, "--no-progress", *settings])
    with open(out) as f:
        return reduce_interdrive(json.load(f))


def record(path: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        values = {"mtdrive": run_mtdrive_smoke(os.path.join(tmp, "mtdrive")),
                  "talking_vehicles": run_talking_vehicles_smoke(os.path.join(tmp, "tv")),
                  "interdrive": run_interdrive_smoke(os.path.join(tmp, "interdrive"))}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(values, f, indent=1, sort_keys=True)
    return values


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import conftest  # noqa: F401  (the suite's XLA settings and compilation cache)

    print(json.dumps(record(sys.argv[1] if len(sys.argv) > 1 else REFERENCE), indent=1)[:3000])
