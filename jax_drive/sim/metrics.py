"""Episode outcomes and metrics (NumPy; computed from final simulator states).

TalkingVehicles (seed, Section 5): over the focal reward-eligible agents of M episodes,
  CR = collisions / (N M), SR = successes / (N M), TR = 1 - SR - CR (stagnation until
  the time limit). Reward +1 success, -1 collision, 0 stagnation.
InterDrive / CARLA leaderboard: per test (episode) over its egos,
  RC = 100 x sum(completed route metres) / sum(route metres),
  IS = product of infraction penalties (vehicle collision 0.6, red light 0.7,
       off-road x (1 - off-road % / 100)),
  DS = RC x IS, SR = share of tests with DS = 100.
Aggregation over seeds: mean and standard error (std with ddof=1 / sqrt(n); 0 for n=1).
"""

from __future__ import annotations

import dataclasses

import numpy as np

SUCCESS, COLLISION, TIMEOUT = "success", "collision", "timeout"
REWARD = {SUCCESS: 1.0, COLLISION: -1.0, TIMEOUT: 0.0}
PENALTY = {
    "pedestrian_collision": 0.5,
    "vehicle_collision": 0.6,
    "static_collision": 0.65,
    "red_light": 0.7,
    "stop_sign": 0.8,
    "scenario_timeout": 0.7,
    "yield_emergency": 0.7,
}


@dataclasses.dataclass
class AgentOutcome:
    """Outcome of one agent in one episode (times in seconds)."""

    index: int
    vehicle_id: int
    outcome: str
    time: float  # success or collision time; episode end for timeouts
    collided_with: int | None = None  # vehicle id
    red_runs: int = 0
    offroad_fraction: float = 0.0
    progress: float = 0.0  # metres along the route
    route_length: float = 1.0

    @property
    def reward(self) -> float:
        return REWARD[self.outcome]

    def feedback(self) -> str:
        """Verbal feedback in the TalkingVehicles style."""
        if self.outcome == COLLISION:
            return f"Vehicle {self.vehicle_id} collided with Vehicle {self.collided_with} after {self.time:.0f} seconds."
        if self.outcome == TIMEOUT:
            return f"Vehicle {self.vehicle_id} stagnated for too long to complete its task."
        return f"Vehicle {self.vehicle_id} reached its destination after {self.time:.0f} seconds."


def agent_outcomes(final: dict, dt: float, end_step: int, indices) -> list[AgentOutcome]:
    """Outcomes of chosen agents from a NumPy snapshot of one episode's final state.

    ``final`` holds (A,) arrays: success_step, collision_step, collision_with,
    vehicle_id, red_runs, offroad_steps, progress, route_length. Collisions win over
    later arrivals; unfinished agents time out.
    """
    out = []
    for i in indices:
        i = int(i)
        cs, ss = int(final["collision_step"][i]), int(final["success_step"][i])
        common = dict(index=i, vehicle_id=int(final["vehicle_id"][i]), red_runs=int(final["red_runs"][i]),
                      offroad_fraction=float(final["offroad_steps"][i]) / max(end_step, 1),
                      progress=float(final["progress"][i]), route_length=float(final["route_length"][i]))
        if 0 <= cs <= end_step and (ss < 0 or cs <= ss):
            other = int(final["collision_with"][i])
            out.append(AgentOutcome(outcome=COLLISION, time=cs * dt,
                                    collided_with=int(final["vehicle_id"][other]) if other >= 0 else None, **common))
        elif 0 <= ss <= end_step:
            out.append(AgentOutcome(outcome=SUCCESS, time=ss * dt, **common))
        else:
            out.append(AgentOutcome(outcome=TIMEOUT, time=end_step * dt, **common))
    return out


def talking_vehicles_rates(outcomes: list[AgentOutcome]) -> dict[str, float]:
    """CR, SR, TR in percent over agent-episodes (focal reward-eligible agents)."""
    n = len(outcomes)
    if n == 0:
        return {"CR": float("nan"), "SR": float("nan"), "TR": float("nan"), "n": 0}
    cr = 100.0 * sum(o.outcome == COLLISION for o in outcomes) / n
    sr = 100.0 * sum(o.outcome == SUCCESS for o in outcomes) / n
    return {"CR": cr, "SR": sr, "TR": 100.0 - cr - sr, "n": n}


def interdrive_episode(outcomes: list[AgentOutcome]) -> dict[str, float]:
    """RC, IS, DS (percent / fraction) and success of one test from its egos' outcomes."""
    if not outcomes:
        raise ValueError("an InterDrive test needs at least one ego")
    total = sum(o.route_length for o in outcomes)
    done = sum(o.route_length if o.outcome == SUCCESS else min(o.progress, o.route_length) for o in outcomes)
    rc = 100.0 * done / max(total, 1e-9)
    score = 1.0
    for o in outcomes:
        if o.outcome == COLLISION:
            score *= PENALTY["vehicle_collision"]
        score *= PENALTY["red_light"] ** o.red_runs
        score *= 1.0 - min(max(o.offroad_fraction, 0.0), 1.0)
    ds = rc * score
    return {"RC": rc, "IS": score, "DS": ds, "success": float(ds >= 100.0 - 1e-6)}


def interdrive_rates(episodes: list[dict[str, float]]) -> dict[str, float]:
    """Means over tests: RC, IS, DS and SR (percent of tests with full DS)."""
    if not episodes:
        return {"RC": float("nan"), "IS": float("nan"), "DS": float("nan"), "SR": float("nan"), "n": 0}
    return {
        "RC": float(np.mean([e["RC"] for e in episodes])),
        "IS": float(np.mean([e["IS"] for e in episodes])),
        "DS": float(np.mean([e["DS"] for e in episodes])),
        "SR": 100.0 * float(np.mean([e["success"] for e in episodes])),
        "n": len(episodes),
    }


def mean_se(values) -> tuple[float, float]:
    """Mean and standard error of the mean (ddof=1; 0 for a single value)."""
    v = np.asarray(list(values), float)
    if v.size == 0:
        return float("nan"), float("nan")
    if v.size == 1:
        return float(v[0]), 0.0
    return float(v.mean()), float(v.std(ddof=1) / np.sqrt(v.size))


def aggregate_seeds(per_seed: list[dict[str, float]], keys) -> dict[str, dict[str, float]]:
    """{key: {"mean", "se"}} across seeds."""
    return {k: dict(zip(("mean", "se"), mean_se(d[k] for d in per_seed))) for k in keys}


def format_table(rows: list[tuple[str, dict[str, dict[str, float]]]], keys) -> str:
    """Plain-text table of aggregated metrics: one row per (label, metrics)."""
    head = f"{'':34s}" + "".join(f"{k:>16s}" for k in keys)
    lines = [head]
    for label, m in rows:
        cells = "".join(f"{m[k]['mean']:9.1f} ± {m[k]['se']:4.1f}" if m[k]["mean"] == m[k]["mean"] else f"{'n/a':>16s}"
                        for k in keys)
        lines.append(f"{label:34s}{cells}")
    return "\n".join(lines)
