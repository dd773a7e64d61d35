"""Metric formulas against hand-computed episodes, feedback text, replay labels/weights,
and the message bus (radius, one-decision delay, 2 s retention, bytes)."""

import numpy as np
import pytest

from jax_drive.sim import metrics as M
from jax_drive.coop.messages import Message, MessageBus
from jax_drive.coop.replay import Transition, label, load_jsonl, sample_batch, sampling_probabilities, save_jsonl


def _snapshot():
    # agents: 0 succeeds at step 100, 1 collides with 2 at step 40, 2 collides, 3 times out
    return {
        "success_step": np.array([100, -1, -1, -1]),
        "collision_step": np.array([-1, 40, 40, -1]),
        "collision_with": np.array([-1, 2, 1, -1]),
        "vehicle_id": np.array([109, 110, 111, 112]),
        "red_runs": np.array([0, 1, 0, 0]),
        "offroad_steps": np.array([0, 0, 0, 50]),
        "progress": np.array([80.0, 30.0, 10.0, 25.0]),
        "route_length": np.array([80.0, 60.0, 40.0, 50.0]),
    }


def test_agent_outcomes_and_feedback():
    outs = M.agent_outcomes(_snapshot(), dt=0.05, end_step=200, indices=[0, 1, 3])
    assert [o.outcome for o in outs] == ["success", "collision", "timeout"]
    assert outs[1].feedback() == "Vehicle 110 collided with Vehicle 111 after 2 seconds."
    assert outs[2].feedback() == "Vehicle 112 stagnated for too long to complete its task."
    assert outs[0].time == pytest.approx(5.0) and outs[0].reward == 1.0 and outs[1].reward == -1.0
    # a collision after the episode ended does not count
    late = M.agent_outcomes(_snapshot(), dt=0.05, end_step=30, indices=[1])
    assert late[0].outcome == "timeout"


def test_talking_vehicles_rates_hand_computed():
    outs = M.agent_outcomes(_snapshot(), dt=0.05, end_step=200, indices=[0, 1, 2, 3])
    r = M.talking_vehicles_rates(outs)
    assert r["CR"] == pytest.approx(50.0) and r["SR"] == pytest.approx(25.0) and r["TR"] == pytest.approx(25.0)
    assert r["n"] == 4


def test_interdrive_episode_hand_computed():
    outs = M.agent_outcomes(_snapshot(), dt=0.05, end_step=200, indices=[0, 1, 2, 3])
    ep = M.interdrive_episode(outs)
    rc = 100.0 * (80 + 30 + 10 + 25) / (80 + 60 + 40 + 50)
    score = 0.6 * 0.7 * 0.6 * (1 - 50 / 200)  # two vehicle collisions, one red light, 25 % off road
    assert ep["RC"] == pytest.approx(rc)
    assert ep["IS"] == pytest.approx(score)
    assert ep["DS"] == pytest.approx(rc * score)
    assert ep["success"] == 0.0
    clean = M.interdrive_episode(M.agent_outcomes(_snapshot(), 0.05, 200, [0]))
    assert clean == {"RC": 100.0, "IS": 1.0, "DS": 100.0, "success": 1.0}
    agg = M.interdrive_rates([ep, clean])
    assert agg["SR"] == pytest.approx(50.0) and agg["DS"] == pytest.approx((rc * score + 100.0) / 2)
    with pytest.raises(ValueError):
        M.interdrive_episode([])


def test_mean_and_standard_error():
    m, se = M.mean_se([10.0, 20.0, 30.0])
    assert m == pytest.approx(20.0) and se == pytest.approx(10.0 / np.sqrt(3))
    assert M.mean_se([5.0]) == (5.0, 0.0)
    agg = M.aggregate_seeds([{"CR": 0.0}, {"CR": 10.0}], ["CR"])
    assert agg["CR"]["mean"] == pytest.approx(5.0) and agg["CR"]["se"] == pytest.approx(5.0)
    assert "CR" in M.format_table([("x", agg)], ["CR"])


