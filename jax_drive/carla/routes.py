"""Routes in the CARLA leaderboard's XML, and the routes of a scenario's egos.

Leaderboard 1.0 (CoLMDriver's InterDrive, one file per ego ``<route>_<i>.xml``)::

    <routes>
      <route id="0" town="Town05">
        <waypoint x="..." y="..." z="..." pitch="0.0" roll="0.0" yaw="..."/>
      </route>
    </routes>

Leaderboard 2.0 nests positions: ``<route ...><waypoints><position x y z/></waypoints>``.
:func:`read_routes` reads both; :func:`write_routes` writes the 1.0 form. Coordinates are
CARLA's (:mod:`jax_drive.carla.frames`).
"""

from __future__ import annotations

import dataclasses
import os
import xml.etree.ElementTree as ET

import numpy as np

from jax_drive.carla.frames import Anchor, to_carla
from jax_drive.geometry import point_at_arc, polyline_table, project_on_table
from jax_drive.runinfo import InputError
from jax_drive.sim.state import Behaviour, Role


@dataclasses.dataclass(frozen=True)
class Route:
    """One route: id, town and waypoints (N, 3) x, y, z with yaw (N,) degrees (CARLA)."""

    id: str
    town: str
    points: np.ndarray
    yaw: np.ndarray

    @property
    def length(self) -> float:
        return float(np.sum(np.linalg.norm(np.diff(self.points[:, :2], axis=0), axis=-1)))


def _float(el: ET.Element, name: str, default: float | None = None) -> float:
    value = el.get(name)
    if value is None:
        if default is None:
            raise InputError(f"<{el.tag}> lacks the attribute {name!r}")
        return default
    try:
        return float(value)
    except ValueError:
        raise InputError(f"<{el.tag} {name}={value!r}> is not a number") from None


def read_routes(path: str | os.PathLike) -> list[Route]:
    """Routes of a leaderboard route file (1.0 ``waypoint`` or 2.0 ``position`` elements)."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as error:
        raise InputError(f"cannot read routes from {path}: {error}") from error
    if root.tag != "routes":
        raise InputError(f"{path}: the root element is <{root.tag}>, not <routes>")
    routes = []
    for el in root.findall("route"):
        points = el.findall("waypoint") or el.findall("waypoints/position")
        if len(points) < 2:
            raise InputError(f"{path}: route {el.get('id')!r} has {len(points)} waypoints (need >= 2)")
        xyz = np.array([[_float(p, "x"), _float(p, "y"), _float(p, "z", 0.0)] for p in points])
        if all(p.get("yaw") is not None for p in points):
            yaw = np.array([_float(p, "yaw") for p in points])
        else:  # 2.0 positions carry no yaw: take the direction of travel
            d = np.diff(xyz[:, :2], axis=0)
            yaw = np.degrees(np.arctan2(d[:, 1], d[:, 0]))
            yaw = np.append(yaw, yaw[-1])
        routes.append(Route(id=el.get("id", str(len(routes))), town=el.get("town", ""), points=xyz, yaw=yaw))
    if not routes:
        raise InputError(f"{path}: no <route> elements")
    return routes


def write_routes(path: str | os.PathLike, routes: list[Route]) -> str:
    """Writes ``routes`` as a leaderboard 1.0 route file; returns the path."""
    root = ET.Element("routes")
    for r in routes:
        el = ET.SubElement(root, "route", id=str(r.id), town=r.town)
        for (x, y, z), yaw in zip(r.points, r.yaw):
            ET.SubElement(el, "waypoint", x=f"{x:.3f}", y=f"{y:.3f}", z=f"{z:.3f}", pitch="0.0", roll="0.0",
                          yaw=f"{yaw:.6f}")
    ET.indent(root)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
    return os.fspath(path)


def ego_routes(scenario, anchor: Anchor, spacing: float = 2.0, route_id: str = "0") -> list[Route]:
    """The route of every focal, reward-eligible, moving ego of one (unbatched)
    :class:`~jax_drive.sim.state.Scenario`, in slot order: along its goal lane from the
    projection of its start to its goal arc, every ``spacing`` metres, in CARLA coordinates
    (an ego that must change lanes gets the goal lane from the same projection)."""
    sc = {k: np.asarray(v) for k, v in scenario.items() if k not in ("lanes", "lights")}
    ids = np.flatnonzero(sc["valid"] & sc["reward"] & (sc["role"] == Role.FOCAL)
                         & (sc["behaviour"] == Behaviour.POLICY))
    table = polyline_table(np.asarray(scenario.lanes.points, np.float64))
    out = []
    for i in ids:
        lane = table.take(int(sc["goal_lane"][i]))
        start = float(project_on_table(lane, np.array([sc["x"][i], sc["y"][i]], np.float64), extrapolate=True).arc)
        end = float(sc["goal_arc"][i])
        arcs = np.append(np.arange(max(start, 0.0), end, spacing), end)
        xy, heading = point_at_arc(lane, arcs)
        cxy, yaw = to_carla(anchor, np.asarray(xy), np.asarray(heading))
        points = np.concatenate([cxy, np.full((len(cxy), 1), anchor.z)], -1)
        out.append(Route(id=route_id, town=anchor.town, points=points, yaw=yaw))
    return out


def write_interdrive(directory: str | os.PathLike, name: str, routes: list[Route]) -> list[str]:
    """InterDrive layout: ``<directory>/<name>/<name>_<i>.xml``, one file per ego."""
    return [write_routes(os.path.join(directory, name, f"{name}_{i}.xml"), [r]) for i, r in enumerate(routes)]
