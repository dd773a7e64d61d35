"""CoopReflect's learning methods: zero-shot, self-reflection, correction + RAG and debrief,
each a loop over an engine and a :class:`~jax_drive.coop.memory.MemoryBank`.

Protocol (seed Section 5): a learning *lane* is one scenario in one seed's run with its own
memories. Lanes play learning episodes that alternate accident-prone and safe
configurations (accident-prone first); a lane is *solved* after ``solved_streak`` (20)
consecutive successes; a trial that reaches ``max_episodes`` (60) unsolved clears the lane's
knowledge (a *knowledge reset*) and starts again, at most ``max_resets`` (3) times, after
which the last trial's knowledge is kept. Evaluation then freezes the memories.

Every lane that is still learning plays its next episode in ONE batched run (all scenarios
and seeds together, one engine call per decision for every agent), and each method's
post-episode LLM calls for all lanes are batched the same way (one ``generate_chat`` per
discussion turn).

Methods (:data:`METHODS`):
  * ``zero_shot`` / ``zero_shot_silent``: no learning (with / without messages).
  * ``reflection``: after a failed episode every agent reflects on a batch of its own replay
    records (batch context sampling with the seed's Eq. 1 weights, batch size 4) and
    rewrites its knowledge K and strategy S.
  * ``correction_rag``: after each episode every agent writes a corrected decision for each
    sampled key frame of a failed episode (or keeps the sampled decisions of a successful
    one) into its correction store; at decision time the most similar stored observations
    are shown as examples (retrieved by embedding similarity).
  * ``debrief``: after a failed episode with two or more focal agents they hold a
    round-robin discussion (deterministic order by vehicle id; the first speaker proposes a
    joint strategy, the others respond from their own sampled batches) and then each writes
    its own K and S. A failed episode with one focal agent falls back to reflection.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import zlib
from collections.abc import Sequence

import jax
import numpy as np
from tqdm.auto import tqdm

from jax_drive.configs import at_least, one_of
from jax_drive.coop.agent import (
    AgentConfig,
    AgentContext,
    EMPTY_CONTEXT,
    LanguagePolicy,
    format_action,
    parse_action,
)
from jax_drive.coop.memory import Embedder, MemoryBank, VectorMemory, memory_key
from jax_drive.coop.policy import DecisionBatch
from jax_drive.coop.replay import Transition, sample_batch
from jax_drive.coop.runner import EpisodeResult, run_episodes
from jax_drive.names import LEARNING_METHODS, LLM_METHODS
from jax_drive.sampling import SamplingParams
from jax_drive.sim import metrics as M
from jax_drive.sim.state import SimConfig
from jax_drive.sim.variations import VARIATIONS
from jax_drive.text.json_answer import extract_json_object

# Episode key domains: evaluation, learning, distillation and RL training episodes never share a key.
SPLITS = {"eval": 0, "learn": 1, "distill": 2, "rl": 3}
METHODS = LLM_METHODS  # what a Learner runs (the zero-shot ones learn nothing)


@dataclasses.dataclass(frozen=True)
class EpisodeSpec:
    """One episode: scenario, seed, index within the split and split ('eval', 'learn',
    'distill', 'rl'). Even indices are accident-prone, odd ones safe (alternating, accident-prone
    first). ``variation``: a held-out variation (:mod:`jax_drive.sim.variations`) of the same
    episode (the same key, its world scaled)."""

    scenario: str
    seed: int
    index: int
    split: str = "eval"
    variation: str = "nominal"

    def __post_init__(self):
        one_of("split", self.split, sorted(SPLITS))
        one_of("variation", self.variation, list(VARIATIONS))
        at_least(self, 0, "index")

    @property
    def accident_prone(self) -> bool:
        return self.index % 2 == 0

    def key(self) -> jax.Array:
        """PRNG key of the episode's scenario randomisation (disjoint per split)."""
        base = jax.random.fold_in(jax.random.key(int(self.seed)), 1000 + SPLITS[self.split])
        return jax.random.fold_in(base, int(self.index))

    @property
    def tag(self) -> str:
        tag = f"{self.scenario}/{self.split}/seed{self.seed}/{self.index}"
        return tag if self.variation == "nominal" else f"{tag}/{self.variation}"


