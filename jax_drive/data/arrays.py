"""Pytrees, ragged lists and token rows as flat named numpy arrays (``.npz`` files), and back.

What a run journal stores next to a stage's JSON record: scene batches, ragged token rows and
their processed images, each as a few flat arrays with an exact inverse.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from jax_drive.data.tokens import TokenRow
from jax_drive.models.image_processing import ProcessedImage


def tree_to_arrays(prefix: str, tree) -> dict[str, np.ndarray]:
    """The leaves of a pytree as named numpy arrays ``prefix + keystr(path)``."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {prefix + jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


def tree_from_arrays(prefix: str, arrays: dict[str, np.ndarray], template):
    """Inverse of :func:`tree_to_arrays`; ``template`` has the tree's structure (any shapes)."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
    names = [prefix + jax.tree_util.keystr(path) for path, _ in leaves]
    missing = [n for n in names if n not in arrays]
    if missing:
        raise KeyError(f"stored arrays lack {missing[:3]}{'...' if len(missing) > 3 else ''}")
    return jax.tree_util.tree_unflatten(treedef, [arrays[n] for n in names])


def ragged_to_arrays(prefix: str, rows: list[np.ndarray]) -> dict[str, np.ndarray]:
    """A list of 1-D arrays as one flat array and the row lengths."""
    lengths = np.asarray([len(r) for r in rows], np.int64)
    flat = np.concatenate(rows) if rows else np.zeros(0)
    return {f"{prefix}/flat": flat, f"{prefix}/lengths": lengths}


def ragged_from_arrays(prefix: str, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Inverse of :func:`ragged_to_arrays`."""
    ends = np.cumsum(arrays[f"{prefix}/lengths"])
    return np.split(arrays[f"{prefix}/flat"], ends[:-1]) if len(ends) else []


def rows_to_arrays(rows: Sequence[TokenRow]) -> dict[str, np.ndarray]:
    """SFT rows as journal arrays: ids and weights, and their images stored once each (rows
    of a scene share their processed camera image)."""
    arrays = {**ragged_to_arrays("ids", [r.ids for r in rows]), **ragged_to_arrays("weight", [r.weight for r in rows])}
    pool: dict[int, Any] = {}  # id -> image, in first-seen order
    for r in rows:
        for im in r.images:
            pool.setdefault(id(im), im)
    if pool:
        index = {key: i for i, key in enumerate(pool)}
        arrays.update(ragged_to_arrays("pixels", [im.pixel_values.reshape(-1) for im in pool.values()]))
        arrays["image_grid"] = np.stack([np.asarray(im.grid_thw, np.int64) for im in pool.values()])
        arrays.update(ragged_to_arrays("row_images", [np.asarray([index[id(im)] for im in r.images], np.int64)
                                                      for r in rows]))
    return arrays


def rows_from_arrays(arrays: dict[str, np.ndarray]) -> list[TokenRow]:
    """Inverse of :func:`rows_to_arrays`."""
    ids, weight = ragged_from_arrays("ids", arrays), ragged_from_arrays("weight", arrays)
    if "image_grid" not in arrays:
        return [TokenRow(i, w) for i, w in zip(ids, weight)]
    pool = [ProcessedImage(p.reshape(int(np.prod(g)), -1).astype(np.float32), g)
            for p, g in zip(ragged_from_arrays("pixels", arrays), arrays["image_grid"])]
    return [TokenRow(i, w, tuple(pool[k] for k in idx))
            for i, w, idx in zip(ids, weight, ragged_from_arrays("row_images", arrays))]
