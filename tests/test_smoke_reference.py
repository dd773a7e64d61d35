"""The ``smoke`` presets of the three pipelines give the results recorded before the top
floors were redesigned (tests/data/smoke_reference.json, made by tests/smoke_reference.py on
the code before the change): the refactor moved code, not behaviour. The runs use the
unconstrained setting the reference was recorded in (``smoke_reference.UNCONSTRAINED``: the
smoke presets' grammars off, the recorded answer budgets)."""

from __future__ import annotations

import json

import pytest
from smoke_reference import REFERENCE, run_interdrive_smoke, run_mtdrive_smoke, run_talking_vehicles_smoke


@pytest.fixture(scope="module")
def recorded() -> dict:
    with open(REFERENCE) as f:
        return json.load(f)


def _close(got, want, path="") -> list[str]:
    """Differences between two reduced results (floats within 1e-5 relative, the rest equal)."""
    if isinstance(want, dict):
        if set(got) != set(want):
            return [f"{path}: keys {sorted(got)} != {sorted(want)}"]
        return [d for k in want for d in _close(got[k], want[k], f"{path}/{k}")]
    if isinstance(want, list):
        if len(got) != len(want):
            return [f"{path}: {len(got)} items != {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in _close(g, w, f"{path}[{i}]")]
    if isinstance(want, float):
        return [] if got == pytest.approx(want, rel=1e-5, abs=1e-6) else [f"{path}: {got} != {want}"]
    return [] if got == want else [f"{path}: {got!r} != {want!r}"]


def test_close_finds_differences():
    assert _close({"a": [1.0, {"b": "x"}]}, {"a": [1.0, {"b": "x"}]}) == []
    assert _close({"a": [1.0, {"b": "y"}]}, {"a": [1.1, {"b": "x"}]}) == ["/a[0]: 1.0 != 1.1", "/a[1]/b: 'y' != 'x'"]


@pytest.mark.slow
def test_mtdrive_smoke_is_unchanged(recorded, tmp_path):
    assert _close(run_mtdrive_smoke(str(tmp_path)), recorded["mtdrive"]) == []


@pytest.mark.slow
def test_talking_vehicles_smoke_is_unchanged(recorded, tmp_path):
    assert _close(run_talking_vehicles_smoke(str(tmp_path)), recorded["talking_vehicles"]) == []


@pytest.mark.slow
def test_interdrive_smoke_is_unchanged(recorded, tmp_path):
    assert _close(run_interdrive_smoke(str(tmp_path)), recorded["interdrive"]) == []