def episode_specs(scenarios: Sequence[str], seeds: Sequence[int], episodes: int, split: str = "eval",
                  start: int = 0, variation: str = "nominal") -> list[EpisodeSpec]:
    """Every scenario x seed x episode index in [start, start + episodes)."""
    return [EpisodeSpec(s, int(seed), k, split, variation) for s in scenarios for seed in seeds
            for k in range(start, start + episodes)]


def run_specs(specs: Sequence[EpisodeSpec], policy, *, record: bool = False, keep_trajectory: bool = False,
              progress=None, cfg: SimConfig = SimConfig(),
              max_time: float | None = None) -> tuple[list[EpisodeResult], list[Transition]]:
    """Runs the episodes of ``specs`` as ONE batch (mixed scenarios); transitions'
    ``episode`` indexes ``specs``. ``max_time``: optional cap on episode length, s."""
    specs = list(specs)
    return run_episodes([s.scenario for s in specs], [s.key() for s in specs],
                        accident_prone=[s.accident_prone for s in specs], policy=policy, record=record,
                        variations=[s.variation for s in specs],
                        keep_trajectory=keep_trajectory, progress=progress, cfg=cfg, max_time=max_time)


def episode_success(result: EpisodeResult) -> bool:
    """Every focal reward-eligible agent reached its goal."""
    return bool(result.outcomes) and all(o.outcome == M.SUCCESS for o in result.outcomes)


# ----------------------------------------------------------------------------- configuration
@dataclasses.dataclass(frozen=True)
class LearningConfig:
    """The learning protocol and the post-episode LLM calls.

    Attributes:
      max_episodes: learning episodes per trial (seed: up to 60).
      solved_streak: consecutive successes that solve a lane (seed: 20).
      max_resets: knowledge resets before the last trial's knowledge is kept (seed: 3).
      batch_size: replay records per agent in batch context sampling (seed: 4).
      debrief_rounds: round-robin rounds of a debrief discussion.
      max_memory_chars: K and S are each cut to this many characters.
      reflection_tokens, discussion_tokens: answer budgets of reflections / summaries and of
        discussion turns (and of unconstrained corrections).
      constrain_answers: sample the post-episode answers under grammars, so every one is
        usable: reflections and summaries as ``{"knowledge": <prose>, "strategy": <prose>}``
        (``sampling.grammar.memory_grammar``, each field ``memory_words`` words at most),
        debrief turns as plain prose of ``discussion_words`` words at most
        (``prose_grammar``), corrections as a talking driver's answer (:meth:`corrector`).
        Default False (the seed's free-form answers).
      memory_words, discussion_words: the grammars' word caps.
      rag_examples: retrieved corrections shown per decision (Correction+RAG).
      temperature: sampling temperature of the post-episode calls (seed: 0.2).
      seed: batch context sampling.
      max_time: optional cap on learning episodes' length, s (quick checks; None = each
        scenario's own time limit).
    """

    max_episodes: int = 60
    solved_streak: int = 20
    max_resets: int = 3
    batch_size: int = 4
    debrief_rounds: int = 1
    max_memory_chars: int = 600
    reflection_tokens: int = 160
    discussion_tokens: int = 96
    constrain_answers: bool = False
    memory_words: int = 40
    discussion_words: int = 50
    rag_examples: int = 2
    temperature: float = 0.2
    seed: int = 0
    max_time: float | None = None

    def __post_init__(self):
        at_least(self, 1, "max_episodes", "solved_streak", "batch_size", "debrief_rounds")
        at_least(self, 0, "max_resets", "rag_examples")
        at_least(self, 1, "reflection_tokens", "discussion_tokens")
        at_least(self, 3, "memory_words", "discussion_words")

    def grammars(self) -> dict:
        """The grammar of reflections / summaries and of debrief turns (None unless ``constrain_answers``)."""
        if not self.constrain_answers:
            return {"reflection": None, "debrief": None}
        from jax_drive.sampling.grammar import memory_grammar, prose_grammar

        return {"reflection": memory_grammar(self.memory_words), "debrief": prose_grammar(self.discussion_words)}

    def corrector(self, agent: AgentConfig) -> AgentConfig:
        """The answer a correction asks for: a talking driver's ``{"command", "message"}`` with no
        reasoning, so its grammar and token budget are :meth:`AgentConfig.answer_grammar` /
        ``answer_budget`` of this config (constrained only with ``constrain_answers``)."""
        return dataclasses.replace(agent, communicate=True, chain_of_thought=False, answer_prefix="",
                                   constrain_answers=self.constrain_answers,
                                   max_new_tokens=self.discussion_tokens)


