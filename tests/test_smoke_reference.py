"""The ``smoke`` presets of the three pipelines give the results recorded before the top
floors were redesigned (tests/data/smoke_reference.json, made by tests/smoke_reference.py on
the code before the change): the refactor moved code, not behaviour. The runs use the
unconstrained setting the reference was recorded in (``smoke_reference.UNCONSTRAINED``: the
smoke presets' grammars off, the recorded answer budgets).

One pipeline per test file, so ``pytest --dist loadfile`` runs them on different workers:
TalkingVehicles here, InterDrive in test_smoke_reference_interdrive.py, and MTDrive in
test_mtdrive_runs.py (its uninterrupted ``jax-drive train --preset smoke`` run is compared
there instead of running the same pipeline a second time)."""

from __future__ import annotations

import pytest
from smoke_reference import differences, recorded, run_talking_vehicles_smoke


def test_differences_are_found():
    assert differences({"a": [1.0, {"b": "x"}]}, {"a": [1.0, {"b": "x"}]}) == []
    assert differences({"a": [1.0, {"b": "y"}]}, {"a": [1.1, {"b": "x"}]}) == ["/a[0]: 1.0 != 1.1", "/a[1]/b: 'y' != 'x'"]
    assert differences({"a": 1.0}, {"a": 1.0, "b": 2}) == [": keys ['a'] != ['a', 'b']"]
    assert differences([1, 2], [1, 2, 3]) == [": 2 items != 3"]


@pytest.mark.slow
def test_talking_vehicles_smoke_is_unchanged(tmp_path):
    assert differences(run_talking_vehicles_smoke(str(tmp_path)), recorded()["talking_vehicles"]) == []
