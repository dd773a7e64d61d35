"""Held-out scenario variations (:mod:`jax_drive.sim.variations`): every length and speed of a
built scenario scaled, nothing else; the accident-prone timing kept (the silent baseline
meets the same outcomes episode by episode); episode specs carry the variation in their tag."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jax_drive.coop.baselines import make_policy
from jax_drive.coop.learning import EpisodeSpec, episode_specs, run_specs
from jax_drive.sim import metrics as M
from jax_drive.sim import scenarios as S
from jax_drive.sim.variations import scale_world

LENGTHS = ("x", "y", "goal_arc", "route_length", "lc_arc")
SPEEDS = ("speed", "cruise_speed")
UNCHANGED = ("heading", "length", "width", "valid", "lane", "goal_lane", "role", "reward", "behaviour", "vehicle_id",
             "kind", "timeout", "accident_prone", "scenario_id", "obeys_lights", "transceiver")


@pytest.mark.parametrize("name", ["tv_overtake_perception", "tv_red_light", "tv_highway_merge"])
def test_scale_multiplies_lengths_and_speeds_and_keeps_the_rest(name):
    key = jax.random.key(3)
    nominal = S.build(name, key)
    assert S.build(name, key, variation="nominal") is not nominal and scale_world(nominal, 1.0) is nominal
    scaled = S.build(name, key, variation="scale1.3")
    valid = np.asarray(nominal.valid)
    for field in LENGTHS + SPEEDS:
        a, b = np.asarray(getattr(nominal, field)), np.asarray(getattr(scaled, field))
        np.testing.assert_allclose(b[valid], 1.3 * a[valid], rtol=1e-6, err_msg=field)
    for field in UNCHANGED:
        np.testing.assert_array_equal(np.asarray(getattr(scaled, field)), np.asarray(getattr(nominal, field)), field)
    np.testing.assert_array_equal(np.asarray(scaled.x)[~valid], np.asarray(nominal.x)[~valid])  # padding stays far
    lanes, lanes1 = nominal.lanes, scaled.lanes
    live = np.asarray(lanes.valid)
    np.testing.assert_allclose(np.asarray(lanes1.points)[live], 1.3 * np.asarray(lanes.points)[live], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(lanes1.points)[~live], np.asarray(lanes.points)[~live])
    np.testing.assert_allclose(np.asarray(lanes1.speed_limit), 1.3 * np.asarray(lanes.speed_limit), rtol=1e-6)
    stop, stop1 = np.asarray(lanes.stop_arc), np.asarray(lanes1.stop_arc)
    real = np.abs(stop) < 1e3
    np.testing.assert_allclose(stop1[real], 1.3 * stop[real], rtol=1e-6)
    np.testing.assert_array_equal(stop1[~real], stop[~real])  # "no stop line" stays a sentinel


def test_the_silent_baseline_meets_the_nominal_outcomes_in_the_scaled_world():
    """Arrival times are kept, so who collides without talking is the same, episode by episode."""
    scenarios = ("tv_overtake_perception", "tv_red_light", "tv_left_turn", "tv_highway_exit")
    outcomes = {}
    for variation in ("nominal", "scale1.3"):
        results, _ = run_specs(episode_specs(scenarios, [0], 2, variation=variation), make_policy("silent"))
        outcomes[variation] = [[o.outcome for o in r.outcomes] for r in results]
    assert outcomes["scale1.3"] == outcomes["nominal"]
    assert M.COLLISION in sum(outcomes["nominal"], []) and M.SUCCESS in sum(outcomes["nominal"], [])


def test_episode_specs_name_their_variation():
    spec = EpisodeSpec("tv_red_light", 1, 2, "eval", "scale0.75")
    assert spec.tag == "tv_red_light/eval/seed1/2/scale0.75"
    assert EpisodeSpec("tv_red_light", 1, 2).tag == "tv_red_light/eval/seed1/2"  # nominal tags unchanged
    assert np.array_equal(jax.random.key_data(spec.key()), jax.random.key_data(EpisodeSpec("tv_red_light", 1, 2).key()))
    with pytest.raises(ValueError, match="variation"):
        EpisodeSpec("tv_red_light", 1, 2, "eval", "scale9")
    with pytest.raises(ValueError, match="choose one of nominal, scale0.75, scale1.3"):
        S.build("tv_red_light", jax.random.key(0), variation="huge")
