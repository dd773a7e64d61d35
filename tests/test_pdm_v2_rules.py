"""NAVSIM v2's rules, each on a hand-computed case, in the JAX scorer and the numpy reference.

One batch of small scenes (the two-lane road of tests/pdm_scenes.py), two proposals each
(straight on at 10 m/s; braking to a stop within 20 m), scored twice: with NAVSIM v2.2's
conventions (``PDMConfig(navsim_version="2")``) and with every convention switched to the
other choice. Expected values are worked out in the comments; the reference
(``jax_drive.pdm_reference.v2``) must give the same numbers on its own.
"""

from __future__ import annotations

from types import SimpleNamespace

import jax
import numpy as np
import pytest
from pdm_scenes import braking_poses, moving_agent, road_scene, straight_poses

from jax_drive.pdm import PDMConfig, score_proposals, two_frame_extended_comfort, with_extended_comfort
from jax_drive.pdm.comfort import is_comfortable_v2
from jax_drive.pdm_reference import as_reference_config, scene_to_numpy
from jax_drive.pdm_reference.v2 import ReferenceScorerV2
from jax_drive.pdm_reference.v2 import two_frame_extended_comfort as reference_ec
from jax_drive.scenes.builders import history_from_motion, stack_scenes
from jax_drive.types import NUM_HISTORY_STEPS, AgentType

V2 = PDMConfig(navsim_version="2")
OTHER = PDMConfig(navsim_version="2", t0_overlap="keep", human_penalty_filter=False, hc_acceleration="rigid_body",
                  hc_history_dynamics="finite_difference", ec_without_previous="one")
D = 1.461  # rear axle to box centre
H = NUM_HISTORY_STEPS
STRAIGHT = straight_poses(10.0)
PROPOSALS = np.stack([STRAIGHT, braking_poses(10.0, 20.0)])
REFERENCE = straight_poses(10.0, num=40, dt=0.1)


def _parked(x, y, agent_type=AgentType.VEHICLE, length=4.5, width=2.0):
    return moving_agent(x, y, length=length, width=width, agent_type=agent_type)


def _history(ax=0.0, yaw_rate=0.0, t0_yaw_rate=None):
    """A straight past at 10 m/s with the given logged acceleration and past yaw rate (t0's
    ``t0_yaw_rate``, default the same)."""
    poses, velocity, _ = history_from_motion(10.0, 0.0)
    rate = np.full(H, yaw_rate)
    rate[-1] = yaw_rate if t0_yaw_rate is None else t0_yaw_rate
    return {"history_poses": poses, "history_velocity": velocity, "history_acceleration": np.tile([ax, 0.0], (H, 1)),
            "history_yaw_rate": rate, "history_yaw_accel": np.zeros(H)}


SCENES = {
    # a parked car beside the ego's rear half at t0 (its box reaches y = 0.8 < 1.1485)
    "t0_overlap": dict(agents=[_parked(0.0, 1.8)]),
    # every past state accelerates at 3.5 m/s^2 > 2.40: history comfort fails
    "bad_history": _history(ax=3.5),
    "no_history": dict(_history(ax=3.5), history_valid=False),
    # straight past (finite differences: yaw rate 0) whose states log 1.2 rad/s (t0: 0): read,
    # the shifted a_x would be 0.5 + 1.461 * 1.2^2 = 2.604 > 2.40; NAVSIM's interpolated past
    # states carry no yaw rate, so it reads 0.5 (test_past_yaw_dynamics_by_hand)
    "logged_yaw": _history(ax=0.5, yaw_rate=1.2, t0_yaw_rate=0.0),
    # a parked car 30 m ahead in the lane; the human drives straight into it
    "human_hits_car": dict(agents=[_parked(30.0, 0.0)], expert=STRAIGHT, expert_valid=True),
    "synthetic": dict(agents=[_parked(30.0, 0.0)], expert=STRAIGHT, expert_valid=False),
    # a cone ahead: the human's NC is 0.5 (not filtered), its TTC 0 (filtered)
    "human_hits_cone": dict(agents=[_parked(30.0, 0.0, AgentType.TRAFFIC_CONE, 0.5, 0.5)], expert=STRAIGHT,
                            expert_valid=True),
}
NAMES = list(SCENES)


@pytest.fixture(scope="module")
def scenes():
    return stack_scenes([road_scene(scene_id=i, **SCENES[name]) for i, name in enumerate(NAMES)])


