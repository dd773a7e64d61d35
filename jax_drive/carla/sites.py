"""Our scenario definitions on CARLA towns: sites, lane tracing and the town builder.

Every scenario builder of :mod:`jax_drive.sim.scenarios` lays out lane paths, then places
and times its agents along them (arcs, conflict points, stop lines). :class:`TownBuilder`
runs the same builder, but each lane path it is given is placed in the town by the site's
:class:`~jax_drive.carla.frames.Anchor`, traced along the town's own driving lanes
(:func:`trace_lane`: ``Map.get_waypoint`` then ``Waypoint.next`` steps, taking at each
branch the successor closest to the scenario's path) and brought back into the scenario
frame; stop lines move to where the traced lane enters the junction. Agents are then
placed and timed on the town's real geometry by the unchanged builder code. A lane whose
town counterpart strays more than ``tolerance`` metres from the scenario's path raises
:class:`SiteMismatch` (the site has no such road).

Sites (CoLMDriver's InterDrive uses Towns 05, 06 and 07): intersection scenarios on a
four-way junction of Town05, highway scenarios on Town06's multi-lane highway, overtakes
on a two-way road of Town07. A site's anchor is found on the map (:func:`find_anchor`:
the four-way junction, the right-most lane of a same-direction pair, or the centre line
of a two-way road nearest to ``near``) unless given explicitly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from jax_drive.carla.frames import Anchor, to_carla, to_local
from jax_drive.geometry import polyline_table, project_on_table
from jax_drive.sim import layouts, scenarios as S
from jax_drive.sim.state import SimConfig

JUNCTION = ("tv_red_light", "tv_left_turn", "ic_straight_straight", "ic_straight_left", "ic_chaos",
            "lm_straight_right", "lm_left_right", "lc_right_straight")
HIGHWAY = ("tv_highway_merge", "tv_highway_exit", "lm_highway_merge", "lm_neighbour_lane", "lc_highway_change")
TWO_WAY = ("tv_overtake_perception", "tv_overtake_negotiation", "ic_opposite_lane")
LAYOUT = {**{n: "junction" for n in JUNCTION}, **{n: "highway" for n in HIGHWAY}, **{n: "two_way" for n in TWO_WAY}}


class SiteMismatch(ValueError):
    """The town has no lane close enough to a scenario's lane path."""


@dataclasses.dataclass(frozen=True)
class Site:
    """Where a layout goes: town, kind (junction | highway | two_way), an explicit anchor,
    or ``near`` (CARLA x, y) to search the map from (None: the map origin)."""

    town: str
    kind: str
    anchor: Anchor | None = None
    near: tuple[float, float] | None = None


# Town06's highway: a lane at (100, 139.5) heading +x (yaw 0) appears in public CARLA
# scenario configs; the other two are found on the map nearest its origin.
SITES = {
    "junction": Site("Town05", "junction"),
    "highway": Site("Town06", "highway", near=(100.0, 139.5)),
    "two_way": Site("Town07", "two_way"),
}


def site_of(scenario: str) -> Site:
    S.family(scenario)
    return SITES[LAYOUT[scenario]]


@dataclasses.dataclass(frozen=True)
class TracedLane:
    """A lane traced on the map: points (M, 2) CARLA x, y; lane width (m); the point where
    it enters a junction (2,) or None; deviation: the largest distance (m) of a traced
    point from the reference path; covered: the traced length over the reference length."""

    points: np.ndarray
    width: float
    junction_entry: np.ndarray | None
    deviation: float
    covered: float


def _xy(wp) -> np.ndarray:
    loc = wp.transform.location
    return np.array([loc.x, loc.y], np.float64)


def trace_lane(town_map, reference, *, step: float = 2.0, location: Callable | None = None) -> TracedLane:
    """Traces the town's driving lane that follows ``reference`` (P, 2) CARLA x, y.

    ``town_map`` needs ``get_waypoint(location)`` (CARLA's default: projected to the
    nearest driving lane) and waypoints with ``transform``, ``lane_width``,
    ``is_junction``, ``next(d)`` and ``previous(d)`` (for a path that runs against the
    lane's direction, e.g. an overtake in the opposite lane); ``location(x, y, z)`` builds the query (default
    ``carla.Location``).
    """
    if location is None:
        from jax_drive.carla import carla_module

        location = carla_module().Location
    reference = np.asarray(reference, np.float64)
    ref = polyline_table(reference)
    length = float(np.sum(ref.seg_len))
    wp = town_map.get_waypoint(location(x=float(reference[0, 0]), y=float(reference[0, 1]), z=0.0))
    if wp is None:
        raise SiteMismatch(f"no driving lane near ({reference[0, 0]:.1f}, {reference[0, 1]:.1f})")
    # a path against the lane's direction (an overtake in the opposite lane) walks backwards
    d = reference[1] - reference[0]
    along = np.cos(np.radians(_yaw(wp)) - np.arctan2(d[1], d[0])) >= 0.0
    wps = [wp]
    travelled = 0.0
    while travelled < length - 1e-6:
        advance = wp.next if along else wp.previous
        nexts = list(advance(min(step, length - travelled)))
        if not nexts:
            break
        dist = [abs(float(project_on_table(ref, _xy(c)).lateral)) for c in nexts]
        wp = nexts[int(np.argmin(dist))]
        wps.append(wp)
        travelled += min(step, length - travelled)
    points = np.stack([_xy(w) for w in wps])
    proj = project_on_table(ref, points)
    deviation = float(np.max(np.abs(np.asarray(proj.lateral))))
    widths = [float(w.lane_width) for w in wps if not w.is_junction] or [float(wps[0].lane_width)]
    entry = next((_xy(w) for w in wps if w.is_junction), None)
    return TracedLane(points=points, width=float(np.median(widths)), junction_entry=entry, deviation=deviation,
                      covered=travelled / max(length, 1e-9))


