"""The notebooks in notebooks/ run end to end at the small size (a cell that raises fails
the test), draw their figures, and are committed without outputs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
# Each notebook and the number of figures (PNG outputs) it draws at the small size.
FIGURES = {"01_pdm_scoring": 2, "02_mtdrive_refinement": 2, "03_coop_storyboard": 2, "04_batch_evaluation": 1}
NAMES = tuple(FIGURES)
# Per cell; generous because the suite shares two CPU cores (compilation dominates these cells).
CELL_TIMEOUT_S = 1200


def test_every_notebook_is_listed():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == sorted(NAMES)


def test_committed_notebooks_have_no_outputs():
    run = subprocess.run([sys.executable, str(NOTEBOOKS / "strip_outputs.py"), "--check"], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr


def test_strip_removes_outputs(tmp_path):
    sys.path.insert(0, str(NOTEBOOKS))
    try:
        import strip_outputs
    finally:
        sys.path.remove(str(NOTEBOOKS))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1", execution_count=3, outputs=[
        nbformat.v4.new_output("execute_result", data={"text/plain": "2"}, execution_count=3)])])
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, path)
    check = [sys.executable, str(NOTEBOOKS / "strip_outputs.py"), "--check", str(path)]
    assert subprocess.run(check, capture_output=True).returncode == 1
    assert strip_outputs.main([str(path)]) == 0
    assert subprocess.run(check, capture_output=True).returncode == 0
    cell = nbformat.read(path, as_version=4).cells[0]
    assert cell.outputs == [] and cell.execution_count is None and cell.source == "1 + 1"


def _images(nb) -> int:
    return sum("image/png" in out.get("data", {}) for cell in nb.cells if cell.cell_type == "code"
               for out in cell.outputs)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_at_small_size(name, monkeypatch, tmp_path):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    monkeypatch.setenv("JAX_DRIVE_NOTEBOOK_SIZE", "small")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    # The kernel shares the session's compiled programs (conftest.py puts the cache directory in
    # the environment) and keeps its connection file and IPython profile out of the home directory.
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1")
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    # An error in any cell raises CellExecutionError here, naming the cell and the traceback.
    NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    errors = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
              if out.output_type == "error"]
    assert not errors
    assert _images(nb) == FIGURES[name], f"{name} drew {_images(nb)} figures, expected {FIGURES[name]}"
