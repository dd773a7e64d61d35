"""The TalkingVehicles methods as a registry: ``METHODS[name](name, preset, engines, run_dir, progress)``
-> :class:`Prepared` (a policy factory, the records the method adds to its result, the
policy's identity: what its evaluation chunks are keyed by, :mod:`.identity`).

  * ``rule_based``, ``silent``: the non-language baselines of :mod:`jax_drive.coop.baselines`;
  * ``zero_shot_silent``, ``zero_shot``: LLM agents without / with messages;
  * ``reflection``, ``correction_rag``, ``debrief``: the learning methods of
    :mod:`jax_drive.coop.learning` (learn first on the ``learn`` split, memories then frozen);
  * ``central_memory``: the debrief memories of every scenario in one store retrieved by
    observation (generalisation study; needs the debrief run first);
  * ``distilled``: a small model fine-tuned on successful talking episodes
    (:mod:`jax_drive.pipelines.talking_vehicles.distillation`), driven with compact prompts.

The engines a run needs (the LLM agents' local or served engine, the retrieval embedder)
are built on first use by :class:`Engines`, the pipeline's workspace.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import NamedTuple

from jax_drive.coop.agent import LanguagePolicy
from jax_drive.coop.learning import Lane, MemoryContext, lanes_for
from jax_drive.coop.memory import MemoryBank
from jax_drive.names import TALKING_VEHICLES_METHODS, check_names
from jax_drive.pipelines.engines import EngineSpec, ModelSpec, load_model, make_engine
from jax_drive.pipelines.stages import Workspace
from jax_drive.pipelines.talking_vehicles import identity as ID
from jax_drive.pipelines.talking_vehicles.distillation import distill_method, load_student, local_engine_spec
from jax_drive.pipelines.talking_vehicles.presets import Preset

PolicyFactory = Callable[[], object]


class Prepared(NamedTuple):
    """A prepared method: ``make_policy()`` builds its policy, ``extra`` goes into its result,
    ``identity`` (JSON-able) says which policy it is (the evaluation chunks' key)."""

    make_policy: PolicyFactory
    extra: dict
    identity: dict


def llm_identity(preset: Preset, agent) -> dict:
    """An LLM agent: its model, engine (and server) and prompt / decoding settings."""
    served = {"engine": preset.engine} | ({"base_url": preset.base_url} if preset.engine == "openai" else {})
    return ID.model_identity(preset.model) | served | {"agent": ID.config_identity(agent)}


def memory_identity(bank: MemoryBank) -> str:
    """A hash of a memory bank's contents (knowledge, strategies, corrections)."""
    return ID.digest({"bank": bank.to_json()})


class Engines(Workspace):
    """The engines of a TalkingVehicles run, built on first use: the LLM agents' engine
    (local or OpenAI-compatible) and the retrieval embedder over the local model (the
    agents' own with engine 'jax', else the student's base model)."""

    def __init__(self, preset: Preset):
        super().__init__()
        self.preset = preset

    def local_model(self):
        source = self.preset.model if self.preset.engine == "jax" else self.preset.student_model
        return self.get("local_model", lambda: load_model(ModelSpec(source)))

    def agent(self):
        """The engine of the LLM agents."""
        preset = self.preset
        if preset.engine == "openai":
            spec = EngineSpec(kind="openai", url=preset.base_url, served_model=preset.model)
            return self.get("agent", lambda: make_engine(spec))
        return self.get("agent", lambda: make_engine(local_engine_spec(preset), *self.local_model()))

    def embedder(self):
        """Mean-pooled hidden states of the local model."""
        from jax_drive.coop.memory import Embedder

        model, tokenizer = self.local_model()
        return Embedder(model, tokenizer, max_tokens=self.preset.embed_tokens)


def learn_method(preset: Preset, method: str, engines: Engines, run_dir: str, *, progress: bool = True,
                 max_rounds: int | None = None) -> tuple[list[Lane], MemoryBank, list[dict]]:
    """Runs (or resumes) a learning method, one seed's lanes at a time, each checkpointed
    after every round in ``<run_dir>/<method>_learning_seed<s>.json``; returns every lane,
    the merged memories and the post-episode LLM call records."""
    import jax

    from jax_drive.coop.learning import Learner, load_state, save_state

    embedder = engines.embedder() if method == "correction_rag" else None
    merged, all_lanes, calls = MemoryBank(), [], []
    for seed in preset.seeds:
        path = os.path.join(run_dir, f"{method}_learning_seed{seed}.json")
        if os.path.exists(path):
            lanes, bank, extra = load_state(path)
        else:
            lanes, bank, extra = lanes_for(preset.scenarios, [seed]), MemoryBank(), {}
        if not all(l.done for l in lanes):
            learner = Learner(method, engines.agent(), bank, preset.learning, preset.agent, embedder,
                              key=jax.random.key(1000 + seed))
            learner.llm_calls = list(extra.get("llm_calls", []))
            learner.learn(lanes, progress=progress, max_rounds=max_rounds,
                          log=lambda r, ls: save_state(path, ls, bank, {"llm_calls": learner.llm_calls}))
            extra["llm_calls"] = learner.llm_calls
            save_state(path, lanes, bank, extra)
        merged.agents.update(bank.agents)
        merged.corrections.update(bank.corrections)
        all_lanes += lanes
        calls += extra.get("llm_calls", [])
    return all_lanes, merged, calls


def lane_summary(lanes: Sequence[Lane]) -> dict:
    return {"lanes": [{"scenario": l.scenario, "seed": l.seed, "episodes": l.episodes, "resets": l.resets,
                       "solved": l.solved, "successes": int(sum(h["success"] for h in l.history))} for l in lanes],
            "episodes": int(sum(l.episodes for l in lanes)), "solved": int(sum(l.solved for l in lanes))}


# ----------------------------------------------------------------------------- the registry
def baseline(method: str, preset: Preset, engines: Engines, run_dir: str, progress: bool):
    from jax_drive.coop import baselines

    return Prepared(lambda: baselines.make_policy(method), {}, {"baseline": method})


def zero_shot(method: str, preset: Preset, engines: Engines, run_dir: str, progress: bool):
    agent = dataclasses.replace(preset.agent, communicate=method == "zero_shot")
    return Prepared(lambda: LanguagePolicy(engines.agent(), agent, name=method), {}, llm_identity(preset, agent))


def learning(method: str, preset: Preset, engines: Engines, run_dir: str, progress: bool):
    lanes, bank, calls = learn_method(preset, method, engines, run_dir, progress=progress)
    # "reflection (unstructured)" / "debrief (empty)": answers that were not a usable memory
    sources = collections.Counter(v["source"] for m in bank.agents.values() for v in m.versions)
    extra = {"learning": lane_summary(lanes) | {"llm_calls": calls, "memory_sources": dict(sorted(sources.items()))},
             "memory_examples": {k: {"knowledge": m.knowledge, "strategy": m.strategy, "versions": m.versions}
                                 for k, m in list(sorted(bank.agents.items()))[:4]}}

    def make_policy():
        rag = method == "correction_rag"
        context = MemoryContext(bank, "rag" if rag else "memory", engines.embedder() if rag else None,
                                preset.learning.rag_examples)
        return LanguagePolicy(engines.agent(), preset.agent, context=context, name=method)

    identity = llm_identity(preset, preset.agent) | {"memory": memory_identity(bank)}
    if method == "correction_rag":
        identity |= {"rag_examples": preset.learning.rag_examples, "embed_tokens": preset.embed_tokens}
    return Prepared(make_policy, extra, identity)


def central_memory(method: str, preset: Preset, engines: Engines, run_dir: str, progress: bool):
    from jax_drive.coop.memory import central_memory as central

    if not all(os.path.exists(os.path.join(run_dir, f"debrief_learning_seed{s}.json")) for s in preset.seeds):
        raise FileNotFoundError(f"central_memory needs the debrief run in {run_dir} first")
    _, bank, _ = learn_method(preset, "debrief", engines, run_dir, progress=progress)
    extra = {"central_entries": sum(len(m.observations) or 1 for m in bank.agents.values()
                                    if m.knowledge or m.strategy)}

    def make_policy():
        embedder = engines.embedder()
        context = MemoryContext(bank, "central", embedder, central=central(bank, embedder))
        return LanguagePolicy(engines.agent(), preset.agent, context=context, name=method)

    return Prepared(make_policy, extra, llm_identity(preset, preset.agent) | {"memory": memory_identity(bank),
                                                                             "embed_tokens": preset.embed_tokens})


def distilled(method: str, preset: Preset, engines: Engines, run_dir: str, progress: bool):
    extra = {}
    if preset.student_path:
        model_path = preset.student_path
    else:
        model_path, extra["distill"] = distill_method(preset, run_dir, progress=progress)

    def make_policy():
        model, tokenizer = load_student(model_path)
        return LanguagePolicy(make_engine(local_engine_spec(preset), model, tokenizer), preset.student_agent,
                              name="distilled")

    # the student's saved files: a retrained student (another round, new data) is another policy
    identity = {"student_files": ID.files_digest([model_path]), "agent": ID.config_identity(preset.student_agent)}
    return Prepared(make_policy, extra, identity)


METHODS = {"rule_based": baseline, "silent": baseline, "zero_shot_silent": zero_shot, "zero_shot": zero_shot,
           "reflection": learning, "correction_rag": learning, "debrief": learning,
           "central_memory": central_memory, "distilled": distilled}
check_names("TalkingVehicles methods", METHODS, TALKING_VEHICLES_METHODS)
