"""Strips outputs from notebooks, or checks that they have none (notebooks are committed clean).

    python notebooks/strip_outputs.py                 # strip every notebooks/*.ipynb in place
    python notebooks/strip_outputs.py --check [PATH]  # exit 1, naming them, when any has outputs

Removed: cell outputs, execution counts and per-cell execution metadata (timings); the
notebook's own metadata (kernel, Colab) is kept.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
VOLATILE_CELL_METADATA = ("execution", "collapsed", "scrolled")


def dirty_cells(nb) -> list[int]:
    """Indices of the code cells that carry outputs, an execution count or execution metadata."""
    return [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code" and (
        cell.get("outputs") or cell.get("execution_count") is not None
        or any(k in cell.get("metadata", {}) for k in VOLATILE_CELL_METADATA))]


def strip(nb):
    """The notebook with every code cell's outputs, execution count and execution metadata removed
    (in place; returned for chaining)."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        for key in VOLATILE_CELL_METADATA:
            cell.get("metadata", {}).pop(key, None)
    return nb


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="notebooks (default: notebooks/*.ipynb)")
    parser.add_argument("--check", action="store_true", help="report notebooks with outputs, change nothing")
    args = parser.parse_args(argv)
    paths = args.paths or sorted(HERE.glob("*.ipynb"))
    dirty = []
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        cells = dirty_cells(nb)
        if not cells:
            continue
        dirty.append(path)
        if args.check:
            print(f"{path}: outputs in cells {cells}", file=sys.stderr)
        else:
            nbformat.write(strip(nb), path)
            print(f"stripped {path}")
    return 1 if args.check and dirty else 0


if __name__ == "__main__":
    sys.exit(main())
