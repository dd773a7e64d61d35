"""Bird's-eye-view raster of a scene (pure JAX, batched over scenes).

The image is ego-centred with the ego's heading pointing up: pixel (row, col) has its centre
at x = (ego_row - row - 0.5) * m, y = (width / 2 - col - 0.5) * m in the ego frame (m =
metres_per_pixel; x forward, y left). Layers, bottom to top: off-road, drivable area
(exactly the scorer's DAC area at each pixel centre), lane boundaries, the route, objects at
t0 as oriented boxes coloured by class, the ego's past positions, the ego box.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import chex
import jax
import jax.numpy as jnp

from jax_drive.geometry import rotate
from jax_drive.render import style
from jax_drive.render.batching import over_scenes
from jax_drive.render.ground import ground_layers, paint
from jax_drive.types import Scene, VehicleParameters


@dataclasses.dataclass(frozen=True)
class BEVConfig:
    """BEV raster settings.

    Attributes:
      height, width: image size in pixels (default 256 x 256).
      metres_per_pixel: ground resolution (default 0.25: 64 m x 64 m).
      ego_row: image row of the ego rear axle (default: 3/4 of the height, so 48 m ahead
        and 16 m behind at the defaults).
      marking_width, route_width: line widths in metres.
      history_radius: radius of the dots marking the ego's past positions, metres.
    """

    height: int = 256
    width: int = 256
    metres_per_pixel: float = 0.25
    ego_row: int | None = None
    marking_width: float = 0.3
    route_width: float = 1.2
    history_radius: float = 0.35

    def __post_init__(self):
        if self.height <= 0 or self.width <= 0 or self.metres_per_pixel <= 0:
            raise ValueError("BEV height, width and metres_per_pixel must be positive")

    @property
    def row_of_ego(self) -> int:
        return self.height * 3 // 4 if self.ego_row is None else self.ego_row


def pixel_centres(config: BEVConfig) -> chex.Array:
    """(H, W, 2) ego-frame (x, y) of every pixel centre."""
    m = config.metres_per_pixel
    rows = jnp.arange(config.height, dtype=jnp.float32) + 0.5
    cols = jnp.arange(config.width, dtype=jnp.float32) + 0.5
    x = (config.row_of_ego - rows) * m
    y = (config.width / 2 - cols) * m
    return jnp.stack(jnp.meshgrid(x, y, indexing="ij"), axis=-1)


def in_boxes(points: chex.Array, cx, cy, heading, length, width, valid) -> chex.Array:
    """points (K, 2) inside oriented boxes (N,) -> (K, N) bool."""
    local = rotate(points[:, None, :] - jnp.stack([cx, cy], -1)[None], -heading[None])
    return (valid[None] & (jnp.abs(local[..., 0]) <= length / 2)
            & (jnp.abs(local[..., 1]) <= width / 2))


def _bev_layers(scene: Scene, config: BEVConfig) -> dict[str, chex.Array]:
    ego = VehicleParameters()
    pts = pixel_centres(config).reshape(-1, 2)
    layers = ground_layers(scene, pts, config.marking_width, config.route_width)
    ag = scene.agents
    hits = in_boxes(pts, ag.x[:, 0], ag.y[:, 0], ag.heading[:, 0], ag.length, ag.width,
                    ag.valid[:, 0])  # (K, N)
    # the last box drawn wins where boxes overlap (argmax of the reversed hit mask)
    last = hits.shape[1] - 1 - jnp.argmax(hits[:, ::-1], axis=1)
    layers["object"] = jnp.any(hits, axis=1)
    layers["object_type"] = jnp.take(ag.agent_type, last).astype(jnp.int32)
    zero = jnp.zeros((1,), jnp.float32)
    layers["ego"] = in_boxes(pts, zero + ego.rear_axle_to_center, zero, zero,
                             zero + ego.length, zero + ego.width, jnp.ones((1,), bool))[:, 0]
    hist = scene.ego.history_poses[:-1, :2]  # the current pose is the ego box itself
    near = jnp.sum((pts[:, None] - hist[None]) ** 2, -1) <= config.history_radius**2
    layers["history"] = jnp.any(near, axis=1)
    shape = (config.height, config.width)
    return {k: v.reshape(shape) for k, v in layers.items()}


@partial(jax.jit, static_argnames=("config",))
def bev_layers(scene: Scene, config: BEVConfig = BEVConfig()) -> dict[str, chex.Array]:
    """Per-pixel layers of one scene (no batch dims): drivable, marking, route, object,
    ego, history (H, W) bool and object_type (H, W) int32 (valid where object)."""
    return _bev_layers(scene, config)


def _compose(scene: Scene, config: BEVConfig) -> chex.Array:
    layers = _bev_layers(scene, config)
    base = jnp.broadcast_to(jnp.asarray(style.OFFROAD, jnp.uint8), (config.height, config.width, 3))
    img = paint(base, [(layers["drivable"], style.ASPHALT), (layers["marking"], style.MARKING),
                       (layers["route"], style.ROUTE)])
    palette = jnp.asarray(style.agent_palette())
    obj = palette[jnp.clip(layers["object_type"], 0, palette.shape[0] - 1)]
    img = jnp.where(layers["object"][..., None], obj, img)
    return paint(img, [(layers["history"], style.HISTORY), (layers["ego"], style.EGO)])


@partial(jax.jit, static_argnames=("config",))
def render_bev(scene: Scene, config: BEVConfig = BEVConfig()) -> chex.Array:
    """BEV image(s) of a scene with any leading batch dims: (..., H, W, 3) uint8."""
    return over_scenes(lambda s: _compose(s, config), scene)
