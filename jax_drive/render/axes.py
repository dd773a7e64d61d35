"""Matplotlib drawings of one scene on axes the caller owns: the map, the objects, a
proposal and the PDM violations of it (Fig. 4 of MTDrive, the scoring notebook).

No pyplot and no backend choice here; not imported by :mod:`jax_drive.render`, so that
package never pulls in matplotlib.
"""

from __future__ import annotations

import numpy as np

from jax_drive import geometry
from jax_drive.types import AgentType, PolygonType

# Shared look: map greys, objects in blue (static objects in grey-brown), the ego in green.
DRIVABLE = "0.88"
INTERSECTION = "0.8"
CAR_PARK = "0.93"
AGENT = "tab:blue"
STATIC_OBJECT = "tab:brown"
EGO = "tab:green"
VIOLATION = "red"
TTC_WARNING = "tab:orange"


def draw_scene(ax, scene, step: int = 0) -> None:
    """Draws one unbatched scene (NumPy or JAX leaves) in its ego frame: drivable polygons
    (intersections and car parks shaded apart), red-light connectors, the route (dashed),
    the objects present at observation ``step`` (0 = t0; boxes, static ones brown) and the
    ego at t0 (green box)."""
    drivable = scene.map.drivable
    shade = {int(PolygonType.INTERSECTION): INTERSECTION, int(PolygonType.CARPARK): CAR_PARK}
    for poly, ok, kind in zip(np.asarray(drivable.vertices), np.asarray(drivable.valid), np.asarray(drivable.kind)):
        if ok:
            ax.fill(poly[:, 0], poly[:, 1], color=shade.get(int(kind), DRIVABLE), zorder=0, lw=0)
    red = np.asarray(scene.map.red_light)[:, step] & np.asarray(scene.map.lanes.valid)
    for line, ok in zip(np.asarray(scene.map.lane_centerlines)[red], np.asarray(scene.map.lane_centerline_valid)[red]):
        ax.plot(line[ok, 0], line[ok, 1], color=VIOLATION, lw=2, alpha=0.5, zorder=1)
    route = np.asarray(scene.route.points)[np.asarray(scene.route.valid)]
    ax.plot(route[:, 0], route[:, 1], "--", color="0.6", lw=0.8, zorder=1)
    agents = scene.agents
    present = np.asarray(agents.valid)[:, step]
    for i in np.flatnonzero(present):
        c = np.asarray(geometry.box_corners(agents.x[i, step], agents.y[i, step], agents.heading[i, step],
                                            agents.length[i], agents.width[i]))
        moving = int(agents.agent_type[i]) in (AgentType.VEHICLE, AgentType.PEDESTRIAN, AgentType.BICYCLE)
        ax.fill(c[:, 0], c[:, 1], color=AGENT if moving else STATIC_OBJECT, alpha=0.5, zorder=2)
    ego = np.asarray(geometry.ego_corners(np.zeros(3, np.float32)))
    ax.fill(ego[:, 0], ego[:, 1], color=EGO, alpha=0.8, zorder=3)
    ax.set_aspect("equal")


def violating_points(violations, index=()) -> np.ndarray:
    """(8,) bool: the output poses where DAC, NC or TTC failed, from a
    :class:`jax_drive.pdm.Violations` whose fields are indexed by ``index`` down to (8,)."""
    return np.asarray(violations.dac_point[index] | violations.nc_point[index] | violations.ttc_point[index])


def _outline(ax, box, color: str, style: str) -> None:
    """box: (7,) [x, y, z, length, width, height, heading] of the object that was hit."""
    c = np.asarray(geometry.box_corners(box[0], box[1], box[6], box[3], box[4]))
    ax.fill(c[:, 0], c[:, 1], fill=False, ec=color, lw=1.5, ls=style, zorder=6)


def draw_proposal(ax, poses, violations=None, index=(), color="tab:purple", label: str | None = None,
                  detail: bool = False) -> None:
    """Draws a proposal (8, 3) [x, y, heading] with its violating poses circled in red.

    violations: optional :class:`jax_drive.pdm.Violations`, indexed by ``index`` down to
    fields (8,). detail: mark each rule apart instead: DAC as red squares, an at-fault
    collision as a red cross with the hit object's box outlined, TTC as orange triangles
    with the object's box dashed.
    """
    poses = np.asarray(poses)
    ax.plot(poses[:, 0], poses[:, 1], "-o", ms=3, color=color, label=label, zorder=4)
    if violations is None:
        return
    if not detail:
        bad = violating_points(violations, index)
        ax.scatter(poses[bad, 0], poses[bad, 1], s=60, facecolors="none", edgecolors=VIOLATION, zorder=5)
        return
    v = {k: np.asarray(getattr(violations, k)[index]) for k in ("dac_point", "nc_point", "nc_box", "ttc_point",
                                                                 "ttc_box")}
    marks = (("dac_point", "s", VIOLATION, "DAC"), ("nc_point", "X", VIOLATION, "NC"),
             ("ttc_point", "^", TTC_WARNING, "TTC"))
    for field, marker, c, name in marks:
        hit = v[field]
        if hit.any():
            ax.scatter(poses[hit, 0], poses[hit, 1], s=70, marker=marker, facecolors="none", edgecolors=c,
                       linewidths=1.5, zorder=5, label=name)
    for field, box, c, style in (("nc_point", "nc_box", VIOLATION, "-"), ("ttc_point", "ttc_box", TTC_WARNING, "--")):
        hits = np.flatnonzero(v[field])
        if len(hits):
            _outline(ax, v[box][hits[0]], c, style)
