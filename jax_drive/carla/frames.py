"""Coordinate frames: our scenario frame and CARLA's world frame.

Ours (:mod:`jax_drive.sim.state`): right-handed, x east, y north, metres, heading in
radians counter-clockwise from +x. CARLA (Unreal): left-handed, x forward, y right, z up,
yaw in degrees clockwise seen from above (a +90 degree yaw points along +y). A point of a
scenario is placed in a town by an :class:`Anchor`: the CARLA location and yaw of the
scenario's origin and +x axis. With y flipped,

    right-handed world = R(-yaw) local + (ax, -ay),   CARLA = (world_x, -world_y),
    CARLA yaw (deg) = anchor yaw - degrees(heading).

All functions are NumPy and vectorised over leading dims.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Anchor:
    """Where a scenario's local frame sits in a town: origin (x, y, z) in CARLA metres and
    the CARLA yaw (degrees) of the local +x axis."""

    town: str
    x: float
    y: float
    yaw: float
    z: float = 0.0


def to_carla(anchor: Anchor, xy, heading=None):
    """Local points (..., 2) [and headings (...) rad] -> CARLA (..., 2) [and yaw (...) deg]."""
    xy = np.asarray(xy, np.float64)
    theta = -np.radians(anchor.yaw)
    c, s = np.cos(theta), np.sin(theta)
    wx = c * xy[..., 0] - s * xy[..., 1] + anchor.x
    wy = s * xy[..., 0] + c * xy[..., 1] - anchor.y
    out = np.stack([wx, -wy], -1)
    if heading is None:
        return out
    return out, wrap_degrees(anchor.yaw - np.degrees(np.asarray(heading, np.float64)))


def to_local(anchor: Anchor, xy, yaw=None):
    """CARLA points (..., 2) [and yaw (...) deg] -> local (..., 2) [and heading (...) rad]."""
    xy = np.asarray(xy, np.float64)
    wx, wy = xy[..., 0] - anchor.x, -xy[..., 1] + anchor.y
    theta = -np.radians(anchor.yaw)
    c, s = np.cos(theta), np.sin(theta)
    out = np.stack([c * wx + s * wy, -s * wx + c * wy], -1)
    if yaw is None:
        return out
    heading = np.radians(anchor.yaw - np.asarray(yaw, np.float64))
    return out, np.arctan2(np.sin(heading), np.cos(heading))


def velocity_to_local(anchor: Anchor, vxy):
    """CARLA velocity vectors (..., 2) -> local (..., 2) (a rotation and the y flip)."""
    origin = Anchor(anchor.town, 0.0, 0.0, anchor.yaw)
    return to_local(origin, vxy)


def velocity_to_carla(anchor: Anchor, vxy):
    """Local velocity vectors (..., 2) -> CARLA (..., 2)."""
    origin = Anchor(anchor.town, 0.0, 0.0, anchor.yaw)
    return to_carla(origin, vxy)


def wrap_degrees(deg):
    """Angles in degrees wrapped to [-180, 180)."""
    return (np.asarray(deg, np.float64) + 180.0) % 360.0 - 180.0


def carla_transform(anchor: Anchor, xy, heading: float, z: float | None = None):
    """A ``carla.Transform`` of one local pose (z defaults to the anchor's)."""
    from jax_drive.carla import carla_module

    carla = carla_module()
    (x, y), yaw = to_carla(anchor, xy, heading)
    return carla.Transform(carla.Location(x=float(x), y=float(y), z=float(anchor.z if z is None else z)),
                           carla.Rotation(pitch=0.0, yaw=float(yaw), roll=0.0))
