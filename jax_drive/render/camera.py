"""A pinhole front camera over a scene (pure JAX ray casting, batched over scenes).

Each pixel casts a ray from the camera; the nearest hit wins (depth ordering): the ground
plane z = 0 (coloured by the same layers as the BEV: off-road, drivable area, lane
boundaries; fading into haze beyond ``max_distance``), the objects at t0 as boxes standing on
the ground (bottom z = 0, top at their height; faces shaded by orientation), or the sky.

Camera frame: x right, y down, z forward; image row v, column u. The camera sits at
(x, y, z) in the ego frame looking along +x, pitched down by ``pitch`` and turned left by
``yaw``. Focal length f = (width / 2) / tan(fov_x / 2), principal point at the image centre,
so a ground point straight ahead at distance d from the camera (pitch 0) appears in the
centre column at row height / 2 + f * z / d.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial

import chex
import jax
import jax.numpy as jnp

from jax_drive.render import style
from jax_drive.render.batching import over_scenes
from jax_drive.render.ground import ground_layers, paint
from jax_drive.types import Scene

_FAR = 1e9


@dataclasses.dataclass(frozen=True)
class CameraConfig:
    """Front camera settings (defaults: 448 x 252, a 16:9 image whose sides are multiples of
    28, so Qwen2.5-VL's processor keeps it as is: 32 x 18 patches, 144 image tokens).

    Attributes:
      width, height: image size in pixels.
      fov_x_deg: horizontal field of view, degrees.
      x, y, z: camera position in the ego frame (rear axle on the ground), metres.
      pitch_deg: downward tilt; yaw_deg: leftward turn.
      max_distance: ground beyond this many metres is drawn as haze.
      marking_width: lane boundary width on the ground, metres.
    """

    width: int = 448
    height: int = 252
    fov_x_deg: float = 70.0
    x: float = 1.5
    y: float = 0.0
    z: float = 1.6
    pitch_deg: float = 4.0
    yaw_deg: float = 0.0
    max_distance: float = 90.0
    marking_width: float = 0.2

    def __post_init__(self):
        if self.width <= 0 or self.height <= 0:
            raise ValueError("camera width and height must be positive")
        if not 0 < self.fov_x_deg < 180:
            raise ValueError(f"fov_x_deg must lie in (0, 180), got {self.fov_x_deg}")
        if self.z <= 0:
            raise ValueError(f"the camera must be above the ground, got z = {self.z}")

    @property
    def focal(self) -> float:
        """Focal length in pixels."""
        return self.width / 2 / math.tan(math.radians(self.fov_x_deg) / 2)

    def rotation(self) -> chex.Array:
        """(3, 3) camera-to-ego rotation (columns: camera x, y, z axes in the ego frame)."""
        p, w = math.radians(self.pitch_deg), math.radians(self.yaw_deg)
        forward = (math.cos(p) * math.cos(w), math.cos(p) * math.sin(w), -math.sin(p))
        right = (math.sin(w), -math.cos(w), 0.0)
        down = (-math.sin(p) * math.cos(w), -math.sin(p) * math.sin(w), -math.cos(p))
        return jnp.asarray([right, down, forward], jnp.float32).T


def project_points(points: chex.Array, config: CameraConfig = CameraConfig()):
    """Ego-frame points (..., 3) -> (u, v) pixel coordinates (..., 2) and depth (...) along the
    optical axis (points behind the camera have depth <= 0)."""
    rel = points - jnp.asarray([config.x, config.y, config.z], jnp.float32)
    cam = rel @ config.rotation()  # (..., 3) in the camera frame
    depth = cam[..., 2]
    safe = jnp.where(jnp.abs(depth) < 1e-6, 1e-6, depth)
    u = config.width / 2 + config.focal * cam[..., 0] / safe
    v = config.height / 2 + config.focal * cam[..., 1] / safe
    return jnp.stack([u, v], -1), depth


def pixel_rays(config: CameraConfig) -> chex.Array:
    """(H, W, 3) ego-frame ray directions through the pixel centres (unit optical depth)."""
    u = jnp.arange(config.width, dtype=jnp.float32) + 0.5
    v = jnp.arange(config.height, dtype=jnp.float32) + 0.5
    uu, vv = jnp.meshgrid(u, v, indexing="xy")  # (H, W)
    cam = jnp.stack([(uu - config.width / 2) / config.focal, (vv - config.height / 2) / config.focal,
                     jnp.ones_like(uu)], -1)
    return cam @ config.rotation().T


def ray_boxes(origin: chex.Array, rays: chex.Array, cx, cy, heading, length, width, height,
              valid):
    """Nearest hit of rays (K, 3) from origin (3,) with boxes standing on the ground.

    Boxes (N,): centre (cx, cy), heading, size; bottom at z = 0. Returns hit distance (K, N)
    along the ray (_FAR: miss) and the hit face axis (K, N) int32 (0 front/back, 1 sides,
    2 top / bottom).
    """
    c, s = jnp.cos(heading), jnp.sin(heading)  # (N,)
    rx, ry = origin[0] - cx, origin[1] - cy
    origin_box = (c * rx + s * ry, -s * rx + c * ry, jnp.broadcast_to(origin[2], cx.shape))
    dx, dy = rays[:, 0:1], rays[:, 1:2]  # (K, 1)
    direction = (c * dx + s * dy, -s * dx + c * dy, jnp.broadcast_to(rays[:, 2:3], dx.shape))
    bounds = ((-length / 2, length / 2), (-width / 2, width / 2), (jnp.zeros_like(height), height))
    near, far = [], []
    for o, d, (lo, hi) in zip(origin_box, direction, bounds):  # the three slabs, (K, N) each
        inv = 1.0 / jnp.where(jnp.abs(d) < 1e-9, 1e-9, d)
        t1, t2 = (lo - o) * inv, (hi - o) * inv
        near.append(jnp.minimum(t1, t2))
        far.append(jnp.maximum(t1, t2))
    t_near = jnp.maximum(jnp.maximum(near[0], near[1]), near[2])
    t_far = jnp.minimum(jnp.minimum(far[0], far[1]), far[2])
    face = jnp.where(t_near == near[0], 0, jnp.where(t_near == near[1], 1, 2)).astype(jnp.int32)
    hit = valid & (t_near <= t_far) & (t_near > 0)
    return jnp.where(hit, t_near, _FAR), face


def _camera_image(scene: Scene, config: CameraConfig) -> chex.Array:
    rays = pixel_rays(config).reshape(-1, 3)  # (K, 3)
    origin = jnp.asarray([config.x, config.y, config.z], jnp.float32)
    # ground
    down = rays[:, 2] < -1e-6
    t_ground = jnp.where(down, -origin[2] / jnp.where(down, rays[:, 2], -1.0), _FAR)
    ground = origin[:2] + t_ground[:, None] * rays[:, :2]
    ground = jnp.where(down[:, None], ground, 0.0)
    layers = ground_layers(scene, ground, config.marking_width)
    base = jnp.broadcast_to(jnp.asarray(style.OFFROAD, jnp.uint8), (rays.shape[0], 3))
    img = paint(base, [(layers["drivable"], style.ASPHALT), (layers["marking"], style.MARKING)])
    horizontal = jnp.linalg.norm(ground - origin[:2], axis=-1)
    img = paint(img, [(~down | (horizontal > config.max_distance), style.HORIZON),
                      (rays[:, 2] >= 0, style.SKY)])
    # objects
    ag = scene.agents
    t_box, face = ray_boxes(origin, rays, ag.x[:, 0], ag.y[:, 0], ag.heading[:, 0], ag.length,
                            ag.width, ag.height, ag.valid[:, 0])
    nearest = jnp.argmin(t_box, axis=1)
    t_obj = jnp.take_along_axis(t_box, nearest[:, None], 1)[:, 0]
    face = jnp.take_along_axis(face, nearest[:, None], 1)[:, 0]
    colour = jnp.asarray(style.agent_palette())[jnp.clip(ag.agent_type[nearest], 0, 6)]
    shade = jnp.asarray([1.0, 0.78, 1.15], jnp.float32)[face]
    colour = jnp.clip(colour.astype(jnp.float32) * shade[:, None], 0, 255).astype(jnp.uint8)
    in_front = (t_obj < t_ground) & (t_obj < _FAR)
    img = jnp.where(in_front[:, None], colour, img)
    return img.reshape(config.height, config.width, 3)


@partial(jax.jit, static_argnames=("config",))
def render_camera(scene: Scene, config: CameraConfig = CameraConfig()) -> chex.Array:
    """Front camera image(s) of a scene with any leading batch dims: (..., H, W, 3) uint8."""
    return over_scenes(lambda s: _camera_image(s, config), scene)
