"""Scenario library invariants: structure, determinism by key, and the safety contract
(accident-prone: the silent baseline collides in most seeds; safe: it does not), plus the
rule-based baseline and the runner's records."""

import jax
import numpy as np
import pytest

from jax_drive.coop import baselines, runner
from jax_drive.sim import scenarios as S
from jax_drive.sim.state import Behaviour, Role, SimConfig

AP_SEEDS = (0, 1, 2)
SAFE_SEEDS = (10, 11)


@pytest.mark.parametrize("name", S.SCENARIOS)
def test_structure_and_determinism(name):
    a = S.build(name, jax.random.key(0), accident_prone=True, background=True)
    b = S.build(name, jax.random.key(0), accident_prone=True, background=True)
    c = S.build(name, jax.random.key(1), accident_prone=True, background=True)
    np.testing.assert_array_equal(np.asarray(a.x), np.asarray(b.x))
    first = lambda sc: np.stack([np.asarray(sc.x)[:3], np.asarray(sc.y)[:3], np.asarray(sc.speed)[:3]])  # noqa: E731
    assert not np.allclose(first(a), first(c))  # the key randomises the layout
    valid = np.asarray(a.valid)
    role, beh = np.asarray(a.role)[valid], np.asarray(a.behaviour)[valid]
    reward = np.asarray(a.reward)[valid]
    assert (role == Role.FOCAL).sum() >= (2 if name != "tv_overtake_perception" else 2)
    assert reward.sum() >= 1 and np.all(role[reward] == Role.FOCAL)
    assert np.all(beh[reward] == Behaviour.POLICY)
    # every agent starts on its lane, inside the map, not overlapping anyone
    from jax_drive.sim import core

    cfg = SimConfig()
    st = core.step(cfg, a, core.reset(cfg, jax.random.key(0), a), core.go_action(cfg, a))
    assert int(np.asarray(st.collision_step)[valid].max()) == -1
    assert int(np.asarray(st.offroad_steps)[valid].max()) == 0
    # background flag adds traffic
    plain = S.build(name, jax.random.key(0), accident_prone=True, background=False)
    assert int(np.asarray(plain.valid).sum()) <= int(valid.sum())
    if name in ("ic_straight_straight", "lm_highway_merge", "tv_highway_exit", "lc_highway_change"):
        assert int(np.asarray(plain.valid).sum()) < int(valid.sum())


def test_chaos_has_six_to_eight_egos():
    counts = {int((np.asarray(S.build("ic_chaos", jax.random.key(k)).reward)).sum()) for k in range(8)}
    assert counts <= {6, 7, 8} and len(counts) >= 2


def test_unknown_scenario_rejected():
    with pytest.raises(ValueError, match="unknown scenario"):
        S.build("nope", jax.random.key(0))


def _collided(results):
    return [any(o.outcome == "collision" for o in r.outcomes) for r in results]


@pytest.fixture(scope="module")
def silent_runs():
    names, keys, flags = [], [], []
    for name in S.SCENARIOS:
        for s in AP_SEEDS:
            names.append(name), keys.append(jax.random.key(s)), flags.append(True)
        for s in SAFE_SEEDS:
            names.append(name), keys.append(jax.random.key(s)), flags.append(False)
    results, _ = runner.run_episodes(names, keys, accident_prone=flags, policy=baselines.SilentPolicy(),
                                     max_time=25.0)
    return names, flags, results


@pytest.mark.slow
@pytest.mark.parametrize("name", S.SCENARIOS)
def test_accident_prone_collides_and_safe_does_not_for_silent(silent_runs, name):
    names, flags, results = silent_runs
    ap = [c for n, f, c in zip(names, flags, _collided(results)) if n == name and f]
    safe = [c for n, f, c in zip(names, flags, _collided(results)) if n == name and not f]
    assert sum(ap) >= 2, f"{name}: accident-prone collisions {ap}"
    assert not any(safe), f"{name}: safe collisions {safe}"