@dataclasses.dataclass
class Lane:
    """Learning state of one scenario in one seed's run.

    ``episodes``: learning episodes played (also the next episode's index); ``trial_episodes``
    those of the current trial; ``streak``: current run of successes; ``resets``: knowledge
    resets so far; ``solved`` / ``done``; ``history``: one dict per episode (index, trial,
    accident_prone, success, feedback, failures).
    """

    scenario: str
    seed: int
    episodes: int = 0
    trial_episodes: int = 0
    streak: int = 0
    resets: int = 0
    solved: bool = False
    done: bool = False
    history: list = dataclasses.field(default_factory=list)

    @property
    def prefix(self) -> str:
        return f"{self.scenario}/seed{self.seed}/"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Lane:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


# ----------------------------------------------------------------------------- memory as context
class MemoryContext:
    """The ``context`` of a :class:`LanguagePolicy` reading a memory bank.

    mode: 'memory' (each agent's own K and S), 'rag' (K and S plus retrieved corrections of
    its own store) or 'central' (the best-matching entry of a shared ``central`` store).
    ``specs`` must be set to the episodes of the batch being run (episode e of the batch
    is ``specs[e]``).
    """

    def __init__(self, bank: MemoryBank, mode: str = "memory", embedder: Embedder | None = None, k: int = 2,
                 central: VectorMemory | None = None):
        if mode not in ("memory", "rag", "central"):
            raise ValueError(f"unknown memory mode {mode!r}")
        if mode in ("rag", "central") and embedder is None:
            raise ValueError(f"mode {mode!r} needs an embedder")
        if mode == "central" and central is None:
            raise ValueError("mode 'central' needs the central store")
        self.bank, self.mode, self.embedder, self.k, self.central = bank, mode, embedder, k, central
        self.specs: list[EpisodeSpec] = []

    def key(self, batch: DecisionBatch, e: int, i: int) -> str:
        spec = self.specs[e]
        return memory_key(spec.scenario, spec.seed, int(batch.views[e]["vehicle_id"][i]))

    def __call__(self, batch: DecisionBatch, rows: np.ndarray) -> list[AgentContext]:
        keys = [self.key(batch, int(e), int(i)) for e, i in rows]
        if self.mode == "central":
            queries = self.embedder([batch.caption(int(e), int(i)) for e, i in rows])
            hits = self.central.search(queries, 1)
            return [AgentContext(h[0].payload["knowledge"], h[0].payload["strategy"]) if h else EMPTY_CONTEXT
                    for h in hits]
        out = []
        mems = [self.bank.agents.get(k) for k in keys]
        examples: list[tuple] = [()] * len(rows)
        if self.mode == "rag":
            stores = [self.bank.corrections.get(k) for k in keys]
            ask = [n for n, s in enumerate(stores) if s is not None and len(s)]
            if ask:
                queries = self.embedder([batch.caption(int(rows[n][0]), int(rows[n][1])) for n in ask])
                for n, q in zip(ask, queries):
                    hits = stores[n].search(q[None], self.k)[0]
                    examples[n] = tuple((h.payload["observation"], h.payload["answer"]) for h in hits)
        for mem, ex in zip(mems, examples):
            out.append(AgentContext(mem.knowledge if mem else "", mem.strategy if mem else "", ex))
        return out


