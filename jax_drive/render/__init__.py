"""Scene rendering (pure JAX, batched over scenes): a bird's-eye-view raster and a pinhole
front camera, as uint8 RGB arrays; PNG files and contact sheets for documentation."""

from jax_drive.render.bev import BEVConfig, bev_layers, pixel_centres, render_bev
from jax_drive.render.camera import CameraConfig, project_points, render_camera
from jax_drive.render.ground import ground_layers
from jax_drive.render.png import contact_sheet, encode_png, write_png

__all__ = [
    "BEVConfig",
    "CameraConfig",
    "bev_layers",
    "contact_sheet",
    "encode_png",
    "ground_layers",
    "pixel_centres",
    "project_points",
    "render_bev",
    "render_camera",
    "write_png",
]