@pytest.mark.slow
def test_rule_based_avoids_accidents_with_messages_and_records():
    names = ["tv_red_light", "tv_overtake_perception", "tv_highway_merge", "ic_straight_left"]
    results, trs = runner.run_episodes(names, [jax.random.key(0)] * 4, accident_prone=True,
                                       policy=baselines.RuleBasedPolicy(), record=True, keep_trajectory=True,
                                       max_time=40.0)
    assert not any(_collided(results)), [r.feedback for r in results]
    assert all(r.messages_sent > 0 and r.bytes_sent > 0 for r in results)
    assert sum(o.outcome == "success" for r in results for o in r.outcomes) >= 5  # of 6 reward agents
    # replay records: captions, commands, retro labels
    assert trs and all(t.observation.startswith("You are Vehicle") for t in trs)
    assert {t.outcome for t in trs if t.outcome} <= {"success", "collision", "timeout"}
    red = [t for t in trs if t.scenario == "tv_red_light" and t.vehicle_id == 109]
    assert any("Messages received" in t.observation for t in red)
    assert red[0].next_observation == red[1].observation
    # rendering
    from jax_drive.coop.render import render_episode

    import tempfile, os

    with tempfile.TemporaryDirectory() as d:
        path = render_episode(results[0], os.path.join(d, "ep.png"))
        assert os.path.getsize(path) > 10_000
    # A storyboard drawn from the live result and from its story read back from JSON is the
    # same drawing: same panels, titles, message lines and plotted vehicle boxes.
    import json

    from jax_drive.coop.render import episode_story, render_storyboard

    story = json.loads(json.dumps(episode_story(results[0], "ep0")))
    assert story["messages"] and story["messages_sent"] == results[0].messages_sent
    figures = [render_storyboard(results[0], panels=3), render_storyboard(story, panels=3)]
    drawn = [[(ax.get_title(), [t.get_text() for t in ax.texts], len(ax.patches), len(ax.lines))
              for ax in fig.axes] for fig in figures]
    assert drawn[0] == drawn[1] and len(drawn[0]) == 3
    assert any(n_boxes > 0 for _, _, n_boxes, _ in drawn[0])
    assert any(any(":" in t for t in texts[-1:]) for _, texts, _, _ in drawn[0])  # a message line
    # A record saved before the policy and message counts were stored (a 'method' instead), and
    # an episode without any vehicle, still draw.
    old = {k: v for k, v in story.items() if k not in ("policy", "messages_sent", "bytes_sent")}
    fig = render_storyboard({**old, "method": "rule_based"}, panels=2)
    assert "rule_based" in fig.get_suptitle()
    empty = {**story, "poses": [[] for _ in story["poses"]], "role": [], "vehicle_id": [], "length": [],
             "width": [], "messages": []}
    assert all(len(ax.patches) == 0 for ax in render_storyboard(empty, panels=2).axes)
    with tempfile.TemporaryDirectory() as d:
        assert os.path.getsize(render_episode(old, os.path.join(d, "old.png"))) > 10_000
    # model text is drawn as written: dollar signs in a message are not TeX (a sampled message
    # once stopped a smoke run at its storyboard)
    odd = {**story, "messages": [[0.0, 197, "u:ii&&&(bb$$EEE"], [0.0, 198, "go $x^$ now"]]}
    fig = render_storyboard(odd, panels=2)
    with tempfile.TemporaryDirectory() as d:
        fig.savefig(os.path.join(d, "odd.png"))
        assert os.path.getsize(render_episode(odd, os.path.join(d, "odd_ep.png"))) > 10_000
    # what matplotlib will show: every line plain text, equal to the message as written
    from matplotlib.cbook import is_math_text

    from jax_drive.coop.render import as_written

    shown = [t._preprocess_math(line) for ax in fig.axes for t in ax.texts for line in t.get_text().split("\n")]
    assert not any(math for _, math in shown) and any(s.endswith("197: u:ii&&&(bb$$EEE") for s, _ in shown)
    for text in ("a $x^$ b", r"costs \$5", "$$"):
        assert not is_math_text(as_written(text))