# ----------------------------------------------------------------------------- prompts
def describe_frame(tr: Transition) -> str:
    """One replay record as a line of context: what the agent saw, did and said, the
    replies and the retro labels."""
    obs = tr.info.get("student_observation") or tr.observation.split("\n")[0]
    line = f"t={tr.time:.1f} s: {obs} You: {tr.command}"
    if tr.message:
        line += f', said "{tr.message}"'
    if tr.responses:
        line += ". Replies: " + "; ".join(f"{vid}: {text}" for vid, text in tr.responses[:2])
    if tr.time_to_collision is not None:
        line += f". Collision {tr.time_to_collision:.1f} s later"
        if tr.contributed_to_collision:
            line += " (your action contributed)"
    elif tr.contributed_to_stagnation:
        line += ". You stalled the task"
    return line + "."


MEMORY_FORMAT = ('Answer with JSON only: {"knowledge": "<facts about this scenario>", '
                 '"strategy": "<how you act and what you say, in two or three sentences>"}.')


def reflection_prompt(header: str, knowledge: str, strategy: str, feedback: list[str], frames: list[str]) -> list[dict]:
    """Self-reflection: own key frames and the outcome -> new knowledge and strategy."""
    user = [header, f"Current knowledge: {knowledge or 'none'}", f"Current strategy: {strategy or 'none'}",
            "Outcome: " + " ".join(feedback), "Key moments of the episode:"] + [f"- {f}" for f in frames]
    user.append("Reflect on what went wrong and how to avoid it next time. " + MEMORY_FORMAT)
    return [{"role": "system", "content": "You are a driving agent learning from your last episode."},
            {"role": "user", "content": "\n".join(user)}]


def correction_prompt(header: str, frame: str, feedback: list[str]) -> list[dict]:
    """Correction: one key frame of a failed episode -> the decision that should have been taken."""
    user = (f"{header}\nOutcome: {' '.join(feedback)}\nAt this moment:\n{frame}\n"
            'Which command and message should you have chosen? Answer with JSON only: '
            '{"command": "<go|stop|slow down|speed up|change lane left|change lane right|keep>", '
            '"message": "<short message or empty>"}.')
    return [{"role": "system", "content": "You are a driving agent correcting your past decisions."},
            {"role": "user", "content": user}]


def debrief_prompt(header: str, feedback: list[str], frames: list[str], transcript: list[tuple[int, str]],
                   participants: str, opening: bool) -> list[dict]:
    """A debrief turn: the first speaker proposes a joint strategy, the others respond."""
    user = [header, f"Participants: {participants}.", "Outcome: " + " ".join(feedback),
            "Your key moments:"] + [f"- {f}" for f in frames]
    if transcript:
        user.append("Discussion so far:")
        user += [f"Vehicle {vid}: {text}" for vid, text in transcript]
    if opening:
        user.append("Propose a joint cooperative strategy for every vehicle: what each should do and say. "
                    "At most three sentences.")
    else:
        user.append("Give your feedback on the proposal from your own experience, or a better plan. "
                    "At most three sentences.")
    return [{"role": "system", "content": "You are a driving agent in a debrief after a failed cooperative episode."},
            {"role": "user", "content": "\n".join(user)}]


def summary_prompt(header: str, transcript: list[tuple[int, str]], knowledge: str, strategy: str) -> list[dict]:
    """After the discussion each agent writes its own knowledge and strategy."""
    user = [header, f"Current knowledge: {knowledge or 'none'}", f"Current strategy: {strategy or 'none'}",
            "Debrief discussion:"] + [f"Vehicle {vid}: {text}" for vid, text in transcript]
    user.append("Summarise what you learnt into your own knowledge and cooperative strategy. " + MEMORY_FORMAT)
    return [{"role": "system", "content": "You are a driving agent writing down what the team agreed."},
            {"role": "user", "content": "\n".join(user)}]