class TownBuilder(layouts.Builder):
    """A scenario builder whose lane paths are the town's traced lanes (see the module
    docstring). ``trace(points CARLA (P, 2)) -> TracedLane``; ``tolerance`` in metres."""

    def __init__(self, cfg: SimConfig, anchor: Anchor, trace: Callable[[np.ndarray], TracedLane],
                 tolerance: float = 6.0, min_covered: float = 0.9):
        super().__init__(cfg)
        self.anchor = anchor
        self.trace = trace
        self.tolerance = tolerance
        self.min_covered = min_covered
        self.traced: list[TracedLane] = []

    def lane(self, pts, *, width=layouts.LANE_W, limit=10.0, light=-1, stop_xy=None, label=1, maneuver=0) -> int:
        traced = self.trace(to_carla(self.anchor, np.asarray(pts, np.float64)))
        k = len(self.lanes)
        if traced.deviation > self.tolerance:
            raise SiteMismatch(f"{self.anchor.town}: lane {k} of the scenario is {traced.deviation:.1f} m from the "
                               f"nearest town lane (tolerance {self.tolerance} m)")
        if traced.covered < self.min_covered:
            raise SiteMismatch(f"{self.anchor.town}: the town lane for lane {k} ends after "
                               f"{100 * traced.covered:.0f}% of the scenario's path")
        self.traced.append(traced)
        if stop_xy is not None and traced.junction_entry is not None:
            stop_xy = to_local(self.anchor, traced.junction_entry)
        return super().lane(to_local(self.anchor, traced.points), width=traced.width, limit=limit, light=light,
                            stop_xy=stop_xy, label=label, maneuver=maneuver)


def build_on_town(name: str, key, anchor: Anchor, trace: Callable[[np.ndarray], TracedLane], *,
                  accident_prone: bool = True, background: bool = False, cfg: SimConfig = SimConfig(),
                  tolerance: float = 6.0):
    """Scenario ``name`` built on the town lanes that ``trace`` finds (scenario frame)."""
    builder = TownBuilder(cfg, anchor, trace, tolerance)
    return S.build(name, key, accident_prone=accident_prone, background=background, cfg=cfg, builder=builder)


# ----------------------------------------------------------------------- anchors on a map
def _yaw(wp) -> float:
    return float(wp.transform.rotation.yaw)


def _distance(wp, near) -> float:
    return float(np.hypot(*(_xy(wp) - np.asarray(near, np.float64))))


def find_anchor(town_map, site: Site, *, location: Callable | None = None) -> Anchor:
    """The anchor of ``site`` on ``town_map`` (CARLA's ``Map`` API; see the module docstring).

    junction: the junction with straight movements from four directions nearest to
    ``near``; origin at its bounding-box centre, +x along one of those straight movements.
    highway: the right-most of two or more same-direction driving lanes at ``near``; origin
    on it, +x along it. two_way: a lane with an opposite-direction left neighbour at
    ``near``; origin on the centre line between them, +x along the lane.
    """
    if site.anchor is not None:
        return site.anchor
    near = site.near or (0.0, 0.0)
    if site.kind == "junction":
        junctions = {}
        for a, b in town_map.get_topology():
            for wp in (a, b):
                if wp.is_junction:
                    j = wp.get_junction()
                    junctions[j.id] = j
        four_way = []
        for j in junctions.values():
            # straight movements (entry and exit headings agree) give the approach directions
            straight = [a for a, b in j.get_waypoints() if np.cos(np.radians(_yaw(b) - _yaw(a))) > 0.98]
            directions = {int(np.round((_yaw(w) % 360.0) / 90.0)) % 4 for w in straight}
            if len(directions) == 4:
                loc = j.bounding_box.location
                four_way.append((float(np.hypot(loc.x - near[0], loc.y - near[1])), j.id, j, straight))
        if not four_way:
            raise SiteMismatch(f"{site.town}: no four-way junction")
        _, _, j, straight = min(four_way, key=lambda t: (t[0], t[1]))
        loc = j.bounding_box.location
        return Anchor(site.town, float(loc.x), float(loc.y), min(_yaw(w) for w in straight), float(loc.z))
    if location is None:
        from jax_drive.carla import carla_module

        location = carla_module().Location
    wp = town_map.get_waypoint(location(x=float(near[0]), y=float(near[1]), z=0.0))
    if wp is None:
        raise SiteMismatch(f"{site.town}: no driving lane near {near}")
    if site.kind == "highway":
        right = wp.get_right_lane()
        while right is not None and right.lane_id * wp.lane_id > 0 and _is_driving(right):
            wp, right = right, right.get_right_lane()
        left = wp.get_left_lane()
        if left is None or left.lane_id * wp.lane_id <= 0 or not _is_driving(left):
            raise SiteMismatch(f"{site.town}: the lane at {near} has no same-direction lane to its left")
        loc = wp.transform.location
        return Anchor(site.town, float(loc.x), float(loc.y), _yaw(wp), float(loc.z))
    if site.kind == "two_way":
        left = wp.get_left_lane()
        if left is None or left.lane_id * wp.lane_id >= 0:
            raise SiteMismatch(f"{site.town}: the lane at {near} has no opposite-direction lane to its left")
        mid = 0.5 * (_xy(wp) + _xy(left))
        return Anchor(site.town, float(mid[0]), float(mid[1]), _yaw(wp), float(wp.transform.location.z))
    raise ValueError(f"unknown site kind {site.kind!r}")


def _is_driving(wp) -> bool:
    lane_type = getattr(wp, "lane_type", None)
    return lane_type is None or str(lane_type).endswith("Driving")