def test_replay_labels_and_eq1_weights(tmp_path):
    outs = {o.index: o for o in M.agent_outcomes(_snapshot(), 0.05, 200, [1, 3])}
    trs = [
        Transition(0, "s", 0, 0.0, 1, 110, "obs0", "go", 8.0, "hi", True),
        Transition(0, "s", 1, 0.5, 1, 110, "obs1", "go", 8.0, "", False),
        Transition(0, "s", 2, 1.5, 1, 110, "obs2", "stop", 0.0, "", True),
        Transition(0, "s", 0, 0.0, 3, 112, "o3", "stop", 0.0, "", False),
        Transition(0, "s", 1, 0.5, 3, 112, "o3b", "go", 8.0, "yo", False),
    ]
    label(trs, outs)
    a, b, c, d, e = trs
    assert a.next_observation == "obs1" and b.next_observation == "obs2" and c.next_observation == ""
    assert a.responses == [(112, "yo")]
    # collision at 2.0 s: a (t=0) has ttc 2, b ttc 1.5, c ttc 0.5 with a braking command
    assert a.time_to_collision == pytest.approx(2.0) and a.contributed_to_collision
    assert c.contributed_to_collision is False and c.feedback.startswith("Vehicle 110 collided")
    assert a.weight() == pytest.approx(1 + 2 + 0 + 10)
    assert b.weight() == pytest.approx(1 + 0 + 5 * 0.5 + 10)
    assert c.weight() == pytest.approx(1 + 2 + 5 * 1.5)
    # stagnation: 0.1 x timestep and +2 for braking commands
    assert d.stagnation and d.contributed_to_stagnation and d.weight() == pytest.approx(1 + 0 + 2)
    assert e.weight() == pytest.approx(1 + 0.1 * 1)
    p = sampling_probabilities(trs)
    assert p.sum() == pytest.approx(1.0) and p[0] > p[4]
    assert len(sample_batch(trs, np.random.default_rng(0), 4)) == 4
    path = tmp_path / "r.jsonl"
    save_jsonl(trs, path)
    back = load_jsonl(path)
    assert [t.observation for t in back] == [t.observation for t in trs] and back[0].weight() == a.weight()


def test_message_bus_radius_delay_ttl_and_bytes():
    bus = MessageBus(4, radius=50.0, ttl=2.0)
    pos = np.array([[0.0, 0.0], [30.0, 0.0], [80.0, 0.0], [10.0, 0.0]])
    trx = np.array([True, True, True, False])
    present = np.ones(4, bool)
    bus.deliver(0.0, pos, trx, present)
    bus.post(Message(sender=0, sender_vid=100, time=0.0, text="héllo"))
    assert bus.inbox(1, 0.0) == []  # not before the next decision
    bus.deliver(0.5, pos, trx, present)
    assert [m.text for m in bus.inbox(1, 0.5)] == ["héllo"]
    assert bus.inbox(2, 0.5) == []  # 80 m > radius
    assert bus.inbox(3, 0.5) == []  # no transceiver
    assert bus.inbox(0, 0.5) == []  # not to the sender
    assert bus.texts(1, 1.0) == [(1.0, 100, "héllo")]
    assert bus.bytes_sent == 6 and bus.messages_sent == 1 and bus.bytes_by_agent[0] == 6
    bus.deliver(2.0, pos, trx, present)
    assert len(bus.inbox(1, 2.0)) == 1  # age 2.0 s is kept
    bus.deliver(2.5, pos, trx, present)
    assert bus.inbox(1, 2.5) == []  # expired
    # radius is measured at delivery time
    bus.post(Message(sender=0, sender_vid=100, time=2.5, text="x"))
    moved = pos.copy()
    moved[2] = [40.0, 0.0]
    bus.deliver(3.0, moved, trx, present)
    assert [m.text for m in bus.inbox(2, 3.0)] == ["x"]
    bus.post(Message(sender=1, sender_vid=101, time=3.0, text=""))
    assert bus.messages_sent == 2  # empty messages are not sent
    with pytest.raises(ValueError):
        MessageBus(2, radius=-1.0)
