"""Writes the example scene file: 20 small hand-built scenes, each with one trajectory whose
PDM sub-scores follow from the scene's layout (the expectations are written next to it and
checked by tests/test_pdm_scene_files.py).

    python examples/scenes/make_example_scenes.py [--out-dir examples/scenes]

Outputs (in --out-dir):
  example_scenes.json.gz        the scenes (jax-drive-scenes v1, UTM-sized rotated poses,
                                each with a PDM-Closed stand-in plan: the sensible behaviour)
  example_trajectories.jsonl    one trajectory per scene token (ego frame, 0.5 s)
  example_expected.json         per token: what the scene shows and the expected sub-scores

Score them with:
    jax-drive score --scenes-file examples/scenes/example_scenes.json.gz \\
        --trajectories examples/scenes/example_trajectories.jsonl --csv scores.csv
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from jax_drive.scenes.builders import LaneSpec, PolygonSpec, SceneSizes, SceneSpec, add_agent, add_static, agent_track
from jax_drive.scenes.io import scene_record, write_scene_file
from jax_drive.types import NUM_OBS_STEPS, AgentType, PolygonType

LANE = 3.5
T8 = np.arange(1, 9) * 0.5
T40 = np.arange(1, 41) * 0.1
SIZES = SceneSizes(num_agents=8, num_drivable=4, drivable_vertices=16, num_lanes=4, lane_vertices=8,
                   centerline_points=32, route_points=64)


def strip(x0, x1, y0, y1, per_side=6):
    """(2 per_side, 2) CCW rectangle with extra vertices along its long sides."""
    xs = np.linspace(x0, x1, per_side)
    return np.concatenate([np.stack([xs, np.full(per_side, y0)], -1), np.stack([xs[::-1], np.full(per_side, y1)], -1)])


def road(lanes=2, speed=10.0, accel=0.0, oncoming=False, x0=-40.0, x1=160.0) -> SceneSpec:
    """A straight road along +x: ``lanes`` lanes in the ego direction (lane 0 = the ego's;
    all of them on the route, as NAVSIM puts every lane of a route roadblock on the route),
    and an optional oncoming lane on the left (not on the route)."""
    total = lanes + int(oncoming)
    xs = np.linspace(x0, x1, 24)
    lane_specs = []
    for j in range(total):
        yc = j * LANE
        centre = np.stack([xs, np.full(24, yc)], -1)
        if oncoming and j == total - 1:
            centre = centre[::-1]
        lane_specs.append(LaneSpec(vertices=strip(x0, x1, yc - LANE / 2, yc + LANE / 2, 2), centerline=centre,
                                   on_route=not (oncoming and j == total - 1)))
    route_x = np.linspace(x0, x1, 64)
    return SceneSpec(route=np.stack([route_x, np.zeros(64)], -1), ego_velocity=(speed, 0.0),
                     ego_acceleration=(accel, 0.0),
                     drivable=[PolygonSpec(strip(x0, x1, -LANE / 2, (total - 0.5) * LANE, 5))], lanes=lane_specs)


def straight(speed, accel=0.0, lateral=0.0, dt=0.5, num=8):
    """(num, 3) poses along +x at constant acceleration (stopping at 0 speed), drifting
    linearly to ``lateral`` by the last pose (heading along the path)."""
    t = np.arange(1, num + 1) * dt
    if accel < 0:
        t_eff = np.minimum(t, speed / -accel)
    else:
        t_eff = t
    x = speed * t_eff + 0.5 * accel * t_eff**2
    y = lateral * t / t[-1]
    h = np.arctan2(np.gradient(y, t), np.maximum(np.gradient(x, t), 1e-3)) if lateral else np.zeros_like(x)
    return np.stack([x, y, h], -1)


def braking_to(speed, stop_at, dt=0.5, num=8):
    """Constant deceleration from ``speed`` to a stop after ``stop_at`` metres."""
    return straight(speed, -speed**2 / (2 * stop_at), dt=dt, num=num)


def arc(speed, radius, dt=0.5, num=8):
    """(num, 3) poses on a left circle of ``radius`` at constant ``speed``."""
    ang = speed * np.arange(1, num + 1) * dt / radius
    return np.stack([radius * np.sin(ang), radius * (1 - np.cos(ang)), ang], -1)


def crossing(x, y_start, vy, first=0, kind=AgentType.PEDESTRIAN):
    """A pedestrian (0.6 x 0.6 m) crossing the road at x, from y_start at vy, present from ``first``."""
    track = agent_track(x, y_start, heading=np.pi / 2 if vy > 0 else -np.pi / 2, speed=abs(vy), length=0.6,
                        width=0.6, height=1.8, agent_type=int(kind))
    track.valid = np.arange(NUM_OBS_STEPS) >= first
    return track


def scenes() -> list[tuple[str, str, SceneSpec, np.ndarray, np.ndarray, dict]]:
    """(token, description, spec, trajectory (8, 3), PDM-Closed plan (40, 3), expected)."""
    out = []

    def add(token, text, spec, trajectory, plan, **expected):
        out.append((token, text, spec, np.asarray(trajectory, np.float64), np.asarray(plan, np.float64), expected))

    ok = dict(nc=1.0, dac=1.0, ttc=1.0, comfort=1.0)
    s = road()
    add("clear-road", "empty two-lane road, the ego keeps 10 m/s in its lane", s, straight(10), straight(10, dt=0.1, num=40),
        pdms=1.0, epdms=1.0, **ok)
    s = road()
    add_agent(s, x=30.0, y=0.15)
    add("parked-car-hit", "a parked car 30 m ahead in the ego lane; the ego does not brake", s, straight(10),
        braking_to(10, 22, 0.1, 40), nc=0.0, pdms=0.0)
    s = road()
    add_agent(s, x=40.0, y=0.15)
    add("parked-car-stop", "the same parked car 40 m ahead; the ego stops ~8 m behind it", s, braking_to(10, 25),
        braking_to(10, 25, 0.1, 40), **ok)
    s = road()
    add_static(s, x=30.0, y=0.3, agent_type=int(AgentType.TRAFFIC_CONE))
    add("cone-hit", "a traffic cone in the ego lane; the ego drives through it: NC 0.5", s, straight(10),
        straight(10, lateral=LANE, dt=0.1, num=40), nc=0.5)
    s = road(speed=6.0)
    add_agent(s, x=-9.0, y=0.1, speed=14.0)
    add("rear-ended", "a fast car from behind runs into the ego: not the ego's fault", s, straight(6),
        straight(6, dt=0.1, num=40), nc=1.0, dac=1.0)
    s = road()
    add("off-road-right", "the ego swerves 4 m right, off the roadblock", s, straight(10, lateral=-4.0),
        straight(10, dt=0.1, num=40), dac=0.0, nc=1.0, pdms=0.0)
    s = road()
    add_agent(s, x=30.0, y=0.1, speed=4.0)
    add("lane-change-left", "a slow car ahead; the ego changes into the free left lane (PDMS 1; NAVSIM v2's "
        "lane keeping fails: over 2 s more than 0.5 m from the route centreline)", s,
        straight(10, lateral=LANE), straight(10, lateral=LANE, dt=0.1, num=40), pdms=1.0, ddc=1.0, lk=0.0,
        epdms=0.875, **ok)
    s = road(lanes=1, oncoming=True)
    add("wrong-way", "the ego drives along the oncoming lane (not on its route)", s, straight(10, lateral=LANE),
        straight(10, dt=0.1, num=40), ddc=0.0, nc=1.0, dac=1.0)
    s = road()
    red = np.ones(NUM_OBS_STEPS, bool)
    s.lanes.append(LaneSpec(vertices=strip(30, 40, -LANE / 2, LANE / 2, 2),
                            centerline=np.stack([np.linspace(30, 40, 8), np.zeros(8)], -1), kind=1, on_route=True,
                            red_light=red))
    add("red-light-run", "a red on-route lane connector 30-40 m ahead; the ego drives through", s, straight(10),
        braking_to(10, 26, 0.1, 40), tlc=0.0, epdms=0.0, nc=1.0)
    s = road()
    s.lanes.append(LaneSpec(vertices=strip(30, 40, -LANE / 2, LANE / 2, 2),
                            centerline=np.stack([np.linspace(30, 40, 8), np.zeros(8)], -1), kind=1, on_route=True,
                            red_light=red))
    add("red-light-stop", "the same red light; the ego stops before it", s, braking_to(10, 22),
        braking_to(10, 22, 0.1, 40), tlc=1.0, **ok)
    s = road()
    add("hard-brake", "an empty road; the ego brakes at ~12 m/s^2 for nothing", s, braking_to(12, 6),
        straight(10, dt=0.1, num=40), comfort=0.0, nc=1.0, dac=1.0)
    s = road(speed=6.0)
    s.drivable.append(PolygonSpec(strip(-40.0, 160.0, -60.0, 60.0, 2), kind=int(PolygonType.ROADBLOCK)))
    add("sharp-turn", "a wide drivable area; the ego circles left with a 5 m radius at 6 m/s (yaw rate 1.2 rad/s)",
        s, arc(6, 5), straight(6, dt=0.1, num=40), comfort=0.0, dac=1.0, nc=1.0)
    s = road()
    add("half-speed", "an empty road; the ego brakes gently to a stop after 20 m, half PDM-Closed's 40 m", s,
        braking_to(10, 20), straight(10, dt=0.1, num=40), ep_range=(0.4, 0.6), nc=1.0, dac=1.0)
    s = road(speed=0.0)
    add("standing-still", "the ego stands still while PDM-Closed drives off", s, np.zeros((8, 3)),
        straight(0, accel=2.0, dt=0.1, num=40), ep=0.0, nc=1.0, dac=1.0, ttc=1.0)
    s = road()
    s.agents.append(crossing(22.0, -4.6, 2.5))  # in front of the bumper when it arrives (~1.8 s)
    add("pedestrian-hit", "a pedestrian crosses the ego lane from the right at 2.5 m/s; the ego keeps going", s,
        straight(10), braking_to(10, 15, 0.1, 40), nc=0.0)
    s = road()
    s.agents.append(crossing(8.0, -6.0, 2.5, first=20))
    add("pedestrian-behind", "a pedestrian crosses 8 m ahead after the ego has passed", s, straight(10),
        straight(10, dt=0.1, num=40), **ok)
    s = road()
    s.drivable[0].holes = [np.array([[20.0, 2.5], [45.0, 2.5], [45.0, 5.0], [20.0, 5.0]])]
    add("island-in-left-lane", "a hole (island) in the roadblock over the left lane; the ego changes into it", s,
        straight(10, lateral=LANE), straight(10, dt=0.1, num=40), dac=0.0, nc=1.0)
    s = road()
    s.drivable.append(PolygonSpec(strip(-10.0, 60.0, -15.0, -LANE / 2, 4), kind=int(PolygonType.CARPARK)))
    add("into-car-park", "a car park to the right of the road; the ego turns into it", s,
        straight(8, lateral=-7.0), straight(10, dt=0.1, num=40), dac=1.0, nc=1.0)
    s = road()
    add("car-park-absent", "the same manoeuvre without the car park: off-road", s, straight(8, lateral=-7.0),
        straight(10, dt=0.1, num=40), dac=0.0)
    s = road()
    add_agent(s, x=25.0 + 2.25, y=0.15)
    add("stop-too-close", "a parked car 25 m ahead; the ego stops 2 m behind it: no collision, but its 0.9 s "
        "projection reaches the car (TTC)", s, braking_to(10, 25 - 2 - 4.049), braking_to(10, 12, 0.1, 40),
        ttc=0.0, nc=1.0)
    return out


def origin(i: int) -> np.ndarray:
    """A UTM-sized, rotated t0 pose for scene i."""
    return np.array([400_000.0 + 1_000.0 * i + 0.125, 5_000_000.0 + 500.0 * i + 0.375, -3.0 + 0.31 * i])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args(argv)
    records, trajectories, expected = [], [], {}
    for i, (token, text, spec, trajectory, plan, exp) in enumerate(scenes()):
        spec.command = 1
        scene = spec.build(scene_id=i, sizes=SIZES)
        records.append(scene_record(scene, origin(i), token, reference=plan))
        trajectories.append({"token": token, "poses": np.round(trajectory, 6).tolist(), "dt": 0.5})
        expected[token] = {"description": text, "expected": exp}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_scene_file(args.out_dir / "example_scenes.json.gz", records)
    (args.out_dir / "example_trajectories.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trajectories))
    (args.out_dir / "example_expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(f"wrote {len(records)} scenes to {args.out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
