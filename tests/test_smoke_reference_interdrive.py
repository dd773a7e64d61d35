"""InterDrive's ``smoke`` preset gives the results recorded before the top floors were
redesigned (see test_smoke_reference.py; a file of its own so that ``--dist loadfile`` runs it
beside the TalkingVehicles comparison)."""

from __future__ import annotations

import pytest
from smoke_reference import differences, recorded, run_interdrive_smoke


@pytest.mark.slow
def test_interdrive_smoke_is_unchanged(tmp_path):
    assert differences(run_interdrive_smoke(str(tmp_path)), recorded()["interdrive"]) == []
