"""Dataset builders: record structure, RL curation, the data card, the CLI, and the
no-leak property (the expert trajectory never reaches a prompt)."""

import contextlib
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jax_drive.data import builders as B
from jax_drive.data.card import DataCard
from jax_drive.pdm import scorer as pdm_scorer
from jax_drive.scenes import GeneratorConfig, generate_scenes
from jax_drive.text import chat
from jax_drive.text.codec import format_points, format_trajectory, parse_trajectory, quantize
from jax_drive.text.prompts import PromptConfig

# The same generator call as tests/test_scenes.py (24 scenes, default config, typed key):
# the full suite compiles the generator once.
N = 24
GEN = GeneratorConfig()
CONFIG = B.BuildConfig(reference="expert")  # skips the PDM-Closed compile; EP only affects RL categories
TEXT_CONFIG = B.BuildConfig(reference="expert", prompt=PromptConfig(perception="text", image_placeholder=False))
CV = B.ConstantVelocityPredictor()


def _scenes(seed):
    return generate_scenes(jax.random.key(seed), N, GEN)


@pytest.fixture(scope="module")
def scenes():
    return _scenes(0)


def _with_expert(scene, seed):
    """The same scenes with a different (random) expert trajectory."""
    t = (jnp.arange(8) + 1.0) * 0.5
    k1, k2 = jax.random.split(jax.random.key(seed))
    speed = jax.random.uniform(k1, (N, 1), minval=0.0, maxval=15.0)
    bend = jax.random.normal(k2, (N, 1)) * 0.5
    expert = jnp.stack([speed * t, bend * t**2, jnp.broadcast_to(2 * bend * t / jnp.maximum(speed, 1.0), (N, 8))], -1)
    return scene.replace(expert=expert)


def _prompt_part(record):
    msgs = record["messages"]
    return msgs[:-1] if msgs[-1]["role"] == "assistant" else msgs


def test_single_records(scenes):
    records = B.build_single(scenes, CONFIG)
    assert len(records) == N
    expert = np.asarray(scenes.expert)
    for i, r in enumerate(records):
        prompt, target = chat.split_prompt_target(r["messages"])
        assert [m["role"] for m in r["messages"]] == ["user", "assistant"]
        assert target == format_trajectory(expert[i])
        np.testing.assert_allclose(parse_trajectory(target).poses, expert[i], atol=0.0051 + 0.01)
        assert prompt[0]["content"].startswith("<image>\nAs an autonomous driving system")
        json.dumps(r)
    system = B.build_single(scenes, B.BuildConfig(reference="expert", prompt=PromptConfig(system_prompt=True)))
    assert system[0]["messages"][0]["role"] == "system"


def test_multi_records(scenes):
    records, stats = B.build_multi(scenes, CV, jax.random.key(1), CONFIG)
    first = [r for r in records if not r["meta"]["mock"]]
    mock = [r for r in records if r["meta"]["mock"]]
    assert stats["two_turn"] == len(first) and stats["mock"] == len(mock)
    assert stats["first_turn"]["feedback_nonempty"] == len(first)
    assert len(first) >= 1, "hard scenes must make the constant-velocity model fail"
    cv_texts = CV(scenes, None, None)
    ids = [int(i) for i in np.asarray(scenes.scene_id)]
    for r in first:
        m = r["messages"]
        assert [x["role"] for x in m] == ["user", "assistant", "user", "assistant"]
        assert m[1]["content"] == cv_texts[ids.index(r["scene_id"])]
        assert m[2]["content"].startswith("This was your previous trajectory prediction.")
        assert m[3]["content"] == format_trajectory(np.asarray(scenes.expert)[ids.index(r["scene_id"])])
    for r in mock:
        m = r["messages"]
        assert r["meta"]["turns"] >= 3 and len(m) == 2 * r["meta"]["turns"]
        feedbacks = [x["content"] for x in m[2:-1:2]]
        assert all(f.startswith("This was your previous") for f in feedbacks)
        answers = [x["content"] for x in m[1:-1:2]]
        assert len(set(answers)) == len(answers)  # different noisy answers
        assert all(parse_trajectory(a).ok for a in answers)


