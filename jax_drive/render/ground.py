"""What lies on the ground at a point: the layers shared by the BEV raster and the camera.

Points are in the ego frame (metres); one scene (no batch dims). Points are processed in
fixed-size chunks (`lax.map`) so the (points, polygons, vertices) edge tests never exist all at
once, whatever the image size.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jax_drive.pdm.polygons import inside_bits_brute
from jax_drive.types import Scene

CHUNK = 4096  # points per chunk of the per-point tests


def ring_edges(vertices: chex.Array, valid: chex.Array) -> dict[str, chex.Array]:
    """Edges of closed rings (P, V, 2) flattened to (E,) = (P * V,): start a (E, 2), vector
    ab, 1 / |ab|**2 (0 for the zero-length padding edges) and validity."""
    a = vertices.reshape(-1, 2)
    ab = (jnp.roll(vertices, -1, axis=-2) - vertices).reshape(-1, 2)
    length2 = jnp.sum(ab * ab, -1)
    return {"a": a, "ab": ab, "inv": jnp.where(length2 > 0, 1.0 / jnp.where(length2 > 0, length2, 1.0), 0.0),
            "valid": jnp.repeat(valid, vertices.shape[1])}


def squared_distance_to_edges(points: chex.Array, edges: dict[str, chex.Array]) -> chex.Array:
    """Squared distance from points (K, 2) to the nearest valid edge (see `ring_edges`);
    (K,), inf without a valid edge. x and y stay separate (K, E) arrays: no trailing axis of
    2, so XLA fuses the whole computation into the min-reduction."""
    rx = points[:, 0:1] - edges["a"][None, :, 0]  # (K, E)
    ry = points[:, 1:2] - edges["a"][None, :, 1]
    ux, uy = edges["ab"][None, :, 0], edges["ab"][None, :, 1]
    t = jnp.clip((rx * ux + ry * uy) * edges["inv"][None], 0.0, 1.0)
    d2 = (rx - t * ux) ** 2 + (ry - t * uy) ** 2
    return jnp.min(jnp.where(edges["valid"][None], d2, jnp.inf), axis=-1)


def polyline_edges(line: chex.Array, valid: chex.Array) -> dict[str, chex.Array]:
    """Segments of a polyline (R, 2) with (R,) valid points, in `ring_edges`' format."""
    a, ab = line[:-1], line[1:] - line[:-1]
    length2 = jnp.sum(ab * ab, -1)
    return {"a": a, "ab": ab, "inv": jnp.where(length2 > 0, 1.0 / jnp.where(length2 > 0, length2, 1.0), 0.0),
            "valid": valid[:-1] & valid[1:]}


def ground_layers(scene: Scene, points: chex.Array, marking_width: float = 0.15,
                  route_width: float = 0.0) -> dict[str, chex.Array]:
    """Boolean layers (K,) at ego-frame points (K, 2) of one scene.

    drivable: inside a drivable polygon (roadblock, intersection, car park), the scorer's DAC
      area. marking: within marking_width / 2 of a lane's (not a connector's) boundary.
      route: within route_width / 2 of the route centreline (all False when 0).
    """
    k = points.shape[0]
    pad = (-k) % CHUNK if k > CHUNK else 0
    chunk = CHUNK if k > CHUNK else k
    pts = jnp.pad(points.astype(jnp.float32), ((0, pad), (0, 0))).reshape(-1, chunk, 2)
    drv, lanes, route = scene.map.drivable, scene.map.lanes, scene.route
    marking_edges = ring_edges(lanes.vertices, lanes.valid & (lanes.kind == 0))
    route_edges = polyline_edges(route.points, route.valid)

    def one(p):
        # the scorer's own even-odd test (its brute-force path), so DAC and pixels agree
        drivable = jnp.any(inside_bits_brute(p, drv.vertices, drv.valid) != 0, axis=-1)
        marking = squared_distance_to_edges(p, marking_edges) <= (marking_width / 2) ** 2
        if route_width > 0:
            on_route = squared_distance_to_edges(p, route_edges) <= (route_width / 2) ** 2
        else:
            on_route = jnp.zeros(p.shape[:1], bool)
        return drivable, marking, on_route

    drivable, marking, on_route = jax.lax.map(one, pts)
    flat = lambda z: z.reshape(-1)[:k]  # noqa: E731
    return {"drivable": flat(drivable), "marking": flat(marking), "route": flat(on_route)}


def paint(base: chex.Array, layers: list[tuple[chex.Array, tuple[int, int, int]]]) -> chex.Array:
    """Paints flat colours over base (..., 3) uint8 where each (mask (...), rgb) holds, in order."""
    out = base
    for mask, rgb in layers:
        out = jnp.where(mask[..., None], jnp.asarray(rgb, jnp.uint8), out)
    return out
