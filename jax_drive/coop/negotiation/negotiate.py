"""The negotiation rounds: actors speak, the critic sums, scores and criticises.

A :class:`GroupTalk` is one negotiating group of one episode (members in speaking order,
their broadcast :class:`~jax_drive.coop.negotiation.prompts.MemberInfo`, the conversation,
the per-round records). :func:`negotiate` runs every group of every episode that
negotiates at this decision together, round by round:

1. actors: every member of every active group speaks; all of them go to the negotiator in
   ONE batched call (``turns="parallel"``: everyone sees the conversation up to the
   previous round and the messages are appended in speaking order). ``turns="sequential"``
   is the paper's turn taking: one call per speaking position, batched across groups,
   each speaker seeing the earlier speakers of its round;
2. critic: one batched sum-actions call for all active groups (parsed; KEEP below 4 m/s
   becomes FASTER; a member the answer misses keeps its current intention), one batched
   waypoint computation for the summed intentions, one batched consensus call when the
   consensus score is used or logged; scores and feedback per group;
3. a group with critic and no feedback stops; the others go to the next round (at most
   ``max_rounds``; without a critic every group talks for ``rounds_without_critic``).

Negotiators implement three batched methods (:class:`Negotiator`): :class:`LLMNegotiator`
over any :class:`~jax_drive.sampling.Engine` (one ``generate_chat`` per method call), and
the rule-based teacher of :mod:`jax_drive.coop.negotiation.teacher`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Literal, Protocol

import jax
import numpy as np

from jax_drive.coop.negotiation import critic as C
from jax_drive.coop.negotiation import prompts as P
from jax_drive.sampling import SamplingParams

Turns = Literal["parallel", "sequential"]


@dataclasses.dataclass(frozen=True)
class RoundsConfig:
    """How a negotiation runs.

    Attributes:
      critic: the critic's safety / efficiency feedback takes part (with early stopping).
      consensus: the consensus score takes part in the feedback (with early stopping).
      log_consensus: ask for the consensus score for the records even when it does not
        take part (the Fig. 5 curve without critic).
      max_rounds: rounds with a critic (the paper: 3).
      rounds_without_critic: rounds when neither critic part takes part (no stop signal).
      turns: 'parallel' (one actor call per round) or 'sequential' (one per speaking position).
      style: prompt style (:data:`~jax_drive.coop.negotiation.prompts.STYLES`).
      max_words: replies are cut to this many words.
      criteria: the critic's thresholds and weights.
    """

    critic: bool = True
    consensus: bool = True
    log_consensus: bool = False
    max_rounds: int = 3
    rounds_without_critic: int = 1
    turns: Turns = "parallel"
    style: P.PromptStyle = "compact"
    max_words: int = P.MAX_WORDS
    criteria: C.CriticConfig = C.CriticConfig()

    def __post_init__(self):
        if self.turns not in ("parallel", "sequential"):
            raise ValueError(f"turns must be 'parallel' or 'sequential', got {self.turns!r}")
        if self.style not in P.STYLES:
            raise ValueError(f"style must be one of {P.STYLES}, got {self.style!r}")
        if self.max_rounds < 1 or self.rounds_without_critic < 1:
            raise ValueError("max_rounds and rounds_without_critic must be >= 1")

    @property
    def stops_early(self) -> bool:
        return self.critic or self.consensus

    @property
    def rounds(self) -> int:
        return self.max_rounds if self.stops_early else self.rounds_without_critic


@dataclasses.dataclass
class GroupTalk:
    """One negotiating group of one episode.

    Fields:
      episode, time (s); slots (agent slots in speaking order), vids, infos (one
      :class:`MemberInfo` each, same order); default (vid -> speed intention used when the
      critic cannot read a member's action); speeds (vid -> m/s); edges (conflict pairs
      (vid, vid) from the grouping); view (the episode's NumPy view, for rule-based
      negotiators); conversation [(round, vid, text)]; rounds (per-round records);
      feedback (the critic's lines for the next round); intents (vid -> summed speed
      intention of the last round); done; scratch (negotiator-private state).
    """

    episode: int
    time: float
    slots: list[int]
    vids: list[int]
    infos: list[P.MemberInfo]
    default: dict[int, int]
    speeds: dict[int, float]
    edges: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    view: dict | None = None
    conversation: list[tuple[int, int, str]] = dataclasses.field(default_factory=list)
    rounds: list[dict] = dataclasses.field(default_factory=list)
    feedback: list[str] = dataclasses.field(default_factory=list)
    intents: dict[int, int] = dataclasses.field(default_factory=dict)
    done: bool = False
    scratch: dict = dataclasses.field(default_factory=dict)

    def talk(self, upto_round: int | None = None) -> list[tuple[int, int, str]]:
        """(round, vid, text) of the conversation, optionally only rounds < ``upto_round``."""
        return [(r, v, t) for r, v, t in self.conversation if upto_round is None or r < upto_round]

    def last_round(self) -> list[tuple[int, str]]:
        if not self.conversation:
            return []
        last = self.conversation[-1][0]
        return [(v, t) for r, v, t in self.conversation if r == last]

    def record(self) -> dict:
        """JSON-safe summary (time, members, conversation, per-round scores and feedback, outcome,
        messages_cut: replies cut to the word limit or to their first line)."""
        return {"episode": self.episode, "time": round(self.time, 2), "vids": list(self.vids),
                "edges": [list(e) for e in self.edges],
                "conversation": [{"round": r, "vid": v, "text": t} for r, v, t in self.conversation],
                "rounds": self.rounds, "intents": {str(v): P.SPEED_NAMES[i] for v, i in self.intents.items()},
                "messages_cut": int(self.scratch.get("cut", 0))}


class Negotiator(Protocol):
    """Answers batched negotiation requests (one list in, one text per request out)."""

    name: str

    def speak(self, requests: list[tuple[GroupTalk, int, list[tuple[int, int, str]]]]) -> list[str]:
        """(group, member index, (round, vid, text) messages visible to the speaker) -> message."""
        ...

    def sum_actions(self, groups: list[GroupTalk]) -> list[str]: ...

    def consensus(self, groups: list[GroupTalk]) -> list[str]: ...


# ------------------------------------------------------------------------- prompts
def actor_request(group: GroupTalk, k: int, visible: list[tuple[int, int, str]], style: P.PromptStyle) -> list[dict]:
    """Chat messages for member ``k`` of ``group`` given the (round, vid, text) messages it
    sees (the ``compact`` style shows only the latest message of each member)."""
    others = [m for j, m in enumerate(group.infos) if j != k]
    return P.actor_messages(group.infos[k], others, shown_messages(visible, len(group.vids), style),
                            group.feedback, style)


def shown_messages(conversation: list[tuple[int, int, str]], members: int,
                   style: P.PromptStyle) -> list[tuple[int, str]]:
    """(vid, text) of the messages an actor prompt shows: all of them, or in the ``compact``
    style the last ``members`` (with parallel turns exactly the latest round; with sequential
    turns the previous round's later speakers and the current round's earlier ones)."""
    if style == "compact":
        conversation = conversation[-members:]
    return [(v, t) for _, v, t in conversation]


def sum_request(group: GroupTalk, style: P.PromptStyle) -> list[dict]:
    return P.sum_actions_messages(group.vids, group.last_round(), style)


def consensus_request(group: GroupTalk, style: P.PromptStyle) -> list[dict]:
    return P.consensus_messages(shown_messages(group.conversation, len(group.vids), style), style)


@dataclasses.dataclass
class EngineCalls:
    """Engine usage of a negotiator: calls and prompts per request kind."""

    calls: dict = dataclasses.field(default_factory=lambda: {"actor": 0, "sum": 0, "consensus": 0})
    prompts: dict = dataclasses.field(default_factory=lambda: {"actor": 0, "sum": 0, "consensus": 0})
    prompt_tokens: int = 0
    generated_tokens: int = 0


class LLMNegotiator:
    """All three roles from one language model behind an :class:`~jax_drive.sampling.Engine`.

    Every method makes exactly one ``engine.generate_chat`` call for its whole batch.
    Greedy decoding by default (``temperature=0``); ``key`` seeds sampled decoding.

    constrain_answers: sample every answer under its grammar (``sampling.grammar``):
    actor replies one line ``I will ...`` of at most ``max_words`` words, the sum-actions JSON
    with exactly the group's members in order (one grammar per group in the batched call; its
    budget is the grammar's longest answer plus the stop token), the consensus answer ending
    in ``Consensus score: <n>`` (n one of ``consensus_scores``, or 0..100). Default False (the
    paper's unconstrained prompts).

    consensus_readout: 'sampled' (the number the critic wrote) or 'expected' (constrained
    answers over ``consensus_scores`` and a local model only): the expected score under the
    model's masked distribution over the allowed values after its own analysis
    (:func:`~jax_drive.coop.negotiation.consensus.expected_scores`, one extra forward pass per
    call), written into the answer with one decimal; the last call's read-outs (with the
    probabilities) are kept in ``last_readouts``, its answers as sampled in ``last_sampled``.

    critic_engine: the engine of the consensus critic when it is another model than the
    actor's (e.g. the same base model with a critic-only adapter); default ``engine``.
    """

    def __init__(self, engine, style: P.PromptStyle = "compact", *, actor_tokens: int = 40,
                 sum_tokens_per_member: int = 14, consensus_tokens: int = 40, temperature: float = 0.0,
                 key: jax.Array | None = None, name: str = "llm", constrain_answers: bool = False,
                 max_words: int = P.MAX_WORDS, consensus_scores=None, consensus_readout: str = "sampled",
                 critic_engine=None):
        self.engine, self.style, self.name = engine, style, name
        self.critic_engine = engine if critic_engine is None else critic_engine
        self.actor_tokens, self.sum_tokens_per_member, self.consensus_tokens = (
            actor_tokens, sum_tokens_per_member, consensus_tokens)
        self.temperature = temperature
        self.key = jax.random.key(0) if key is None else key
        self.usage = EngineCalls()
        self._n = 0
        self.constrain_answers = bool(constrain_answers)
        self.max_words = int(max_words)
        self.consensus_scores = None if consensus_scores is None else tuple(int(s) for s in consensus_scores)
        if consensus_readout not in ("sampled", "expected"):
            raise ValueError(f"consensus_readout must be 'sampled' or 'expected', got {consensus_readout!r}")
        if consensus_readout == "expected" and not (self.constrain_answers and self.consensus_scores):
            raise ValueError("consensus_readout 'expected' needs constrain_answers and consensus_scores")
        if consensus_readout == "expected" and getattr(self.critic_engine, "model", None) is None:
            raise ValueError("consensus_readout 'expected' needs a local model (engine.model, engine.tokenizer)")
        self.consensus_readout = consensus_readout
        self.last_readouts: list = []
        self.last_sampled: list[str] = []  # the answers as sampled, before the expected score replaced theirs

    def _sum_grammars(self, groups) -> tuple[list, int]:
        """(one sum-actions grammar per group, a budget that holds the longest of them)."""
        from jax_drive.sampling.grammar import sum_actions_grammar
        from jax_drive.sampling.grammar.rows import engine_grammar

        grammars = [sum_actions_grammar(g.vids) for g in groups]
        budget = 16 + self.sum_tokens_per_member * max(len(g.vids) for g in groups)
        for grammar in dict.fromkeys(grammars):
            compiled = engine_grammar(self.engine, grammar)
            if compiled is not None and compiled.max_tokens is not None:
                budget = max(budget, compiled.max_tokens + 1)
        return grammars, budget

    def _complete(self, kind: str, conversations: list[list[dict]], max_new_tokens: int, grammar=None) -> list:
        self._n += 1
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=self.temperature, grammar=grammar)
        engine = self.critic_engine if kind == "consensus" else self.engine
        outs = engine.generate_chat(conversations, params, jax.random.fold_in(self.key, self._n))
        self.usage.calls[kind] += 1
        self.usage.prompts[kind] += len(conversations)
        self.usage.prompt_tokens += sum(len(o.prompt_token_ids) for o in outs)
        self.usage.generated_tokens += sum(o.num_tokens for o in outs)
        return outs

    def _generate(self, kind: str, conversations: list[list[dict]], max_new_tokens: int, grammar=None) -> list[str]:
        return [o.text for o in self._complete(kind, conversations, max_new_tokens, grammar)]

    def speak(self, requests):
        from jax_drive.sampling.grammar import actor_reply_grammar

        grammar = actor_reply_grammar(self.max_words) if self.constrain_answers else None
        return self._generate("actor", [actor_request(g, k, vis, self.style) for g, k, vis in requests],
                              self.actor_tokens, grammar)

    def sum_actions(self, groups):
        conversations = [sum_request(g, self.style) for g in groups]
        if not self.constrain_answers:
            n = max(len(g.vids) for g in groups)
            return self._generate("sum", conversations, 16 + self.sum_tokens_per_member * n)
        grammars, budget = self._sum_grammars(groups)
        return self._generate("sum", conversations, budget, grammars)

    def consensus(self, groups):
        return self.consensus_answers([consensus_request(g, self.style) for g in groups])

    def consensus_answers(self, conversations: list[list[dict]]) -> list[str]:
        """The critic's answers to consensus prompts (chat messages), with the expected score
        in place of the sampled one under the 'expected' read-out."""
        from jax_drive.sampling.grammar import consensus_grammar

        grammar = consensus_grammar(self.consensus_scores) if self.constrain_answers else None
        outs = self._complete("consensus", conversations, self.consensus_tokens, grammar)
        if self.consensus_readout == "sampled":
            return [o.text for o in outs]
        from jax_drive.coop.negotiation.consensus import expected_scores, with_score

        readouts = expected_scores(self.critic_engine.model, self.critic_engine.tokenizer,
                                   [o.prompt_token_ids for o in outs],
                                   [o.text for o in outs], self.consensus_scores)
        self.last_readouts, self.last_sampled = readouts, [o.text for o in outs]
        return [o.text if r.expected is None else with_score(o.text, r.expected) for o, r in zip(outs, readouts)]


class RecordingNegotiator:
    """Wraps a negotiator and keeps every request as a chat example (prompt messages +
    the answer as the assistant turn), tagged by kind: SFT data from a teacher. Actor
    examples carry ``round``, ``feedback`` and ``wrong`` (the inner negotiator's
    ``deliberately_wrong(group)``, False when it has none)."""

    def __init__(self, inner, style: P.PromptStyle = "compact"):
        self.inner, self.style = inner, style
        self.name = f"recording({inner.name})"
        self.examples: list[dict] = []

    def _keep(self, kind, prompts, answers, meta):
        for msgs, answer, m in zip(prompts, answers, meta):
            self.examples.append({"kind": kind, "messages": msgs + [{"role": "assistant", "content": answer}], **m})

    def speak(self, requests):
        answers = self.inner.speak(requests)
        wrong = getattr(self.inner, "deliberately_wrong", lambda g: False)
        self._keep("actor", [actor_request(g, k, vis, self.style) for g, k, vis in requests], answers,
                   [{"round": len(g.rounds), "feedback": bool(g.feedback), "wrong": bool(wrong(g))}
                    for g, _, _ in requests])
        return answers

    def sum_actions(self, groups):
        answers = self.inner.sum_actions(groups)
        self._keep("sum", [sum_request(g, self.style) for g in groups], answers, [{} for _ in groups])
        return answers

    def consensus(self, groups):
        answers = self.inner.consensus(groups)
        self._keep("consensus", [consensus_request(g, self.style) for g in groups], answers, [{} for _ in groups])
        return answers


# --------------------------------------------------------------------------- rounds
def clean_message(text, max_words: int) -> tuple[str, bool]:
    """First non-empty line, quotes stripped, cut to ``max_words`` words; (text, was_cut)."""
    text = text if isinstance(text, str) else ""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    line = line.strip().strip('"').strip("'").strip()
    words = line.split()
    cut = len(words) > max_words or len(lines) > 1
    return " ".join(words[:max_words]), cut


WaypointFn = Callable[[list[GroupTalk], list[dict[int, int]]], list[np.ndarray]]


def negotiate(groups: list[GroupTalk], negotiator, waypoints_for: WaypointFn, cfg: RoundsConfig = RoundsConfig(),
              dt: float = 0.2) -> None:
    """Runs the rounds of every group in place (see the module docstring).

    Args:
      groups: the groups negotiating now (any episodes).
      negotiator: a :class:`Negotiator`.
      waypoints_for: (groups, [vid -> speed intention per group]) -> [(n, W, 2) waypoints per
        group in member order], computed in one batched call.
      cfg: :class:`RoundsConfig`; dt: waypoint spacing (s) for the efficiency score.
    """
    active = [g for g in groups if not g.done]
    for r in range(cfg.rounds):
        if not active:
            break
        # actors
        positions = [None] if cfg.turns == "parallel" else range(max(len(g.slots) for g in active))
        for p in positions:
            # parallel: everyone sees the rounds before this one; sequential: also this round so far
            requests = [(g, k, g.talk() if p is not None else g.talk(r)) for g in active
                        for k in range(len(g.slots)) if p is None or k == p]
            if not requests:
                continue
            answers = negotiator.speak(requests)
            for (g, k, _), text in zip(requests, answers):
                msg, cut = clean_message(text, cfg.max_words)
                g.conversation.append((r, g.vids[k], msg))
                g.scratch.setdefault("cut", 0)
                g.scratch["cut"] += int(cut)
        # critic: sum actions
        raws = negotiator.sum_actions(active)
        summed = []
        for g, raw in zip(active, raws):
            parsed = C.parse_sum_actions(raw, g.vids)
            intents = {v: parsed.intents.get(v, g.intents.get(v, g.default[v])) for v in g.vids}
            intents = C.keep_rule(intents, g.speeds, cfg.criteria)
            summed.append(intents)
            g.rounds.append({"round": r, "sum_raw": raw, "sum_source": parsed.source, "sum_missing": list(parsed.missing),
                             "sum_error": parsed.error,
                             "intents": {str(v): P.SPEED_NAMES[i] for v, i in intents.items()}})
        wps = waypoints_for(active, summed)
        cons_raw = negotiator.consensus(active) if (cfg.consensus or cfg.log_consensus) else [None] * len(active)
        readouts = getattr(negotiator, "last_readouts", None) if cons_raw[0] is not None else None
        probs = [r.probs for r in readouts] if readouts and len(readouts) == len(active) else [()] * len(active)
        for g, intents, wp, raw, p in zip(active, summed, wps, cons_raw, probs):
            g.intents = intents
            cons, cons_err = C.parse_consensus(raw) if raw is not None else (None, None)
            if raw is not None and cons is None:
                cons = 0.0  # an unreadable score counts as no consensus
            scores = C.score_round(g.vids, C.pairwise_safety(wp), C.efficiency_score(wp, dt, cfg.criteria), cons,
                                   use_safety_efficiency=cfg.critic, use_consensus=cfg.consensus,
                                   cfg=cfg.criteria)
            g.feedback = list(scores.feedback)
            if p:
                g.rounds[-1]["consensus_probs"] = [round(x, 4) for x in p]
            g.rounds[-1].update({"consensus_raw": raw, "consensus_error": cons_err, "consensus": scores.consensus,
                                 "safety": scores.safety, "efficiency": scores.efficiency, "quality": scores.quality,
                                 "pair_safety": {f"{i}-{j}": s for (i, j), s in scores.pair_safety.items()},
                                 "feedback": list(scores.feedback)})
            if cfg.stops_early and not scores.feedback:
                g.done = True
        active = [g for g in active if not g.done]
    for g in groups:
        g.done = True