def test_rl_curation(scenes):
    records, stats = B.build_rl(scenes, CV, jax.random.key(2), CONFIG)
    counts = {int(k): v for k, v in stats["category_counts"].items()}
    assert sum(counts.values()) == N
    hard = counts[1] + counts[2]
    selected = {int(k): v for k, v in stats["selected"].items()}
    assert selected[1] == counts[1] and selected[2] == counts[2]
    assert selected[3] == min(counts[3], round(CONFIG.easy_ratio * hard))
    assert len(records) == sum(selected.values())
    for r in records:
        assert [m["role"] for m in r["messages"]] == ["user"]
        cat = r["meta"]["category"]
        if cat == 1:
            assert r["meta"]["first_turn_feedback"]
        elif cat == 2:
            assert not r["meta"]["first_turn_feedback"] and r["meta"]["first_turn_pdms"] < 0.8
        else:
            assert not r["meta"]["first_turn_feedback"] and r["meta"]["first_turn_pdms"] >= 0.8
    none_easy = B.build_rl(scenes, CV, jax.random.key(2), B.BuildConfig(reference="expert", easy_ratio=0.0))[0]
    assert all(r["meta"]["category"] < 3 for r in none_easy)


@pytest.mark.parametrize("kind", B.MALFORMATIONS)
def test_every_malformation_is_unusable(kind):
    """Each malformed answer fails the rollout's own check at every cut, so a recovery sample
    never teaches the policy to replace a good answer."""
    from jax_drive.text.format_score import check_answer

    poses = np.stack([np.arange(1, 9) * 5.0, np.zeros(8), np.zeros(8)], -1)
    for cut in range(1, 8):
        answer = B.malformed_answer(poses, kind, cut)
        assert not check_answer(answer).usable and check_answer(answer).format == 0.0, (kind, cut, answer)
    with pytest.raises(ValueError, match="unknown malformation"):
        B.malformed_answer(poses, "typo", 1)


def test_recovery_records(scenes):
    from jax_drive.rollout import FORMAT_FEEDBACK

    records, counts = B.build_recovery(scenes, jax.random.key(3), CONFIG)
    assert len(records) == N and sum(counts.values()) == N and set(counts) == set(B.MALFORMATIONS)
    assert sum(v > 0 for v in counts.values()) >= 3  # drawn per scene, not one kind for all
    expert = np.asarray(scenes.expert)
    for i, r in enumerate(records):
        msgs = chat.validate(r["messages"])
        assert r["kind"] == "recovery" and r["train_on"] == "last" and r["meta"]["malformation"] in B.MALFORMATIONS
        assert [m["role"] for m in msgs[-4:]] == ["user", "assistant", "user", "assistant"]
        assert msgs[-2]["content"] == FORMAT_FEEDBACK  # the rollout's own message, one home
        assert not parse_trajectory(msgs[-3]["content"]).ok
        target = parse_trajectory(msgs[-1]["content"])
        np.testing.assert_allclose(target.poses, quantize(expert[i]), atol=1e-9)
        assert msgs[:-3] == B.prompt_conversations(jax.tree.map(lambda a: a[i:i + 1], scenes), CONFIG)[0]
    custom = B.BuildConfig(reference="expert", format_feedback="Use [PT, ...].")
    assert B.build_recovery(scenes, jax.random.key(3), custom)[0][0]["messages"][-2]["content"] == "Use [PT, ...]."