@pytest.fixture(scope="module")
def results(scenes):
    props = np.broadcast_to(PROPOSALS, (len(NAMES),) + PROPOSALS.shape)
    ref = np.broadcast_to(REFERENCE, (len(NAMES),) + REFERENCE.shape)
    return {cfg: jax.tree.map(np.asarray, score_proposals(scenes, props, ref, cfg)) for cfg in (V2, OTHER)}


def _row(result, name, proposal=0):
    i = NAMES.index(name)
    return {k: float(getattr(result, k)[i, proposal]) for k in ("nc", "dac", "ddc_v2", "tlc", "ttc_v2", "lk", "hc",
                                                               "ep_v2", "epdms")}


# (scene, config, proposal) -> expected values of the straight proposal.
EXPECTED = {
    ("t0_overlap", "v2"): {"nc": 1.0, "epdms": 1.0},  # the car is dropped (LogReplayTrafficAgents)
    ("t0_overlap", "other"): {"nc": 0.0, "epdms": 0.0},  # kept: a stopped track hit by a moving ego
    ("bad_history", "v2"): {"hc": 0.0, "epdms": 12 / 14},  # EC left out: (5 + 5 + 2 + 0) / 14
    ("bad_history", "other"): {"hc": 0.0, "epdms": 14 / 16},  # EC = 1: (5 + 5 + 2 + 0 + 2) / 16
    ("no_history", "v2"): {"hc": 1.0, "epdms": 1.0},
    ("no_history", "other"): {"hc": 1.0, "epdms": 1.0},
    ("logged_yaw", "v2"): {"hc": 1.0, "epdms": 1.0},
    ("logged_yaw", "other"): {"hc": 1.0, "epdms": 1.0},
    ("human_hits_car", "v2"): {"nc": 1.0, "ttc_v2": 1.0, "epdms": 1.0},  # both filtered
    ("human_hits_car", "other"): {"nc": 0.0, "epdms": 0.0},
    ("synthetic", "v2"): {"nc": 0.0, "epdms": 0.0},  # no human trajectory: no filter
    # NC 0.5 stays; TTC filtered; both masked progresses are 40 * 0.5 = 20 > 5 m, EP = 1
    ("human_hits_cone", "v2"): {"nc": 0.5, "ttc_v2": 1.0, "ep_v2": 1.0, "epdms": 0.5},
    ("human_hits_cone", "other"): {"nc": 0.5, "ttc_v2": 0.0, "epdms": 0.5 * (5 + 0 + 2 + 2 + 2) / 16},
}


@pytest.mark.parametrize("case", sorted(EXPECTED), ids=lambda c: f"{c[0]}-{c[1]}")
def test_v2_rule_jax(results, case):
    name, which = case
    row = _row(results[V2 if which == "v2" else OTHER], name)
    for key, want in EXPECTED[case].items():
        assert row[key] == pytest.approx(want, abs=1e-6), (key, row)


@pytest.mark.parametrize("case", sorted(EXPECTED), ids=lambda c: f"{c[0]}-{c[1]}")
def test_v2_rule_reference(scenes, results, case):
    """The reference gets the hand-computed values, and agrees with JAX on both proposals."""
    name, which = case
    cfg = V2 if which == "v2" else OTHER
    scorer = ReferenceScorerV2(scene_to_numpy(scenes, NAMES.index(name)), cfg)
    for p in range(len(PROPOSALS)):
        ref = scorer.score(PROPOSALS[p], REFERENCE)
        mine = _row(results[cfg], name, p)
        for key in ("nc", "dac", "ddc", "tlc", "ttc", "lk", "hc", "ep", "epdms"):
            jax_key = {"ddc": "ddc_v2", "ttc": "ttc_v2", "ep": "ep_v2"}.get(key, key)
            assert ref[key] == pytest.approx(mine[jax_key], abs=1e-4), (p, key)
    ref = scorer.score(PROPOSALS[0], REFERENCE)
    for key, want in EXPECTED[case].items():
        key = {"ddc_v2": "ddc", "ttc_v2": "ttc", "ep_v2": "ep"}.get(key, key)
        assert ref[key] == pytest.approx(want, abs=1e-6), key


def test_braking_before_the_car(results):
    """The braking proposal's front stops at 20 + 4.05 m, short of the car's rear at 27.75 m:
    NC 1 without the filter; the reference drives into the car (masked progress 0), so
    EP = 20 / 20 = 1."""
    for cfg in (V2, OTHER):
        row = _row(results[cfg], "human_hits_car", proposal=1)
        assert row["nc"] == 1.0 and row["ep_v2"] == pytest.approx(1.0)


