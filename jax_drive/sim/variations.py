"""Held-out scenario variations: the same layouts in a world scaled outside the training ranges.

A variation multiplies every length of a built :class:`~jax_drive.sim.state.Scenario` (lane
geometry and widths, start positions, stop lines, goals, lane-change windows) and every
speed (start speeds, cruise speeds, speed limits) by one factor ``s``. Arrival times at the
conflict points are therefore those of the nominal episode (distance / speed is unchanged),
so accident-prone episodes stay accident-prone and safe ones safe, while speeds, gaps and
geometry all leave the training ranges (the builders jitter them by about +-0.5 m/s and
+-3 m). What does not scale is the driving itself: vehicle sizes, accelerations and braking
(stopping distance grows as s^2), the IDM's gaps, sensing and radio ranges. A policy that
learnt the nominal numbers meets speeds and distances it has never read.

Names (:data:`VARIATIONS`): ``nominal`` (s = 1, the training distribution), ``scale0.75``,
``scale1.3`` and ``scale1.5``. A variation is either held out (evaluated, never trained on)
or a training world of its own (coop-RL's ``train.variation``: episodes where a start policy
distilled on nominal episodes still fails), never both in one run.
"""

from __future__ import annotations

import jax.numpy as jnp

from jax_drive.sim.state import Scenario

VARIATIONS: dict[str, float] = {"nominal": 1.0, "scale0.75": 0.75, "scale1.3": 1.3, "scale1.5": 1.5}
# Sentinels above this magnitude (no stop line, no lane-change deadline, padding) stay as they are.
_SENTINEL = 1e3


def variation_scale(name: str) -> float:
    """The world scale of a variation name; ValueError names the choices."""
    if name not in VARIATIONS:
        raise ValueError(f"unknown scenario variation {name!r}; choose one of {', '.join(VARIATIONS)}")
    return VARIATIONS[name]


def check_held_out(names) -> None:
    """ValueError unless ``names`` are distinct held-out variations (nominal is always evaluated,
    so it is not one of them): the check of every preset's ``eval_variations``."""
    held_out = [v for v in VARIATIONS if v != "nominal"]
    if len(set(names)) != len(names) or set(names) - set(held_out):
        raise ValueError(f"eval_variations must be distinct names among {held_out} (nominal is always "
                         f"evaluated), got {list(names)}")


def _scaled(x, s: float):
    """``x * s`` where ``|x|`` is a real length, sentinels kept."""
    return jnp.where(jnp.abs(x) < _SENTINEL, x * s, x)


def scale_world(scenario: Scenario, s: float) -> Scenario:
    """``scenario`` with every length and every speed multiplied by ``s`` (module docstring).

    Shapes are those of ``scenario`` (batched or not); padded agents and dummy lanes keep
    their far-away sentinels. ``s == 1`` returns ``scenario`` itself.
    """
    if s == 1.0:
        return scenario
    if not s > 0:
        raise ValueError(f"a world scale must be > 0, got {s}")
    lanes = scenario.lanes
    valid_lane = lanes.valid[..., None, None]
    lanes = lanes.replace(points=jnp.where(valid_lane, lanes.points * s, lanes.points), width=lanes.width * s,
                          speed_limit=lanes.speed_limit * s, stop_arc=_scaled(lanes.stop_arc, s))
    valid = scenario.valid
    return scenario.replace(
        lanes=lanes,
        x=jnp.where(valid, scenario.x * s, scenario.x), y=jnp.where(valid, scenario.y * s, scenario.y),
        speed=scenario.speed * s, cruise_speed=scenario.cruise_speed * s,
        goal_arc=_scaled(scenario.goal_arc, s), route_length=jnp.where(valid, scenario.route_length * s,
                                                                       scenario.route_length),
        lc_arc=_scaled(scenario.lc_arc, s), lc_end_arc=_scaled(scenario.lc_end_arc, s))
