"""GRPO for talking language drivers (jax_drive.coop.rl): groups start from one state and
differ by the sampler's draws, joint returns and decision advantages on hand-computed cases,
the recorded (grammar-masked) log-probs equal the trainer's, one engine call per decision
for every live agent, and a short training run."""

import collections
import types

import jax
import numpy as np
import pytest
from flax import nnx

from jax_drive.coop import rl
from jax_drive.coop.agent import AgentConfig, DecisionTokens, LanguagePolicy
from jax_drive.coop.episodes import STATE_FIELDS, EpisodeBatch
from jax_drive.coop.learning import EpisodeSpec, run_specs
from jax_drive.rl.advantages import AdvantageConfig
from jax_drive.rl.batching import answer_allowed, batch_token_logprobs
from jax_drive.rl.grpo import sampling_grammar_tables
from jax_drive.rl.optim import OptimConfig, copy_tree
from jax_drive.sim import metrics as M
from jax_drive.sim.scenarios import TALKING_VEHICLES
from jax_drive.sim.state import SimConfig

from coop_tiny import CountingEngine, tiny_engine

SCENARIOS = TALKING_VEHICLES[:2]
G = 3
LOGP_ATOL = 1e-4  # float32 sampler vs trainer forward passes of the same tiny model


def rl_config(temperature: float = 1.0, max_time: float = 1.5, **kw) -> rl.CoopRLConfig:
    """A tiny training setup: compact prompts, constrained answers, short messages and episodes."""
    agent = AgentConfig(style="compact", temperature=temperature, constrain_answers=True, max_message_chars=16)
    base = dict(agent=agent, scenarios=SCENARIOS, group_size=G, groups_per_step=2, steps=2, max_time=max_time,
                checkpoint_every=None)
    return rl.CoopRLConfig(**{**base, **kw})


class ProxyEngine(CountingEngine):
    """A counting wrapper that also delegates every other attribute (the tokenizer the
    constrained answers' budget needs, the sampler settings) to the real engine; counts
    ``generate`` calls too (none expected: every decision goes through generate_chat)."""

    def __init__(self, engine):
        super().__init__(engine)
        self.plain_calls = 0

    def generate(self, *args, **kw):
        self.plain_calls += 1
        return self.engine.generate(*args, **kw)

    def __getattr__(self, name):
        return getattr(self.engine, name)


@pytest.fixture(scope="module")
def engine():
    return tiny_engine()


@pytest.fixture(scope="module")
def rollout(engine):
    """Two groups of G episodes at temperature 1 through a counting proxy around the real engine."""
    proxy = ProxyEngine(engine)
    config = rl_config()
    specs = rl.training_specs(config.scenarios, config.seed, 0, config.groups_per_step)
    results, policy = rl.rollout_groups(proxy, config, specs, jax.random.key(3))
    return types.SimpleNamespace(proxy=proxy, config=config, specs=specs, results=results, policy=policy)


# ----------------------------------------------------------------------------- groups
def test_group_episodes_start_from_one_state_and_specs_differ():
    specs = [EpisodeSpec(SCENARIOS[0], 0, 0, "rl"), EpisodeSpec(SCENARIOS[0], 0, 2, "rl"),
             EpisodeSpec(SCENARIOS[1], 0, 0, "rl")]
    grouped = rl.group_specs(specs, G)
    assert grouped == [specs[p] for p in range(len(specs)) for _ in range(G)]
    batch = EpisodeBatch([s.scenario for s in grouped], [s.key() for s in grouped],
                         [s.accident_prone for s in grouped], max_time=2.0)
    obs = batch.observe()
    arrays = {k: obs.state[k] for k in STATE_FIELDS}
    arrays.update(visible=obs.visible, lane_arc=obs.lane_arc, light=obs.light)
    for p in range(len(specs)):
        first = p * G
        for i in range(1, G):
            for name, values in arrays.items():
                np.testing.assert_array_equal(values[first + i], values[first], err_msg=f"group {p} copy {i}: {name}")
            for name, values in batch.statics[first].items():
                np.testing.assert_array_equal(batch.statics[first + i][name], values, err_msg=f"static {name}")

    def differs(a, b):
        return [k for k, v in arrays.items() if v[a].shape != v[b].shape or not np.array_equal(v[a], v[b])]

    # another key of the same scenario (same accident-prone flag) and another scenario start elsewhere
    assert differs(0, G), "two specs of one scenario with different keys start from the same state"
    assert differs(0, 2 * G)