@pytest.mark.parametrize("dynamics, past, start", [
    ("navsim", 0.0, 0.7),  # the past states' 0, t0's logged
    ("logged", 1.2, 0.7),  # every state's logged value
    ("finite_difference", 0.0, 0.0),  # gradient of the (straight) past headings, t0's 0
])
def test_past_yaw_dynamics_by_hand(dynamics, past, start):
    """The yaw rates history comfort shifts the past accelerations with, and the one the
    simulation starts from, for a straight past logging 1.2 rad/s and t0 logging 0.7 rad/s."""
    from jax_drive.pdm.scorer import _history_states, _simulation_scene
    from jax_drive.pdm.tracker import initial_state
    from jax_drive.pdm_reference.v2 import past_states, start_state

    scene = road_scene(**_history(ax=0.5, yaw_rate=1.2, t0_yaw_rate=0.7))
    cfg = PDMConfig(navsim_version="2", hc_history_dynamics=dynamics)
    np.testing.assert_allclose(np.asarray(_history_states(scene, cfg)["yaw_rate"]), past, atol=1e-6)
    assert float(initial_state(_simulation_scene(scene, cfg), ())["yaw_rate"]) == pytest.approx(start)
    numpy_scene, reference_cfg = scene_to_numpy(scene), as_reference_config(cfg)
    np.testing.assert_allclose(past_states(numpy_scene, np.zeros(3), reference_cfg)[:, 9], past, atol=1e-12)
    assert start_state(numpy_scene, np.zeros(3), reference_cfg)[9] == pytest.approx(start)


def test_shifted_acceleration_by_hand():
    """a_x 2.0, yaw rate 0.3, yaw acceleration 0.2 held constant (S-G of a constant is the
    constant): shifted 2.0 + 1.461 * (0.09 + 0.2) = 2.424 > 2.40 fails; rigid body
    2.0 - 0.09 * 1.461 = 1.869 and a_y 0.2 * 1.461 = 0.292 pass."""
    t = np.arange(55) * 0.1
    sig = [np.full(55, 2.0), np.zeros(55), 0.3 * t, np.full(55, 0.3), np.full(55, 0.2)]
    shifted = is_comfortable_v2(*sig, V2)
    rigid = is_comfortable_v2(*sig, OTHER)
    assert float(shifted) == 0.0 and float(rigid) == 1.0
    assert 2.0 + D * (0.09 + 0.2) > 2.40 > 2.0 - 0.09 * D


def _trajectory(ax=0.0, yaw_rate=0.0, n=41):
    t = np.arange(n) * 0.1
    return SimpleNamespace(ax=np.full(n, ax, np.float32), ay=np.zeros(n, np.float32),
                           heading=(yaw_rate * t).astype(np.float32))


def _states(traj):
    states = np.zeros((traj.ax.shape[0], 11))
    states[:, 2], states[:, 5], states[:, 6] = traj.heading, traj.ax, traj.ay
    return states


@pytest.mark.parametrize("previous, want", [
    (dict(), 1.0),  # identical features: RMS 0
    (dict(yaw_rate=0.3), 0.0),  # yaw rate differs by 0.3 > 0.1 rad/s at every step
    (dict(yaw_rate=0.05), 1.0),  # 0.05 <= 0.1
    (dict(ax=1.0), 0.0),  # acceleration magnitude differs by 1.0 > 0.7
    (dict(ax=0.5), 1.0),  # 0.5 <= 0.7, jerk 0
])
def test_two_frame_extended_comfort_by_hand(previous, want):
    cur, prev = _trajectory(), _trajectory(**previous)
    assert float(two_frame_extended_comfort(cur, prev, V2)) == want
    assert reference_ec(_states(cur), _states(prev), V2) == want


def test_epdms_with_a_previous_frame_uses_all_five_weights(results):
    base = jax.tree.map(lambda a: a[NAMES.index("bad_history")][:1], results[V2])  # HC 0, the rest 1
    assert float(with_extended_comfort(base, 1.0, V2).epdms[0]) == pytest.approx(14 / 16)
    assert float(with_extended_comfort(base, 0.0, V2).epdms[0]) == pytest.approx(12 / 16)
    assert float(base.epdms[0]) == pytest.approx(12 / 14)


def test_version_defaults():
    assert (V2.t0_overlap, V2.human_penalty_filter) == ("drop", True)
    v1 = PDMConfig()
    assert (v1.t0_overlap, v1.human_penalty_filter) == ("keep", False)
    with pytest.raises(ValueError, match="navsim_version"):
        PDMConfig(navsim_version="3")
    with pytest.raises(ValueError, match="hc_acceleration"):
        PDMConfig(hc_acceleration="centre")
