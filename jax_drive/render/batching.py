"""Runs a one-scene renderer over any leading batch dims of a Scene."""

from __future__ import annotations

from typing import Callable

import jax

from jax_drive.types import Scene, batch_shape


def over_scenes(fn: Callable[[Scene], jax.Array], scene: Scene) -> jax.Array:
    """fn(one scene) -> (H, W, 3); applied (vmapped) to a scene with leading dims (...)
    gives (..., H, W, 3)."""
    lead = batch_shape(scene)
    if not lead:
        return fn(scene)
    flat = jax.tree.map(lambda a: a.reshape((-1,) + a.shape[len(lead):]), scene)
    out = jax.vmap(fn)(flat)
    return out.reshape(lead + out.shape[1:])