def test_training_episodes_run_in_the_configured_world():
    nominal = rl.training_specs(SCENARIOS, 0, 3, 4)
    scaled = rl.training_specs(SCENARIOS, 0, 3, 4, variation="scale1.5")
    assert [s.variation for s in scaled] == ["scale1.5"] * 4
    assert [(s.scenario, s.index, s.split) for s in scaled] == [(s.scenario, s.index, s.split) for s in nominal]
    # the same keys, the world scaled: every start position and speed x 1.5
    base = EpisodeBatch([s.scenario for s in nominal], [s.key() for s in nominal],
                        [s.accident_prone for s in nominal], max_time=2.0)
    world = EpisodeBatch([s.scenario for s in scaled], [s.key() for s in scaled], [s.accident_prone for s in scaled],
                         max_time=2.0, variations=[s.variation for s in scaled])
    valid = np.stack([static["valid"] for static in base.statics])
    assert valid.any(axis=1).all()
    for name in ("x", "y", "speed"):
        np.testing.assert_allclose(np.asarray(world.observe().state[name])[valid],
                                   1.5 * np.asarray(base.observe().state[name])[valid], rtol=1e-5, atol=1e-4,
                                   err_msg=name)


def test_group_copies_sample_different_answers_from_the_same_prompt(rollout):
    first = collections.defaultdict(dict)  # (group, agent) -> {copy: DecisionTokens} at decision 0
    for d in rollout.policy.decisions:
        if d.decision == 0:
            first[(d.episode // G, d.agent)][d.episode % G] = d
    assert len(first) >= len(rollout.specs)
    distinct = 0
    for (group, agent), copies in first.items():
        assert sorted(copies) == list(range(G)), f"group {group} agent {agent}: not every copy asked"
        prompts = {copies[i].prompt_ids for i in range(G)}
        assert len(prompts) == 1, "the copies of a group saw different first prompts"
        distinct += len({copies[i].answer_ids for i in range(G)}) > 1
    # the copies draw their own tokens: at T=1 a random model's G answers to one prompt are not all equal
    assert distinct == len(first)


# ----------------------------------------------------------------------------- returns and advantages
def outcomes(*kinds):
    return types.SimpleNamespace(outcomes=[M.AgentOutcome(index=k, vehicle_id=100 + k, outcome=o, time=1.0)
                                           for k, o in enumerate(kinds)])


def test_joint_returns_average_eligible_agents_with_a_collision_weight():
    results = [outcomes(M.SUCCESS, M.COLLISION), outcomes(M.SUCCESS, M.SUCCESS), outcomes(M.TIMEOUT),
               outcomes(), outcomes(M.COLLISION), outcomes(M.SUCCESS, M.TIMEOUT, M.COLLISION, M.SUCCESS)]
    np.testing.assert_allclose(rl.joint_returns(results), [0.5, 1.0, 0.0, 0.0, 0.0, 0.5])
    weighted = rl.joint_returns(results, rl.ReturnConfig(success=2.0, collision=0.5))
    np.testing.assert_allclose(weighted, [2 * 0.5 - 0.5 * 0.5, 2.0, 0.0, 0.0, -0.5, 2 * 0.5 - 0.5 * 0.25],
                               rtol=1e-6)


def tokens(episode, decision, agent=0):
    return DecisionTokens(episode=episode, agent=agent, decision=decision, prompt_ids=(1, 2),
                          answer_ids=(3, 4), logprobs=(-0.5, -0.25), finish_reason="stop")


def shuffled(records, seed=0):
    return [records[i] for i in np.random.default_rng(seed).permutation(len(records))]


def hand_normalise(values):
    """(x - mean) / (unbiased std + 1e-6) over one group, by hand."""
    x = np.asarray(values, np.float64)
    std = np.sqrt(np.sum((x - x.mean()) ** 2) / (len(x) - 1))
    return (x - x.mean()) / (std + 1e-6)


# two groups of G = 3: episode -> decisions taken (two agents ask at decision 0 of episode 0;
# episode 4 ended after one decision; decision indices skip none inside an episode)
TAKEN = {0: [0, 1, 2], 1: [0, 1], 2: [0, 1, 2, 3], 3: [0, 1], 4: [0], 5: [0, 1, 2]}
RETURNS = np.asarray([1.0, 0.0, 0.5, 0.25, 0.25, 0.25], np.float32)


def records():
    out = [tokens(e, d) for e, taken in TAKEN.items() for d in taken] + [tokens(0, 0, agent=1)]
    return shuffled(out)


def test_grpo_decision_advantages_by_hand():
    recs = records()
    adv = rl.decision_advantages(RETURNS, recs, G, AdvantageConfig(mode="grpo"))
    group0 = hand_normalise(RETURNS[:3])  # mean 0.5, std 0.5
    np.testing.assert_allclose(group0, [1 / (0.5 + 1e-6) * 0.5, -0.5 / (0.5 + 1e-6), 0.0])
    expected = {0: group0[0], 1: group0[1], 2: group0[2], 3: 0.0, 4: 0.0, 5: 0.0}
    np.testing.assert_allclose(adv, [expected[r.episode] for r in recs], rtol=1e-5, atol=1e-7)
    assert np.all(adv[[r.episode >= 3 for r in recs]] == 0.0)  # equal returns: exactly 0


def test_step_cost_rewards_are_returns_to_go_and_records_map_to_their_turns():
    cost = 0.1
    recs = records()
    rewards, mask, turns = rl.decision_rewards(RETURNS, recs, G, step_cost=cost)
    assert rewards.shape == mask.shape == (2, G, 4)
    for e, taken in TAKEN.items():
        n = len(taken)
        want = [RETURNS[e] - cost * (n - 1 - j) for j in range(n)] + [0.0] * (4 - n)
        np.testing.assert_allclose(rewards[e // G, e % G], want, rtol=1e-6, atol=1e-7, err_msg=f"episode {e}")
        assert mask[e // G, e % G].tolist() == [True] * n + [False] * (4 - n)
    assert [int(t) for t in turns] == [TAKEN[r.episode].index(r.decision) for r in recs]

    # 'grpo' normalises each episode's mean turn reward R_e - cost * (n_e - 1) / 2
    adv = rl.decision_advantages(RETURNS, recs, G, AdvantageConfig(mode="grpo"), step_cost=cost)
    seq = [RETURNS[e] - cost * (len(TAKEN[e]) - 1) / 2 for e in range(6)]
    per_episode = np.concatenate([hand_normalise(seq[:3]), hand_normalise(seq[3:])])
    np.testing.assert_allclose(adv, [per_episode[r.episode] for r in recs], rtol=1e-5, atol=1e-6)

    # 'mtgrpo_cross' normalises every turn over all turns of its group: each record gets its own
    cross = rl.decision_advantages(RETURNS, recs, G, AdvantageConfig(mode="mtgrpo_cross"), step_cost=cost)
    for p in range(2):
        cells = [(e, j) for e in range(p * G, (p + 1) * G) for j in range(len(TAKEN[e]))]
        values = hand_normalise([RETURNS[e] - cost * (len(TAKEN[e]) - 1 - j) for e, j in cells])
        by_cell = dict(zip(cells, values))
        for r, a in zip(recs, cross):
            if r.episode // G == p:
                assert a == pytest.approx(by_cell[(r.episode, TAKEN[r.episode].index(r.decision))], rel=1e-5, abs=1e-6)


def test_decision_rewards_reject_episodes_that_do_not_split_into_groups():
    with pytest.raises(ValueError, match="groups of 4"):
        rl.decision_rewards(RETURNS, records(), 4)


# ----------------------------------------------------------------------------- log-probs
@pytest.mark.parametrize("logprobs_mode", ["raw", "processed"])
def test_recorded_logprobs_equal_the_trainers_masked_logprobs(engine, logprobs_mode):
    # 'processed' (rollout_groups' recording): the distribution drawn from, softmax(logits / T)
    # under the grammar: the trainer's pass at T. 'raw' (the sampler's default): log-softmax of
    # the untempered logits over the tokens the grammar allowed, whatever temperature the
    # tokens were drawn at: the trainer's pass at temperature 1.
    sampling_temperature = 0.7
    config = rl_config(temperature=sampling_temperature, max_time=1.0)
    specs = rl.training_specs(config.scenarios, config.seed, 0, config.groups_per_step)
    if logprobs_mode == "processed":
        _, policy = rl.rollout_groups(engine, config, specs, jax.random.key(5))
        temperature = sampling_temperature
    else:  # a recording policy with the sampler's default convention
        policy = LanguagePolicy(engine, config.agent, key=jax.random.key(5), record_tokens=True)
        run_specs(rl.group_specs(specs, config.group_size), policy, max_time=config.max_time)
        temperature = 1.0
    assert policy.sampling.logprobs_mode == logprobs_mode
    decisions = policy.decisions
    assert decisions and all(len(d.logprobs) == len(d.answer_ids) for d in decisions)
    model, tokenizer = engine.model, engine.tokenizer
    tables, grammar_rows = sampling_grammar_tables(tokenizer, model.config.vocab_size, policy.sampling)
    assert tables is not None
    adv = np.linspace(-1, 1, len(decisions)).astype(np.float32)
    batch = rl.decision_batch(decisions, adv, int(tokenizer.pad_token_id or 0), bucket_size=config.bucket_size,
                              multiple_of=4, grammar_rows=grammar_rows)
    mask = batch["loss_mask"] > 0
    assert int(mask.sum()) == sum(len(d.answer_ids) for d in decisions)
    assert bool(np.all(np.asarray(answer_allowed(tables, batch)[1])[:len(decisions)]))  # every answer legal
    masked = np.asarray(batch_token_logprobs(model, batch, temperature=temperature, grammar=tables))
    np.testing.assert_allclose(masked[mask], batch["old_logp"][mask], atol=LOGP_ATOL)
    # forced tokens (the JSON punctuation) have log-prob 0 under the mask, the rest are draws
    assert np.any(batch["old_logp"][mask] == 0.0) and np.any(batch["old_logp"][mask] < -0.1)
    unmasked = np.asarray(batch_token_logprobs(model, batch, temperature=temperature))
    assert np.max(np.abs(unmasked[mask] - batch["old_logp"][mask])) > 100 * LOGP_ATOL
    assert np.all(unmasked[mask] <= masked[mask] + LOGP_ATOL)  # the mask only renormalises over fewer tokens
    other = 1.0 if temperature != 1.0 else sampling_temperature  # the other convention's numbers differ
    wrong = np.asarray(batch_token_logprobs(model, batch, temperature=other, grammar=tables))
    assert np.max(np.abs(wrong[mask] - batch["old_logp"][mask])) > 100 * LOGP_ATOL


# ----------------------------------------------------------------------------- engine calls
def test_one_engine_call_per_decision_for_every_live_agent(rollout):
    proxy, policy = rollout.proxy, rollout.policy
    per_decision = collections.Counter(d.decision for d in policy.decisions)
    asked = sorted(per_decision)
    assert asked == list(range(len(asked))) and len(asked) > 1
    assert proxy.plain_calls == 0
    assert len(proxy.calls) == len(asked) == len(policy.calls)
    assert proxy.calls == [per_decision[d] for d in asked]
    assert [c.agents for c in policy.calls] == proxy.calls
    # every agent asked at decision d is a distinct (episode, slot); at decision 0 every episode is live
    for d in asked:
        rows = [(r.episode, r.agent) for r in policy.decisions if r.decision == d]
        assert len(set(rows)) == len(rows)
    # each episode was asked at every decision of its own length (the simulator's end time)
    dt = SimConfig().decision_dt
    for e, result in enumerate(rollout.results):
        taken = sorted({r.decision for r in policy.decisions if r.episode == e})
        assert taken == list(range(round(result.end_time / dt))), f"episode {e}"
    assert len(asked) == max(round(r.end_time / dt) for r in rollout.results)
    assert max(proxy.calls) > 1  # rows of several episodes share each call


# ----------------------------------------------------------------------------- training
def params_of(model):
    return [np.array(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def test_coop_grpo_train_two_steps(engine, tmp_path):
    model, tokenizer = engine.model, engine.tokenizer
    start = copy_tree(nnx.state(model))  # training changes the shared model in place: put it back after
    before = params_of(model)
    # a per-decision cost makes every group's turns differ, so the update has a gradient; no
    # weight decay, so any change of the weights comes from that gradient
    config = rl_config(max_time=1.5, group_size=2, advantage=AdvantageConfig(mode="mtgrpo_cross"),
                       returns=rl.ReturnConfig(collision=1.0, step_cost=0.05),
                       optim=OptimConfig(learning_rate=1e-3, trainable="full", weight_decay=0.0),
                       minibatch_size=16, max_rows=32)
    try:
        result = rl.coop_grpo_train(model, tokenizer, config, engine=engine, out_dir=tmp_path, progress=False)
        after = params_of(model)
    finally:
        nnx.update(model, start)
    assert [r["step"] for r in result.history] == [1, 2]
    for record in result.history:
        assert record["parse_failures"] == 0
        assert np.isfinite(record["loss"]) and record["rows_trained"] > 0
        assert record["advantage_abs_mean"] > 0
        assert record["decisions"] >= record["rows_trained"]
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 2
    assert any(not np.array_equal(a, b) for a, b in zip(before, after))


@pytest.mark.parametrize("changes, message", [
    (dict(group_size=1), "group_size"),
    (dict(scenarios=()), "scenarios"),
    (dict(max_rows=0), "max_rows"),
    (dict(agent=AgentConfig(temperature=0.0)), "temperature"),
    (dict(variation="scale9"), "unknown scenario variation"),
])
def test_config_errors(changes, message):
    with pytest.raises(ValueError, match=message):
        rl_config(**changes)