def parse_memory(text: str, max_chars: int = 600) -> tuple[str, str, str | None]:
    """(knowledge, strategy, failure) from a reflection answer; never raises. Without usable
    JSON the whole answer (one line, cut) becomes the strategy and failure is
    'unstructured'; an empty answer gives failure 'empty' and empty texts."""
    answer = extract_json_object(text)
    if answer.ok:
        k, s = answer.value.get("knowledge"), answer.value.get("strategy")
        k = k if isinstance(k, str) else (json.dumps(k) if k is not None else "")
        s = s if isinstance(s, str) else (json.dumps(s) if s is not None else "")
        if k.strip() or s.strip():
            return " ".join(k.split())[:max_chars], " ".join(s.split())[:max_chars], None
    flat = " ".join(str(text).split()) if isinstance(text, str) else ""
    if not flat:
        return "", "", "empty"
    return "", flat[:max_chars], "unstructured"


# ----------------------------------------------------------------------------- the loop
@dataclasses.dataclass
class _Agent:
    """One learning agent of one lane's latest episode."""

    lane: Lane
    slot: int
    vid: int
    key: str
    header: str
    frames: list[str]
    sampled: list[Transition]
    feedback: list[str]


class Learner:
    """Runs a method's learning loop over lanes (see the module docstring).

    Args:
      method: one of :data:`METHODS` (the zero-shot ones learn nothing).
      engine: ``generate_chat`` engine; bank: the memories (updated in place).
      config: :class:`LearningConfig`; agent: :class:`AgentConfig` of the drivers.
      embedder: needed by ``correction_rag``.
      key: PRNG key. log: called with (round, lanes) after every round (checkpoints).
    """

    def __init__(self, method: str, engine, bank: MemoryBank, config: LearningConfig = LearningConfig(),
                 agent: AgentConfig = AgentConfig(), embedder: Embedder | None = None, key=None):
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
        if method == "correction_rag" and embedder is None:
            raise ValueError("correction_rag needs an embedder")
        self.method, self.engine, self.bank, self.config, self.embedder = method, engine, bank, config, embedder
        self.key = jax.random.key(config.seed) if key is None else key
        mode = "rag" if method == "correction_rag" else "memory"
        self.context = MemoryContext(bank, mode, embedder, config.rag_examples)
        self.policy = LanguagePolicy(engine, agent, jax.random.fold_in(self.key, 1), context=self.context,
                                     name=method)
        grammars, corrector = config.grammars(), config.corrector(agent)
        self.params = SamplingParams(max_new_tokens=config.reflection_tokens, temperature=config.temperature,
                                     grammar=grammars["reflection"])
        self.talk = SamplingParams(max_new_tokens=config.discussion_tokens, temperature=config.temperature,
                                   grammar=grammars["debrief"])
        # sized only where used: the budget needs a local tokenizer under the grammar
        self.correct = None if method != "correction_rag" else SamplingParams(
            max_new_tokens=corrector.answer_budget(engine), temperature=config.temperature,
            grammar=corrector.answer_grammar())
        self.llm_calls: list[dict] = []
        self._calls = 0

    # -- engine calls (every post-episode call of every lane in one generate_chat) --------
    def _generate(self, prompts: list[list[dict]], params: SamplingParams, kind: str) -> list[str]:
        if not prompts:
            return []
        start = time.perf_counter()
        out = self.engine.generate_chat(prompts, params, jax.random.fold_in(self.key, 10_000 + self._calls))
        self._calls += 1
        self.llm_calls.append({"kind": kind, "prompts": len(prompts), "seconds": time.perf_counter() - start,
                               "new_tokens": sum(c.num_tokens for c in out)})
        return [c.text for c in out]

    def play_round(self, lanes: list[Lane], progress=None) -> tuple[list[EpisodeResult], list[Transition]]:
        """Every active lane plays its next learning episode (one batch)."""
        specs = [EpisodeSpec(l.scenario, l.seed, l.episodes, "learn") for l in lanes]
        self.context.specs = specs
        return run_specs(specs, self.policy, record=True, progress=progress, max_time=self.config.max_time)

    def learn(self, lanes: list[Lane], *, progress: bool = True, log=None, max_rounds: int | None = None) -> list[Lane]:
        """Runs rounds until every lane is done (or ``max_rounds``); returns the lanes."""
        if self.method not in LEARNING_METHODS:
            for lane in lanes:
                lane.done = True
            return lanes
        rounds = 0
        total = self.config.max_episodes * (self.config.max_resets + 1)
        bar = tqdm(total=sum(total - l.episodes for l in lanes if not l.done), desc=f"learn [{self.method}]",
                   disable=not progress, leave=False)
        while any(not l.done for l in lanes) and (max_rounds is None or rounds < max_rounds):
            active = [l for l in lanes if not l.done]
            self.policy.reset()
            results, transitions = self.play_round(active)
            self.update(active, results, transitions)
            for n, (lane, result) in enumerate(zip(active, results)):
                self._bookkeeping(lane, result, self.policy.failures.get(n, {}))
            rounds += 1
            bar.update(len(active))
            if log is not None:
                log(rounds, lanes)
        bar.close()
        return lanes

    def _bookkeeping(self, lane: Lane, result: EpisodeResult, failures) -> None:
        ok = episode_success(result)
        lane.history.append({"index": lane.episodes, "trial": lane.resets, "accident_prone": result.accident_prone,
                             "success": ok, "feedback": result.feedback, "parse_failures": dict(failures)})
        lane.episodes += 1
        lane.trial_episodes += 1
        lane.streak = lane.streak + 1 if ok else 0
        if lane.streak >= self.config.solved_streak:
            lane.solved = lane.done = True
        elif lane.trial_episodes >= self.config.max_episodes:
            if lane.resets >= self.config.max_resets:
                lane.done = True
            else:
                lane.resets += 1
                lane.trial_episodes = lane.streak = 0
                self.bank.reset(lane.prefix, episode=lane.episodes)

    # -- post-episode updates ----------------------------------------------------------
    def _agents(self, lanes, results, transitions) -> list[list[_Agent]]:
        """Per lane, its learning agents (every focal agent of the episode) with sampled frames."""
        per_lane: list[list[_Agent]] = []
        for n, (lane, result) in enumerate(zip(lanes, results)):
            trs = [t for t in transitions if t.episode == n]
            by_agent: dict[int, list[Transition]] = {}
            for t in trs:
                by_agent.setdefault(t.agent, []).append(t)
            rng = np.random.default_rng([self.config.seed, lane.seed, lane.episodes, zlib.crc32(lane.scenario.encode())])
            agents = []
            for slot in sorted(by_agent, key=lambda s: by_agent[s][0].vehicle_id):
                seq = by_agent[slot]
                sampled = sorted(sample_batch(seq, rng, self.config.batch_size), key=lambda t: t.step)
                task = _task_of(seq[0])
                header = f"You are Vehicle {seq[0].vehicle_id} in scenario '{lane.scenario}'. Task: {task}"
                agents.append(_Agent(lane, slot, seq[0].vehicle_id, memory_key(lane.scenario, lane.seed, seq[0].vehicle_id),
                                     header, [describe_frame(t) for t in sampled], sampled, result.feedback))
            per_lane.append(agents)
        return per_lane

    def update(self, lanes: list[Lane], results: list[EpisodeResult], transitions: list[Transition]) -> None:
        """The method's post-episode step for every lane of the round (batched LLM calls)."""
        per_lane = self._agents(lanes, results, transitions)
        failed = [not episode_success(r) for r in results]
        if self.method == "reflection":
            self._reflect([a for agents, f in zip(per_lane, failed) if f for a in agents])
        elif self.method == "correction_rag":
            self._correct(per_lane, failed)
        elif self.method == "debrief":
            groups = [agents for agents, f in zip(per_lane, failed) if f and len(agents) >= 2]
            alone = [a for agents, f in zip(per_lane, failed) if f and len(agents) < 2 for a in agents]
            self._reflect(alone)
            self._debrief(groups)

    def _write(self, agents: list[_Agent], answers: list[str], source: str) -> None:
        for agent, text in zip(agents, answers):
            knowledge, strategy, failure = parse_memory(text, self.config.max_memory_chars)
            mem = self.bank.agent(agent.key)
            if failure == "empty":
                knowledge, strategy = mem.knowledge, mem.strategy
            mem.update(knowledge, strategy, episode=agent.lane.episodes, source=source + (f" ({failure})" if failure else ""),
                       max_chars=self.config.max_memory_chars, observations=[t.observation for t in agent.sampled])

    def _reflect(self, agents: list[_Agent]) -> None:
        prompts = []
        for a in agents:
            mem = self.bank.agent(a.key)
            prompts.append(reflection_prompt(a.header, mem.knowledge, mem.strategy, a.feedback, a.frames))
        self._write(agents, self._generate(prompts, self.params, "reflection"), "reflection")

    def _correct(self, per_lane: list[list[_Agent]], failed: list[bool]) -> None:
        jobs, keep = [], []
        for agents, f in zip(per_lane, failed):
            for a in agents:
                for tr, frame in zip(a.sampled, a.frames):
                    (jobs if f else keep).append((a, tr, frame))
        answers = self._generate([correction_prompt(a.header, frame, a.feedback) for a, _, frame in jobs],
                                 self.correct, "correction")
        entries = []
        for (a, tr, _), text in zip(jobs, answers):
            action = parse_action(text)
            entries.append((a, tr, format_action(action.command, action.message)))
        entries += [(a, tr, format_action(tr.info.get("command", tr.command), tr.message)) for a, tr, _ in keep]
        if not entries:
            return
        vectors = self.embedder([tr.observation for _, tr, _ in entries])
        for (a, tr, answer), vec in zip(entries, vectors):
            obs = tr.info.get("student_observation") or tr.observation
            self.bank.store(a.key, self.embedder.dim).add([tr.observation], [{"observation": obs, "answer": answer,
                                                                             "episode": a.lane.episodes}], vec[None])

    def _debrief(self, groups: list[list[_Agent]]) -> None:
        transcripts: list[list[tuple[int, str]]] = [[] for _ in groups]
        participants = [", ".join(f"Vehicle {a.vid}" for a in agents) for agents in groups]
        turns = max((len(g) for g in groups), default=0) * self.config.debrief_rounds
        for turn in range(turns):
            speakers = [(g, agents[turn % len(agents)]) for g, agents in enumerate(groups)
                        if turn < len(agents) * self.config.debrief_rounds]
            prompts = [debrief_prompt(a.header, a.feedback, a.frames, transcripts[g], participants[g], turn == 0)
                       for g, a in speakers]
            for (g, a), text in zip(speakers, self._generate(prompts, self.talk, "debrief")):
                transcripts[g].append((a.vid, " ".join(text.split())[: self.config.max_memory_chars]))
        agents = [(g, a) for g, group in enumerate(groups) for a in group]
        prompts = [summary_prompt(a.header, transcripts[g], self.bank.agent(a.key).knowledge,
                                  self.bank.agent(a.key).strategy) for g, a in agents]
        self._write([a for _, a in agents], self._generate(prompts, self.params, "summary"), "debrief")
        for agents_, transcript in zip(groups, transcripts):
            for a in agents_:
                self.bank.agent(a.key).versions[-1]["discussion"] = [list(t) for t in transcript]


def _task_of(tr: Transition) -> str:
    """The task line of a transition's caption (the captioner writes 'Task: ...')."""
    for line in tr.observation.split("\n"):
        if line.startswith("Task: "):
            return line[len("Task: "):]
    return "drive safely."


def lanes_for(scenarios: Sequence[str], seeds: Sequence[int]) -> list[Lane]:
    """One fresh lane per scenario x seed."""
    return [Lane(s, int(seed)) for s in scenarios for seed in seeds]


def save_state(path: str | os.PathLike, lanes: list[Lane], bank: MemoryBank, extra: dict | None = None) -> str:
    """Writes lanes and memories (a resumable learning checkpoint) as one JSON file."""
    from jax_drive.runinfo import write_json

    return write_json(path, {"lanes": [l.to_json() for l in lanes], "bank": bank.to_json(), **(extra or {})})


def load_state(path: str | os.PathLike) -> tuple[list[Lane], MemoryBank, dict]:
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    extra = {k: v for k, v in d.items() if k not in ("lanes", "bank")}
    return [Lane.from_json(x) for x in d["lanes"]], MemoryBank.from_json(d["bank"]), extra


