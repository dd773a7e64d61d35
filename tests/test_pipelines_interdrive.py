"""The InterDrive pipeline's pieces: Table 2 arms, presets, episode plans, SFT example
selection, negotiation statistics and the fine-tuned model's loading (adapter folded in)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_drive.models.export import export_peft
from jax_drive.models.lora import apply_lora, lora_projections
from jax_drive.pipelines import interdrive as I
from jax_drive.models.tiny import tiny_policy

SMOKE = I.PRESETS["smoke"]


def test_arms_are_the_rows_of_table_2():
    p = I.PRESETS["cpu-demo"]
    one = I.arm_config("1_no_negotiation", p)
    assert not one.negotiate
    two, three, four, five = (I.arm_config(a, p) for a in I.ARMS[1:])
    assert two.grouping.radius == p.radius == 50.0
    assert all(c.negotiate and c.grouping.radius is None for c in (three, four, five))
    assert [(c.rounds.critic, c.rounds.consensus) for c in (two, three, four, five)] == [
        (False, False), (False, False), (True, False), (True, True)]
    # without a critic nothing stops a negotiation early: the preset's fixed number of rounds
    assert two.rounds.rounds == three.rounds.rounds == p.rounds_without_critic
    assert four.rounds.rounds == five.rounds.rounds == p.max_rounds == 3
    with pytest.raises(ValueError, match="unknown arm"):
        I.arm_config("6_everything", p)


def test_preset_rejects_overlapping_seeds_and_unknown_types():
    with pytest.raises(ValueError, match="overlap"):
        I.Preset(name="x", eval_seeds=(0, 1), train_seeds=(1, 2))
    with pytest.raises(ValueError, match="unknown InterDrive"):
        I.Preset(name="x", types=("ic_straight_straight", "tv_overtake"))
    for p in I.PRESETS.values():  # every shipped preset keeps evaluation and training apart
        assert not set(p.eval_seeds) & set(p.train_seeds)


def test_episode_plan_keys_and_flags():
    names, keys, flags, tags = I.episode_plan(("ic_chaos", "lm_highway_merge"), (0, 2), 3, "alternate")
    assert len(names) == len(keys) == len(flags) == len(tags) == 12
    assert names[:6] == ["ic_chaos"] * 6 and tags[4] == ("ic_chaos", 2, 1)
    assert flags[:3] == [True, False, True]
    assert jnp.array_equal(jax.random.key_data(keys[4]),
                           jax.random.key_data(jax.random.fold_in(jax.random.key(2), 1)))
    assert all(I.episode_plan(("ic_chaos",), (0,), 4, "accident")[2])


def _example(kind, prompt, answer="x", rnd=0, wrong=False):
    return {"kind": kind, "round": rnd, "wrong": wrong, "messages": [{"role": "user", "content": prompt},
                                                                     {"role": "assistant", "content": answer}]}


def test_select_examples_counts_distinct_prompts_length_and_late_rounds():
    ex = [_example("actor", f"a{k}", rnd=int(k >= 10)) for k in range(20)]  # 10 first-round, 10 later
    ex += [_example("actor", "a0")]  # a duplicate prompt
    ex += [_example("sum", f"s{k}") for k in range(5)] + [_example("sum", "s" * 50)]
    ex += [_example("consensus", f"c{k}") for k in range(2)]
    ex += [_example("actor", f"w{k}", rnd=0, wrong=True) for k in range(30)]  # the teacher's corrupted rounds
    chosen = I.select_examples(ex, (("actor", 8), ("sum", 10), ("consensus", 1)), seed=3, max_chars=20)
    kinds = [e["kind"] for e in chosen]
    assert kinds.count("actor") == 8 and kinds.count("sum") == 5 and kinds.count("consensus") == 1
    prompts = [e["messages"][0]["content"] for e in chosen]
    assert len(set(prompts)) == len(prompts) and "s" * 50 not in prompts
    assert not any(p.startswith("w") for p in prompts)
    assert len(I.select_examples(ex, (("actor", 100),), seed=0)) == 20  # every sound one, no wrong one
    assert sum(e["round"] > 0 for e in chosen if e["kind"] == "actor") >= 4  # half from later rounds


def test_probe_examples_are_unselected_distinct_first_round_actor_prompts():
    recorded = [_example("actor", f"a{k}", rnd=0) for k in range(6)] + [_example("actor", "a1", rnd=0)]
    recorded += [_example("actor", "late", rnd=1), _example("sum", "s0"), _example("actor", "bad", wrong=True)]
    selected = [_example("actor", "a0"), _example("actor", "a2")]
    probe = I.probe_examples(recorded, selected, n=10, seed=1)
    prompts = sorted(e["messages"][0]["content"] for e in probe)
    assert prompts == ["a1", "a3", "a4", "a5"]
    assert len(I.probe_examples(recorded, selected, n=2, seed=1)) == 2
    assert [e["messages"][0]["content"] for e in I.probe_examples(recorded, selected, n=10, seed=1)] == \
        [e["messages"][0]["content"] for e in probe]  # a fixed order


def test_decision_agreement_by_hand():
    targets = ["I will stop; 2 go faster.", "I will go faster; 1 please stop.", "I will slow down; 3 go faster.",
               "I will go first and faster; 4 yield please."]
    answers = ["I will stop and yield; 2 go faster.", "I will stop; 2 go faster.", "I will stop for 3.", "no idea"]
    got = I.decision_agreement(targets, answers)
    assert got["n"] == 4 and got["agreement"] == 0.25  # only the first
    assert got["yield_agreement"] == 0.75  # all but the second (the fourth: neither yields)
    assert got["majority"] == 0.5  # FASTER twice
    assert got["teacher"] == {"STOP": 1, "FASTER": 2, "SLOWER": 1}
    assert got["model"] == {"STOP": 3, "NONE": 1}
    assert got["confusion"] == {"STOP>STOP": 1, "FASTER>STOP": 1, "SLOWER>STOP": 1, "FASTER>NONE": 1}
    with pytest.raises(ValueError):
        I.decision_agreement(targets, answers[:2])
    with pytest.raises(ValueError):
        I.decision_agreement([], [])


def test_decision_probe_asks_the_engine_once_for_all_prompts():
    from jax_drive.sampling import JaxEngine

    model, _, tokenizer = tiny_policy(seed=0, lora_rank=None)
    engine, calls = JaxEngine(model, tokenizer), []

    class Counting:
        def generate_chat(self, conversations, params, key):
            calls.append((len(conversations), params.max_new_tokens, params.temperature))
            return engine.generate_chat(conversations, params, key)

    examples = [_example("actor", f"You are vehicle {k}.", answer="I will stop; 2 go faster.") for k in range(3)]
    preset = I.PRESETS["smoke"]
    got = I.decision_probe(Counting(), examples, preset)
    assert calls == [(3, preset.actor_tokens, 0.0)]
    assert got["n"] == 3 and got["teacher"] == {"STOP": 3} and sum(got["model"].values()) == 3
    assert [e["teacher"] for e in got["examples"]] == ["I will stop; 2 go faster."] * 3


def test_negotiation_stats_by_hand():
    def rnd(r, q, s, fb, src="json", missing=(), cons=None, err=None):
        return {"round": r, "quality": q, "safety": s, "efficiency": 0.5, "consensus": cons, "feedback": fb,
                "sum_source": src, "sum_missing": list(missing), "consensus_error": err}

    log = [{"vids": [1, 2], "messages_cut": 1, "conversation": [{}] * 4, "rounds": [rnd(0, 4.0, 0.2, ["Safety issue: 1 2"], cons=0.5),
                                       rnd(1, 8.0, 0.9, [], cons=0.9)]},
           {"vids": [1, 2, 3], "rounds": [rnd(0, 6.0, 0.6, ["Efficiency issue: x"], "none", (3,), err="no score")]}]
    st = I.negotiation_stats(log)
    assert st["messages_cut"] == 1 and st["messages"] == 4
    assert st["negotiations"] == 2 and st["rounds_hist"] == {2: 1, 1: 1} and st["group_size_hist"] == {2: 1, 3: 1}
    assert st["sum_parse"] == {"json": 2, "none": 1} and st["sum_missing_rate"] == pytest.approx(1 / 3)
    assert st["consensus_unreadable"] == 1
    assert st["feedback_lines"] == {"Safety issue": 1, "Efficiency issue": 1}
    assert st["per_round"][0]["quality"] == pytest.approx(5.0) and st["per_round"][0]["n"] == 2
    assert st["per_round"][0]["consensus"] == pytest.approx(0.5)  # the None is left out of the mean
    assert st["per_round"][1] == {"quality": 8.0, "safety": 0.9, "efficiency": 0.5, "consensus": 0.9, "n": 1}


def test_background_effect_lists_the_types_a_setting_changes_and_the_rule_row_is_named_for_what_it_is():
    from jax_drive.pipelines.interdrive.arms import ARM_LABELS
    from jax_drive.pipelines.interdrive.report import background_effect

    def unit(ds_a, sr_b):
        agg = lambda ds, sr: {"aggregate": {"DS": {"mean": ds, "se": 0.0}, "SR": {"mean": sr, "se": 0.0}}}  # noqa: E731
        return {"per_type": {"a": agg(ds_a, 50.0), "b": agg(90.0, sr_b)}}

    units = {("rule_based", False): unit(100.0, 100.0), ("rule_based", True): unit(100.0, 100.0),
             ("5_consensus", False): unit(90.0, 50.0), ("5_consensus", True): unit(80.0, 50.0),
             ("silent", False): unit(10.0, 0.0)}
    assert background_effect(units) == {"rule_based": {"types_differing": [], "of": 2},
                                        "5_consensus": {"types_differing": ["a"], "of": 2}}
    assert "V2V" in ARM_LABELS["rule_based"] and "no negotiation" in ARM_LABELS["rule_based"]


def test_loaded_adapter_is_folded_in_with_the_trained_logits(tmp_path):
    """load_model(adapter) = the base model with the trained LoRA, merged (no adapter left)."""
    trained, config, _ = tiny_policy(seed=0, lora_rank=None)
    apply_lora(trained, rank=SMOKE.lora_rank, alpha=SMOKE.lora_alpha, rngs=nnx.Rngs(1))
    for i, proj in enumerate(lora_projections(trained).values()):  # as if trained: B != 0
        proj.lora_b.set_value(jax.random.normal(jax.random.key(i), proj.lora_b.shape) * 0.3)
    export_peft(trained, tmp_path / "adapter", base_model_name="tiny")
    loaded, _ = I.load_model(SMOKE, str(tmp_path / "adapter"))
    assert not lora_projections(loaded)
    ids = jnp.asarray(np.random.default_rng(0).integers(0, config.vocab_size, (2, 9)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(9), (2, 9))
    mask = jnp.ones((2, 9), bool)
    want, _ = trained(ids, pos, mask)
    got, _ = loaded(ids, pos, mask)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4)
    base, _ = I.load_model(SMOKE)
    assert not np.allclose(np.asarray(base(ids, pos, mask)[0]), np.asarray(want), atol=1e-3)
    fresh, _ = I.load_model(SMOKE, lora=True)  # training: fresh adapters, remat on
    assert lora_projections(fresh) and fresh.config.remat_layers
    assert dataclasses.replace(fresh.config, remat_layers=False) == config


def test_render_dialogue_of_a_negotiated_episode(tmp_path):
    from jax_drive.coop.negotiation import CONTROL_5HZ, NegotiatingPolicy, NegotiationConfig, RuleTeacher
    from jax_drive.coop.runner import run_episodes

    policy = NegotiatingPolicy(RuleTeacher(), NegotiationConfig())
    key = jax.random.fold_in(jax.random.key(0), 0)
    results, _ = run_episodes(["ic_straight_straight"], [key], accident_prone=[True], policy=policy, cfg=CONTROL_5HZ,
                              keep_trajectory=True, max_time=4.0)
    assert policy.log, "the accident-prone crossing negotiates within 4 s"
    path = I.render_dialogue(results[0], policy.log, str(tmp_path / "episode.png"), frames=3)
    from matplotlib.image import imread

    img = imread(path)
    assert img.shape[1] > 2 * img.shape[0]  # frames side by side, then the dialogue column
    # a reply is drawn as written: its dollar signs are not TeX
    odd = [dict(rec, conversation=[dict(m, text="I go $x^$ first") for m in rec["conversation"]])
           for rec in policy.log]
    assert imread(I.render_dialogue(results[0], odd, str(tmp_path / "odd.png"), frames=3)).shape == img.shape
    with pytest.raises(ValueError, match="keep_trajectory"):
        I.render_dialogue(dataclasses.replace(results[0], trajectory=None), policy.log, str(tmp_path / "x.png"))


def test_results_of_another_negotiator_or_closed_loop_revision_are_run_again(tmp_path):
    from jax_drive.pipelines.interdrive.pipeline import InterDriveWorkspace
    from jax_drive.pipelines.stages import RunContext
    from jax_drive.runinfo import InputError

    run = InterDriveWorkspace(RunContext(SMOKE, str(tmp_path), {"engine": "teacher", "adapter": None}))
    today = {"negotiator": "teacher", "loop_revision": I.LOOP_REVISION}
    assert run.made_here(today)
    older_loop = {"negotiator": "teacher", "loop_revision": I.LOOP_REVISION - 1}
    assert not run.made_here(older_loop)
    assert not run.made_here({"negotiator": "teacher"})  # written before revisions were recorded
    assert run.made_here(older_loop, closed_loop=False)  # the probe drives no episode
    other = {"negotiator": "sft 300 steps", "loop_revision": I.LOOP_REVISION}
    assert not run.made_here(other)
    assert run.made_here(other, negotiates=False)  # a rule-based unit: any negotiator
    assert not run.made_here({"negotiator": None, "loop_revision": 1}, negotiates=False)
    # a separate consensus critic makes another negotiator: the actor's units are not reused
    adapter = str(tmp_path / "actor")
    options = {"engine": "jax", "adapter": adapter}
    actor_only = InterDriveWorkspace(RunContext(SMOKE, str(tmp_path), options))
    critic = str(tmp_path / "critic")
    with_critic = InterDriveWorkspace(RunContext(SMOKE, str(tmp_path), dict(options, critic_adapter=critic)))
    assert actor_only.negotiator_id() == f"adapter {adapter}"
    assert with_critic.negotiator_id() == f"adapter {adapter} + critic adapter {critic}"
    unit = {"negotiator": actor_only.negotiator_id(), "loop_revision": I.LOOP_REVISION}
    assert actor_only.made_here(unit) and not with_critic.made_here(unit)
    with pytest.raises(InputError, match="critic adapter"):
        I.run_interdrive(SMOKE, str(tmp_path), engine="teacher", critic_adapter=critic,
                         json_path=str(tmp_path / "r.json"))


def test_the_report_attaches_only_this_negotiators_probe_rl_and_fig5_records(tmp_path):
    import json
    import os

    from jax_drive.pipelines.interdrive.pipeline import InterDriveWorkspace
    from jax_drive.pipelines.interdrive.report import _attach_studies
    from jax_drive.pipelines.stages import RunContext

    options = {"engine": "teacher", "adapter": None, "json": str(tmp_path / "out" / "r.json"),
               "episode_png": str(tmp_path / "none.png")}
    ctx = RunContext(SMOKE, str(tmp_path), options)
    os.makedirs(tmp_path / "rl")
    records = {"probe.json": {"negotiator": "teacher", "n": 3, "agreement": 1.0},
               "rl/summary.json": {"negotiator": "sft 300 steps"},
               "fig5.json": {"negotiator": "teacher", "loop_revision": I.LOOP_REVISION - 1}}
    for name, record in records.items():
        (tmp_path / name).write_text(json.dumps(record))
    report = {}
    _attach_studies(ctx, InterDriveWorkspace(ctx), report, table={})
    assert report["probe"] == records["probe.json"]
    assert "negotiation_rl" not in report and "fig5" not in report
    assert report["stale_records"] == {"rl/summary.json": "sft 300 steps, closed-loop revision 1",
                                       "fig5.json": f"teacher, closed-loop revision {I.LOOP_REVISION - 1}"}


def test_equal_shares_repeats_the_rarer_label_and_keeps_every_index_valid():
    from jax_drive.pipelines.interdrive.negotiator import equal_shares

    labels = [True] * 2 + [False] * 9  # two agreements, nine others
    picks = equal_shares(labels, 10)
    assert sum(labels[i] for i in picks) == 5 and len(picks) == 10  # the two agreements drawn 5 times between them
    assert sorted({i for i in picks if labels[i]}) == [0, 1]
    assert len({i for i in picks if not labels[i]}) == 5  # the others distinct while they last
    assert sum(labels[i] for i in equal_shares(labels, 7)) == 3 and equal_shares([], 4) == []  # False sorts first: 4
    assert equal_shares(labels, 10) == picks  # fixed order (seed 0)


def test_the_consensus_effect_is_paired_over_types_and_seeds():
    from jax_drive.pipelines.interdrive.report import arm_difference

    def unit(ds):  # two types x two seeds, one episode each
        return {"per_type": {t: {"per_seed": [{"seed": s, "DS": ds[t][s], "SR": 100.0 * (ds[t][s] == 100)}
                                             for s in (0, 1)]} for t in ds}}

    four = unit({"a": [100.0, 50.0], "b": [80.0, 100.0]})
    five = unit({"a": [100.0, 100.0], "b": [80.0, 100.0]})  # one (type, seed) improved by 50 DS, SR +100
    got = arm_difference({("4_critic_se", False): four, ("5_consensus", False): five}, "5_consensus", "4_critic_se")
    assert list(got) == ["without_background"]  # the other setting was not evaluated
    ds, sr = got["without_background"]["DS"], got["without_background"]["SR"]
    assert ds["mean"] == 12.5 and sr["mean"] == 25.0 and ds["episodes"] == 4
    # a resample's mean is 12.5 k, k ~ Binomial(4, 1/4) copies of the change: P(k = 0) = 0.32 and
    # P(k >= 3) = 13/256 = 0.051 > 0.025 > P(k = 4), so the 95 % interval is [0, 37.5]
    assert ds["ci95"] == [0.0, 37.5]


def test_the_critic_is_judged_on_the_negotiations_it_scored_in_the_loop():
    from jax_drive.pipelines.interdrive.report import critic_in_loop

    def talk(texts_by_round, scores, edges=((1, 2),)):
        conversation = [{"round": r, "vid": v, "text": t} for r, texts in enumerate(texts_by_round)
                        for v, t in zip((1, 2), texts)]
        return {"edges": [list(e) for e in edges], "conversation": conversation,
                "rounds": [{"round": r, "consensus": s} for r, s in enumerate(scores)]}

    both_go = ["I will go first and faster; 2 stop please.", "I will go first and faster; 1 stop please."]
    settled = ["I will go first and faster; 2 stop please.", "I will stop and yield; 1 go faster."]
    log = [talk([both_go, settled], [1.0, 1.0]),   # a disagreement scored 100, then an agreement
           talk([both_go], [0.25]),                # a disagreement seen
           talk([settled], [None]),                # arm 4: no consensus score, not counted
           talk([["I will stop.", "I will stop."]], [0.75], edges=())]  # no conflicting pair: agreed (90)
    got = critic_in_loop(log)
    assert got["rounds"] == 4 and got["agreed"] == 2
    assert got["mean_score_agreed"] == 0.875 and got["mean_score_others"] == 0.625
    assert got["others_below_threshold"] == 1
    # agreed {1.0, 0.75} vs others {1.0, 0.25}: pairs above 2 (1.0 > .25, .75 > .25), one tie, one below
    assert got["auc"] == (2 + 0.5) / 4
    assert critic_in_loop([talk([settled], [None])]) is None
    assert critic_in_loop([talk([settled], [1.0])])["auc"] is None  # one class only


def test_critic_study_script_records_trains_and_probes_at_smoke_size(tmp_path):
    import json
    import os
    import sys

    from jax_drive.runinfo import InputError

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
    import interdrive_critic as script

    out = tmp_path / "critic.json"
    assert script.main(["--preset", "smoke", "--train-seeds", "100", "--sft-steps", "2", "--probe-at", "1",
                        "--probe-size", "4", "--train-examples", "6", "--work-dir", str(tmp_path / "w"),
                        "--json", str(out), "--no-progress"]) == 0
    got = json.loads(out.read_text())
    assert got["protocol"]["sft_steps"] == 2 and got["sft"]["steps"] == 2 and "meta" in got
    assert [p["steps"] for p in got["curve"]] == [0, 1, 2]  # base, the probe point, the end of the one fine-tune
    assert got["curve"][-1]["auc"] == got["tuned"]["auc"] and got["tuned_on_targets"]["n"] >= 1
    assert got["protocol"]["balance"] == "agreement" and got["data"]["targets_agreed"] == 3  # half of 6
    assert set(got["data"]["targets"]) <= {"0", "25", "50", "75", "100"} and got["data"]["held_out"] >= 1
    for probe in (got["base"], got["tuned"]):
        assert probe["n"] == got["data"]["held_out"] and probe["readout"] == "expected"
    with pytest.raises(InputError, match="overlap"):
        script.main(["--preset", "smoke", "--train-seeds", "100", "--probe-seeds", "100", "--json", str(out)])
    with pytest.raises(InputError, match="probe_at"):
        script.main(["--preset", "smoke", "--sft-steps", "2", "--probe-at", "2", "--json", str(out)])