def test_self_recovery_records_come_from_the_predictors_own_unusable_answers(scenes):
    """On-policy recovery: only scenes answered unusably give records (an expert row and a
    recovery row whose malformed turn is the predictor's own text, verbatim); the loose
    format rule of the rollout decides what is unusable."""
    expert = np.asarray(scenes.expert)
    own = {0: "I will drive straight.", 3: format_trajectory(np.concatenate([expert[3], expert[3][-1:]]))}

    class Flaky:
        name = "flaky"

        def __call__(self, scene, key, prompts):
            return [own.get(i, format_trajectory(expert[i])) for i in range(len(prompts))]

    records, stats = B.build_self_recovery(scenes, Flaky(), jax.random.key(0), CONFIG)
    assert (stats["scenes"], stats["unusable"]) == (N, 2)
    ids = [int(i) for i in np.asarray(scenes.scene_id)]
    assert stats["scene_ids"] == [ids[0], ids[3]] and stats["answer_chars"] == [len(own[0]), len(own[3])]
    assert [r["kind"] for r in records] == ["single", "recovery", "single", "recovery"]
    prompts = B.prompt_conversations(scenes, CONFIG)
    for (single, recovery), i in zip([records[:2], records[2:]], (0, 3)):
        assert single["messages"][:-1] == prompts[i] and "train_on" not in single
        msgs = recovery["messages"]
        assert recovery["train_on"] == "last" and msgs[:-3] == prompts[i]
        assert msgs[-3]["content"] == own[i] and msgs[-2]["content"] == CONFIG.format_feedback
        for m in (single["messages"][-1], msgs[-1]):
            np.testing.assert_allclose(parse_trajectory(m["content"]).poses, quantize(expert[i]), atol=1e-9)
    assert len({r["id"] for r in records}) == 4
    # a usable-but-unpolished answer (no "Here is" prefix) is not a format failure here
    fine, _ = B.build_self_recovery(scenes, type("P", (), {"name": "p", "__call__": lambda self, s, k, p: [
        format_points(e) for e in expert]})(), jax.random.key(0), CONFIG)
    assert fine == []
    with pytest.raises(ValueError, match="returned 1 answers"):
        B.build_self_recovery(scenes, type("Short", (), {"name": "short", "__call__": lambda self, s, k, p: ["x"]})(),
                              jax.random.key(0), CONFIG)


def test_qa_records(scenes):
    records, counts = B.build_qa(scenes, jax.random.key(3), CONFIG)
    assert len(records) == sum(counts.values()) > 0
    for metric in ("dac", "nc", "ttc"):
        assert counts[f"{metric}_yes"] == counts[f"{metric}_no"], metric  # generated scenes have agents
    for r in records:
        assert r["messages"][-1]["content"] in ("Yes.", "No.")


def test_unparsable_predictor_is_skipped(scenes):
    class Broken:
        name = "broken"

        def __call__(self, scene, key, prompts):
            return ["I would drive carefully."] * len(prompts)

    records, stats = B.build_rl(scenes, Broken(), jax.random.key(2), CONFIG)
    assert stats["first_turn"]["unparsed"] == N
    assert all(r["meta"]["category"] == 2 and r["meta"]["first_turn_pdms"] is None for r in records)
    with pytest.raises(ValueError):
        B.first_turn(scenes, _Short(), jax.random.key(0), CONFIG)


class _Short:
    name = "short"

    def __call__(self, scene, key, prompts):
        return ["x"]


@contextlib.contextmanager
def _roomy_map_budgets():
    """Map budgets grown to fixed capacities that every generated scene batch fits, so the
    hypothesis examples (new maps each) share one scorer compilation per proposal count
    instead of compiling one each (about 4 s apiece). Capacities only size arrays: results
    do not depend on them (tests/test_pdm_polygons.py checks budgeted == brute force)."""
    original = pdm_scorer.map_budget

    def roomy(scene, num_trajectories=None):
        b = original(scene, num_trajectories)
        if b is None:  # traced scenes: the brute-force path
            return b
        grow = lambda pb, band: pb._replace(edges=max(pb.edges, 192), band=max(pb.band, band))
        return b._replace(drivable=grow(b.drivable, 32), lanes=grow(b.lanes, 72))

    pdm_scorer.map_budget = roomy
    try:
        yield
    finally:
        pdm_scorer.map_budget = original


@settings(max_examples=4)
@given(scene_seed=st.integers(0, 2**16), expert_seed=st.integers(0, 2**16), text=st.booleans())
def test_expert_never_leaks_into_prompts(scene_seed, expert_seed, text):
    """Prompts are a function of the scene without its expert: replacing the expert
    changes no prompt message, and no prompt message holds the expert's [PT block."""
    config = TEXT_CONFIG if text else CONFIG
    with _roomy_map_budgets():
        _check_no_leak(config, scene_seed, expert_seed)


