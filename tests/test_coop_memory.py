"""Agent memory: versions, save / load, vector retrieval (mechanics on the tiny model, quality
with SmolLM2's mean-pooled hidden states on a small labelled set of simulator observations)."""

import numpy as np
import pytest

from jax_drive.coop.memory import AgentMemory, Embedder, MemoryBank, VectorMemory, central_memory, memory_key

from coop_tiny import tiny_model


def test_agent_memory_versions_and_reset():
    mem = AgentMemory()
    mem.update("K1", "S1", episode=0, source="reflection", observations=["o1"])
    mem.update("  K2 " + "x" * 50, "S2", episode=3, source="debrief", max_chars=10)
    assert (mem.knowledge, mem.strategy, mem.version) == ("K2 xxxxxxx", "S2", 2)
    assert [v["source"] for v in mem.versions] == ["reflection", "debrief"] and mem.observations == []
    mem.reset(episode=5)
    assert (mem.knowledge, mem.strategy, mem.versions[-1]["source"], mem.version) == ("", "", "reset", 3)


def test_vector_memory_top_k_with_scores():
    store = VectorMemory(3)
    vecs = np.eye(3, dtype=np.float32)
    store.add(["x", "y", "z"], [{"n": 0}, {"n": 1}, {"n": 2}], vecs)
    q = np.array([[0.8, 0.6, 0.0], [0.0, 0.0, 1.0]], np.float32)
    hits = store.search(q, k=2)
    assert [h.text for h in hits[0]] == ["x", "y"] and hits[0][0].score == pytest.approx(0.8)
    assert hits[1][0].payload == {"n": 2} and len(hits[1]) == 2
    assert store.search(q, k=10)[0][-1].text == "z"
    assert VectorMemory(3).search(q, 2) == [[], []]
    with pytest.raises(ValueError):
        store.add(["a"], [{}], np.zeros((1, 4)))
    with pytest.raises(ValueError):
        store.search(np.zeros((1, 4)))


def test_bank_save_load_round_trip(tmp_path):
    bank = MemoryBank()
    key = memory_key("tv_red_light", 1, 109)
    assert key == "tv_red_light/seed1/109"
    bank.agent(key).update("K", "S", episode=2, source="debrief", observations=["seen"])
    bank.store(key, 2).add(["obs"], [{"answer": '{"command": "stop"}'}], np.array([[0.6, 0.8]], np.float32))
    bank.meta["method"] = "debrief"
    path = bank.save(tmp_path / "bank.json")
    back = MemoryBank.load(path)
    assert back.to_json() == bank.to_json()
    assert back.corrections[key].search(np.array([[0.6, 0.8]]), 1)[0][0].payload["answer"] == '{"command": "stop"}'
    back.reset("tv_red_light/seed1/", episode=4)
    assert back.agent(key).knowledge == "" and len(back.corrections[key]) == 0


def test_embedder_mechanics_on_the_tiny_model():
    model, tokenizer = tiny_model()
    embed = Embedder(model, tokenizer, max_tokens=64, bucket=16)
    texts = ["stopped truck ahead", "car oncoming in the opposite lane", "green light, go straight"]
    alone = embed(texts[:1])
    batch = embed(texts + ["a much longer text " * 5])
    assert batch.shape == (4, model.config.hidden_size) and np.allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(alone[0], batch[0], atol=1e-5)  # padding and batch size do not change a vector
    store = VectorMemory(embed.dim)
    store.add(texts, [{"i": i} for i in range(3)], batch[:3])
    hits = store.search(embed(texts), 1)
    assert [h[0].payload["i"] for h in hits] == [0, 1, 2] and all(h[0].score > 0.999 for h in hits)
    assert embed([]).shape == (0, embed.dim)


def test_central_memory_keys_knowledge_by_observations():
    model, tokenizer = tiny_model()
    embed = Embedder(model, tokenizer, max_tokens=64, bucket=16)
    bank = MemoryBank()
    bank.agent("a/seed0/1").update("Ka", "Sa", episode=0, source="debrief", observations=["obs a1", "obs a2"])
    bank.agent("b/seed0/2").update("Kb", "Sb", episode=0, source="debrief")
    bank.agent("c/seed0/3")  # empty: not stored
    store = central_memory(bank, embed)
    assert [e["text"] for e in store.entries] == ["obs a1", "obs a2", "Kb Sb"]
    assert store.search(embed(["obs a2"]), 1)[0][0].payload["knowledge"] == "Ka"


def _observations(seeds=(3, 4), max_time: float = 8.0):
    """Per seed (captions, scenario labels): a few decisions of each scenario's two episodes
    (every seed's episodes run in one batch)."""
    from jax_drive.coop.baselines import RuleBasedPolicy
    from jax_drive.coop.learning import episode_specs, run_specs
    from jax_drive.sim.scenarios import TALKING_VEHICLES

    specs = episode_specs(TALKING_VEHICLES, seeds, 2, "learn")
    _, transitions = run_specs(specs, RuleBasedPolicy(), record=True, max_time=max_time)
    out = {seed: ([], []) for seed in seeds}
    for n, spec in enumerate(specs):
        trs = [t for t in transitions if t.episode == n]
        for t in trs[:: max(1, len(trs) // 3)][:3]:
            out[spec.seed][0].append(t.observation)
            out[spec.seed][1].append(spec.scenario)
    return out


@pytest.mark.slow
def test_retrieval_quality_on_a_labelled_set_with_smollm2():
    """Memory: observations of seed 3's episodes labelled by scenario; queries: seed 4's.
    Top-1 retrieval must find the query's scenario far above chance (1/6); the two overtake
    scenarios share a road and look alike, so the scenario family (overtake, intersection,
    highway) is checked too."""
    from jax_drive.models import load_pretrained

    model, _, tokenizer = load_pretrained("smollm2-135m-instruct")
    embed = Embedder(model, tokenizer, max_tokens=192)
    observed = _observations()
    keys, key_labels = observed[3]
    queries, query_labels = observed[4]
    store = VectorMemory(embed.dim)
    store.add(keys, [{"scenario": s} for s in key_labels], embed(keys))
    hits = store.search(embed(queries), 1)
    found = [h[0].payload["scenario"] for h in hits]
    family = {"tv_overtake_perception": 0, "tv_overtake_negotiation": 0, "tv_red_light": 1, "tv_left_turn": 1,
              "tv_highway_merge": 2, "tv_highway_exit": 2}
    accuracy = np.mean([f == q for f, q in zip(found, query_labels)])
    family_accuracy = np.mean([family[f] == family[q] for f, q in zip(found, query_labels)])
    assert len(queries) >= 30
    assert accuracy >= 0.6, accuracy
    assert family_accuracy >= 0.85, family_accuracy
    # control: the same search with the labels of the memory shuffled is near chance
    rng = np.random.default_rng(0)
    shuffled = rng.permutation(key_labels)
    control = np.mean([shuffled[keys.index(h[0].text)] == q for h, q in zip(hits, query_labels)])
    assert control < accuracy - 0.3