def _check_no_leak(config, scene_seed, expert_seed):
    original = _scenes(scene_seed)
    other = _with_expert(original, expert_seed)
    key = jax.random.key(scene_seed)
    builds = {
        "single": lambda s: B.build_single(s, config),
        "multi": lambda s: B.build_multi(s, CV, key, config)[0],
        "rl": lambda s: B.build_rl(s, CV, key, config)[0],
        "recovery": lambda s: B.build_recovery(s, key, config)[0],
    }
    built = {
        name: {kind: build(source) for kind, build in builds.items()}
        for name, source in (("original", original), ("other", other))
    }
    for name, source in (("original", original), ("other", other)):
        blocks = [format_points(p) for p in np.asarray(source.expert)]
        for kind, records in built[name].items():
            for r in records:
                for m in _prompt_part(r):
                    assert not any(b in m["content"] for b in blocks), kind
    for kind in builds:
        a = {r["id"]: _prompt_part(r) for r in built["original"][kind]}
        b = {r["id"]: _prompt_part(r) for r in built["other"][kind]}
        for rid in set(a) & set(b):
            assert a[rid] == b[rid], (kind, rid)
        if kind != "rl":  # RL selection may depend on EP (the reference here is the expert)
            assert set(a) == set(b)
        assert a, kind


def test_data_card_counts():
    card = DataCard(kind="multi", num_scenes=4, seed=0)
    card.add_records([
        {"kind": "multi", "meta": {"mock": False, "turns": 2}},
        {"kind": "multi", "meta": {"mock": True, "turns": 3}},
        {"kind": "multi", "meta": {"mock": False, "turns": 2}},
        {"kind": "recovery", "meta": {"malformation": "truncated", "turns": 2}},
    ])
    card.add_stats({"first_turn": {"nc_fail": 2, "mean_pdms": 0.5, "reference": "expert"}})
    card.add_stats({"first_turn": {"nc_fail": 1, "mean_pdms": 0.7, "reference": "expert"}})
    d = card.to_dict()
    assert d["records"] == 4
    assert d["record_counts"] == {"multi/bootstrap/2-turn": 2, "multi/mock/3-turn": 1, "recovery/truncated": 1}
    assert d["stats"]["first_turn"]["nc_fail"] == 3
    assert abs(d["stats"]["first_turn"]["mean_pdms"] - 0.6) < 1e-9
    assert "nc_fail: 3" in card.to_text()


@pytest.mark.parametrize("kind", ["single", "multi", "recovery", "qa", "rl"])
def test_cli_build(kind, tmp_path, capsys):
    from jax_drive.cli import main

    out = tmp_path / f"{kind}.jsonl"
    card = tmp_path / "card.json"
    code = main([
        "data", "build", "--kind", kind, "--scenes", str(N), "--out", str(out), "--seed", "0",
        "--reference", "expert", "--no-progress", "--card", str(card),
    ])
    assert code == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines and all(r["kind"] == kind and r["meta"]["scene_seed"] == 0 for r in lines)
    for r in lines:
        chat.validate(r["messages"])
    printed = capsys.readouterr().out
    assert f"Data card: kind={kind}" in printed and f"records={len(lines)}" in printed
    written = json.loads(card.read_text())
    assert written["records"] == len(lines) and written["meta"]["command"] == "data build"


def test_cli_rejects_bad_arguments(tmp_path):
    from jax_drive.cli import main

    assert main(["data", "build", "--kind", "single", "--scenes", "0", "--out", str(tmp_path / "x.jsonl")]) == 2
    (tmp_path / "x.jsonl").write_text("")
    with pytest.raises(SystemExit):  # a path under a regular file
        main(["data", "build", "--kind", "single", "--scenes", "2", "--out", str(tmp_path / "x.jsonl" / "y.jsonl")])
    with pytest.raises(SystemExit):
        main(["data", "build", "--kind", "nope", "--scenes", "2", "--out", str(tmp_path / "x.jsonl")])


def test_caption_min_x_leaves_out_objects_behind(scenes):
    """``CaptionConfig.min_x`` keeps the nearest objects at or ahead of that offset only."""
    from jax_drive.text.caption import CaptionConfig, caption_scenes

    def boxes(caption):
        return [line for line in caption.splitlines() if line.startswith("  (")]

    everything = caption_scenes(scenes, CaptionConfig(max_agents=64, radius=1e3))
    ahead = caption_scenes(scenes, CaptionConfig(max_agents=64, radius=1e3, min_x=-5.0))
    dropped = 0
    for all_lines, kept in zip(map(boxes, everything), map(boxes, ahead)):
        xs = [float(line.strip("( ").split(",")[0]) for line in all_lines]
        assert kept == [line for line, x in zip(all_lines, xs) if x >= -5.0]
        dropped += len(all_lines) - len(kept)
    assert dropped > 0  # some scene had an object behind the ego
