"""LLM driving agents (TalkingVehicles / CoopReflect): prompts, the JSON action parser and a
batched :class:`~jax_drive.coop.policy.Policy` that asks an engine once per decision.

Per decision an agent gets a prompt built from the seed's parts (Section 4.1):

* role and task (system message): what it drives, the seven commands, the answer format;
* in-context knowledge ``K`` and cooperative strategy ``S`` (from :mod:`jax_drive.coop.memory`);
* retrieved corrected decisions (Correction+RAG, optional);
* the captioner's observation (:func:`jax_drive.sim.observe.caption`);
* received messages with sender and age (when communication is on);
* an optional chain-of-thought instruction (reason in a sentence or two, then the JSON).

and answers ``{"command": ..., "message": ...}``. The *compact* style (the distilled
policy) replaces all of that by one short observation line (:func:`compact_observation`)
and a one-line JSON answer: the distilled model has learnt the role, so it needs no role text,
which keeps prompts around 40 tokens.

Parsing never raises (:func:`parse_action`): a malformed answer gives typed failures, the
documented fallback command ``keep`` (:data:`FALLBACK_COMMAND`: continue the previous command)
and a count in the policy's per-episode failure counters.

:class:`LanguagePolicy` sends every active agent of every live episode to the engine in ONE
``generate_chat`` call per decision; the replay records get the prompt, raw answer, parsed
action, message, latency and token counts through ``PolicyOutput.info``.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
import time
from collections.abc import Callable
from typing import Literal

import jax
import numpy as np

from jax_drive.configs import at_least, one_of
from jax_drive.coop.messages import Message
from jax_drive.coop.policy import DecisionBatch, PolicyOutput
from jax_drive.sampling import SamplingParams
from jax_drive.sim import observe
from jax_drive.sim.state import CMD_NAMES, Behaviour, Cmd
from jax_drive.text.json_answer import extract_json_object

# The seven high-level commands of the simulator, by the names agents write.
COMMANDS: dict[str, Cmd] = {CMD_NAMES[c]: c for c in (Cmd.GO, Cmd.STOP, Cmd.SLOW_DOWN, Cmd.SPEED_UP,
                                                    Cmd.LANE_LEFT, Cmd.LANE_RIGHT, Cmd.KEEP)}
# On any answer without a usable command the agent keeps its previous command (the
# simulator's KEEP): the least surprising action, neither braking nor accelerating.
FALLBACK_COMMAND = Cmd.KEEP
# The seed keeps messages under ~300 bytes per decision; longer ones are cut there.
MAX_MESSAGE_BYTES = 300

# Typed parse failures (each counted per episode).
NOT_A_STRING = "not_a_string"
TEXT_TOO_LONG = "text_too_long"
NO_JSON = "no_json"
UNCLOSED_JSON = "unclosed_json"
MALFORMED_JSON = "malformed_json"
MISSING_COMMAND = "missing_command"
UNKNOWN_COMMAND = "unknown_command"
BAD_MESSAGE = "bad_message"
MESSAGE_TOO_LONG = "message_too_long"
FAILURES = (NOT_A_STRING, TEXT_TOO_LONG, NO_JSON, UNCLOSED_JSON, MALFORMED_JSON, MISSING_COMMAND,
            UNKNOWN_COMMAND, BAD_MESSAGE, MESSAGE_TOO_LONG)
_JSON_ERRORS = {"not a string": NOT_A_STRING, "text too long": TEXT_TOO_LONG, "no JSON object": NO_JSON,
                "unclosed JSON object": UNCLOSED_JSON, "malformed JSON object": MALFORMED_JSON}
_SEPARATORS = re.compile(r"[\s_\-]+")
_SPACES = re.compile(r"\s+")


@dataclasses.dataclass(frozen=True)
class AgentAction:
    """A parsed answer.

    Fields: command (a :class:`Cmd`, :data:`FALLBACK_COMMAND` when none was usable); message
    (plain one-line text, "" for none); failures (typed failures, empty when the answer was
    clean); command_text (the command as written, "" when absent).
    """

    command: Cmd
    message: str
    failures: tuple[str, ...] = ()
    command_text: str = ""

    @property
    def ok(self) -> bool:
        return not self.failures


def normalise_command(text: str) -> str:
    """'Change_Lane-LEFT.' -> 'change lane left' (case, separators, end punctuation)."""
    return _SEPARATORS.sub(" ", text.strip().lower()).strip(" .!;:,\"'")


def cut_utf8(text: str, max_bytes: int) -> str:
    """The longest prefix of ``text`` whose UTF-8 encoding fits in ``max_bytes``."""
    return text.encode("utf-8")[:max_bytes].decode("utf-8", errors="ignore")


def parse_action(text, max_message_bytes: int = MAX_MESSAGE_BYTES) -> AgentAction:
    """Parses a model answer into an :class:`AgentAction`; never raises.

    Rules: the first JSON object of ``text`` (:func:`extract_json_object`); its ``command``
    must name one of :data:`COMMANDS` up to case, ``_``/``-``/spaces and end punctuation
    (else ``missing_command`` / ``unknown_command`` and the fallback command); ``message``
    may be absent or null (no message), must otherwise be a string (else ``bad_message``, no
    message), is flattened to one line and cut to ``max_message_bytes`` UTF-8 bytes
    (``message_too_long``; the command still counts).
    """
    answer = extract_json_object(text)
    if not answer.ok:
        return AgentAction(FALLBACK_COMMAND, "", (_JSON_ERRORS.get(answer.error, MALFORMED_JSON),))
    value = answer.value
    failures = []
    raw = value.get("command")
    command_text = raw if isinstance(raw, str) else ""
    command = COMMANDS.get(normalise_command(command_text)) if command_text else None
    if command is None:
        failures.append(MISSING_COMMAND if raw is None or (isinstance(raw, str) and not raw.strip())
                        else UNKNOWN_COMMAND)
        command = FALLBACK_COMMAND
    message = value.get("message")
    if message is None:
        message = ""
    elif not isinstance(message, str):
        failures.append(BAD_MESSAGE)
        message = ""
    message = _SPACES.sub(" ", message).strip()
    if len(message.encode("utf-8")) > max_message_bytes:
        failures.append(MESSAGE_TOO_LONG)
        message = cut_utf8(message, max_message_bytes).strip()
    return AgentAction(command, message, tuple(failures), command_text[:64])


def format_action(command: Cmd | str, message: str = "", compact: bool = False) -> str:
    """The JSON answer for a command and message (the format :func:`parse_action` reads).
    compact: no spaces and no empty message key (the distilled policy's short answers)."""
    name = command if isinstance(command, str) else CMD_NAMES[Cmd(int(command))]
    if compact:
        body = '{"command":"%s"' % name
        if message:
            body += ',"message":%s' % _json_string(message)
        return body + "}"
    return '{"command": "%s", "message": %s}' % (name, _json_string(message))


def _json_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


# ----------------------------------------------------------------------------- prompts
ROLE_TEXT = ("You drive Vehicle {vid} ({kind}). {radio}Every 0.5 s choose a command: go, stop, slow down, "
             "speed up, change lane left, change lane right, keep. Avoid collisions and finish your task in time.")
RADIO_TEXT = "Send short messages to nearby vehicles: share what they cannot see and agree who goes first. "
SILENT_TEXT = "You have no radio. "
STOPPED_ROLE_TEXT = ("You are Vehicle {vid}, a stopped {kind} that cannot move. You see traffic others may not "
                     "see: help them with short messages.")
ANSWER_TEXT = 'Answer with JSON only: {{"command": "<command>"{message}}}.'
ANSWER_MESSAGE = ', "message": "<short message or empty>"'
COT_TEXT = "First reason in one or two short sentences about the risks, then give the JSON."
DIRECT_TEXT = "Give the JSON now."


def is_stopped(view: dict, i: int) -> bool:
    """A focal vehicle that cannot move (commands ignored; it only talks)."""
    return int(view["behaviour"][i]) != Behaviour.POLICY


def latest_per_sender(messages: list[tuple[float, int, str]]) -> list[tuple[float, int, str]]:
    """(age, sender, text) keeping only each sender's newest message, newest first."""
    newest: dict[int, tuple[float, int, str]] = {}
    for age, sender, text in messages:
        if sender not in newest or age < newest[sender][0]:
            newest[sender] = (age, sender, text)
    return sorted(newest.values(), key=lambda m: m[0])


@dataclasses.dataclass(frozen=True)
class AgentContext:
    """Per-agent in-context material: knowledge K, cooperative strategy S and retrieved
    examples (observation, corrected answer) for Correction+RAG."""

    knowledge: str = ""
    strategy: str = ""
    examples: tuple[tuple[str, str], ...] = ()


EMPTY_CONTEXT = AgentContext()


def full_prompt(view: dict, i: int, messages: list[tuple[float, int, str]], *, communicate: bool,
                chain_of_thought: bool, context: AgentContext = EMPTY_CONTEXT) -> list[dict]:
    """The chat prompt of the LLM agent (system: role and format; user: task, knowledge,
    strategy, examples, observation, messages, instruction).

    messages: (age_s, sender_vid, text) as the message bus gives them (ignored when silent).
    """
    vid, kind = int(view["vehicle_id"][i]), "truck" if view["kind"][i] else "car"
    if is_stopped(view, i):
        role = STOPPED_ROLE_TEXT.format(vid=vid, kind=kind)
    else:
        role = ROLE_TEXT.format(vid=vid, kind=kind, radio=RADIO_TEXT if communicate else SILENT_TEXT)
    system = role + " " + ANSWER_TEXT.format(message=ANSWER_MESSAGE if communicate else "")
    parts = [f"Task: {observe.task_text(view, i)}"]
    if context.knowledge:
        parts.append(f"Knowledge: {context.knowledge}")
    if context.strategy:
        parts.append(f"Cooperative strategy: {context.strategy}")
    for obs, answer in context.examples:
        parts.append(f"A similar past situation:\n{obs}\nGood answer: {answer}")
    parts.append("Observation:\n" + observe.caption(view, i))
    if communicate:
        if messages:
            parts.append("Messages received:\n" + "\n".join(
                f"[{age:.1f} s ago] Vehicle {sender}: {text}" for age, sender, text in messages))
        else:
            parts.append("Messages received: none.")
    parts.append(COT_TEXT if chain_of_thought else DIRECT_TEXT)
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(parts)}]


_TURN = {0: "go straight", 1: "turn right", 2: "turn left", 3: "follow the lane"}


def compact_task(view: dict, i: int) -> str:
    """A few words of task: stopped / return right / change left|right (now or in d m) /
    go straight / turn left|right."""
    if is_stopped(view, i):
        return "stopped, report traffic"
    lane, goal = int(view["lane"][i]), int(view["goal_lane"][i])
    if lane != goal:
        if view["lane_label"][lane] < 0:
            return "in the opposite lane, return right"
        side = "left" if view["lane_left"][lane] == goal else "right"
        ahead = float(view["lc_arc"][i] - view["lane_arc"][i])
        return f"change {side} " + (f"in {ahead:.0f} m" if ahead > 0.5 else "now")
    task = _TURN.get(int(view["lane_maneuver"][lane]), "follow the lane")
    left = int(view["lane_left"][lane])
    if left >= 0 and view["lane_label"][left] < 0:
        task += ", opposite lane on the left"
    return task


def describe_vehicle(view: dict, i: int, j: int) -> str:
    """'truck 22 m ahead stopped' / 'car 51 m ahead-left oncoming 9 m/s' (j seen from i)."""
    dx, dy = float(view["x"][j] - view["x"][i]), float(view["y"][j] - view["y"][i])
    kind = "truck" if view["kind"][j] else "car"
    where = observe.sector(np.arctan2(dy, dx) - float(view["heading"][i]))
    v = float(view["speed"][j])
    if v < 0.5:
        state = "stopped"
    else:
        motion = observe.relative_motion(float(view["heading"][j] - view["heading"][i]))
        state = {"towards you": "oncoming", "in the same direction": "same way", "across your path": "crossing"}[
            motion] + f" {v:.0f} m/s"
    return f"{kind} {np.hypot(dx, dy):.0f} m {where} {state}"


def compact_observation(view: dict, i: int, messages: list[tuple[float, int, str]], max_seen: int = 3) -> str:
    """The distilled policy's whole prompt: own speed and task, the nearest seen vehicles and
    each sender's latest message, e.g.
    ``car 7 m/s, go straight, opposite lane on the left. truck 22 m ahead stopped. 199: car oncoming 29 m``.
    """
    kind = "truck" if view["kind"][i] else "car"
    head = f"{kind} {float(view['speed'][i]):.0f} m/s, {compact_task(view, i)}."
    seen = sorted(np.flatnonzero(view["visible"][i]),
                  key=lambda j: np.hypot(view["x"][j] - view["x"][i], view["y"][j] - view["y"][i]))[:max_seen]
    parts = [head] + [describe_vehicle(view, i, int(j)) + "." for j in seen]
    parts += [f"{sender}: {text}" for _, sender, text in latest_per_sender(messages)]
    return " ".join(parts)


def compact_prompt(view: dict, i: int, messages: list[tuple[float, int, str]], *, communicate: bool,
                   **_) -> list[dict]:
    """The distilled policy's chat: one user turn holding :func:`compact_observation`."""
    return [{"role": "user", "content": compact_observation(view, i, messages if communicate else [])}]


PROMPT_STYLES: dict[str, Callable[..., list[dict]]] = {"full": full_prompt, "compact": compact_prompt}


# ----------------------------------------------------------------------------- the policy
@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """How language agents prompt and decode.

    Attributes:
      style: 'full' (role, memory, caption, messages; zero-shot and learning methods) or
        'compact' (the distilled policy's one-line observation).
      communicate: read and send messages (False: the *Silent* setting; stopped vehicles,
        which can only talk, are then not asked at all).
      chain_of_thought: ask for a short reasoning before the JSON (full style only).
      temperature: sampling temperature (seed: 0.2).
      max_new_tokens: answer budget; a cut-off answer is a parse failure.
      max_message_bytes: longer messages are cut (typed failure ``message_too_long``).
      answer_prefix: text the answer is forced to start with, e.g. ``'{"command": "'``
        (written after the chat template's generation prompt; the model continues it and
        the parser reads prefix + continuation). Small models that ignore the answer format
        then still pick a command. Needs an engine with a local chat template
        (``engine.tokenizer``); "" = off (the seed's protocol).
      constrain_answers: sample every answer under the action grammar
        (``sampling.grammar.action_grammar``: ``{"command": <one of the seven>, "message":
        <at most max_message_chars characters>}``, ``{"command": ...}`` alone when silent,
        with a one-line reasoning of at most ``max_reasoning_chars`` before it when
        ``chain_of_thought``), so every answer parses.
        The answer budget is then derived from the grammar, not ``max_new_tokens``: its
        fewest tokens over the engine's tokenizer plus the message (and reasoning) cap plus
        the stop token. Default False (the seed's unconstrained protocol).
      max_message_chars: the grammar's message cap in characters (TalkingVehicles keeps
        messages short; 80).
      max_reasoning_chars: the grammar's cap on the chain-of-thought sentence.
    """

    style: Literal["full", "compact"] = "full"
    communicate: bool = True
    chain_of_thought: bool = False
    temperature: float = 0.2
    max_new_tokens: int = 48
    max_message_bytes: int = MAX_MESSAGE_BYTES
    answer_prefix: str = ""
    constrain_answers: bool = False
    max_message_chars: int = 80
    max_reasoning_chars: int = 240

    def __post_init__(self):
        one_of("style", self.style, sorted(PROMPT_STYLES))
        at_least(self, 1, "max_new_tokens", "max_message_bytes")
        if self.max_message_chars < 0 or self.max_reasoning_chars < 1:
            raise ValueError("max_message_chars must be >= 0 and max_reasoning_chars >= 1")
        if self.constrain_answers and self.answer_prefix:
            raise ValueError("answer_prefix and constrain_answers both fix how the answer starts: use one")

    @property
    def sampling(self) -> SamplingParams:
        """The unconstrained decoding settings (``LanguagePolicy.sampling`` adds the grammar)."""
        return SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature)

    def answer_grammar(self):
        """The grammar of every answer (None unless ``constrain_answers``)."""
        if not self.constrain_answers:
            return None
        from jax_drive.sampling.grammar import Grammar, action_grammar

        # the silent prompt asks for {"command": ...} alone
        action = action_grammar(tuple(COMMANDS), self.max_message_chars if self.communicate else None)
        if not self.chain_of_thought:
            return action
        return Grammar.regex(f"(?:[^{{}}\\x00-\\x1f]{{1,{self.max_reasoning_chars}}} )?{action.pattern}")

    def answer_budget(self, engine) -> int:
        """Tokens per answer: with ``constrain_answers``, the grammar's fewest tokens over the
        engine's tokenizer (the shortest command, an empty message) plus the characters the
        longest command and the message (and reasoning) cap add, plus one for the stop token
        (a token spells at least one character; where the tokenizer needs several tokens for a
        character, the finish-in-budget mask shortens the message); else ``max_new_tokens``."""
        grammar = self.answer_grammar()
        if grammar is None:
            return self.max_new_tokens
        from jax_drive.sampling.grammar.rows import engine_grammar

        compiled = engine_grammar(engine, grammar)
        if compiled is None:
            raise ValueError("constrain_answers needs an engine with a local tokenizer (engine.tokenizer) to size "
                             "the answer budget")
        commands = [len(c) for c in COMMANDS]
        extra = max(commands) - min(commands) + (self.max_message_chars if self.communicate else 0)
        extra += self.max_reasoning_chars + 1 if self.chain_of_thought else 0
        budget = compiled.min_tokens + extra + 1
        return budget if compiled.max_tokens is None else min(budget, compiled.max_tokens + 1)


@dataclasses.dataclass
class CallRecord:
    """One engine call: decision index, agents asked, wall seconds, prompt / new tokens."""

    decision: int
    agents: int
    seconds: float
    prompt_tokens: int
    new_tokens: int

    @property
    def per_agent(self) -> float:
        """Batch wall time divided by the agents in the batch (the issue's decision cost)."""
        return self.seconds / max(self.agents, 1)


@dataclasses.dataclass(frozen=True)
class AnswerTokens:
    """What one sampled answer was made of, for training on it: prompt_ids (the templated
    prompt as the engine tokenized it), answer_ids (sampled ids, a final stop token included),
    logprobs (one per answer id, the sampler's), finish_reason ('stop' / 'length')."""

    prompt_ids: tuple[int, ...]
    answer_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str

    @staticmethod
    def fields_of(completion) -> dict:
        """The answer fields of an engine ``Completion``."""
        return {"prompt_ids": tuple(completion.prompt_token_ids), "answer_ids": tuple(completion.token_ids),
                "logprobs": tuple(completion.logprobs), "finish_reason": completion.finish_reason}


@dataclasses.dataclass(frozen=True)
class DecisionTokens(AnswerTokens):
    """One agent's answer at one decision (:class:`AnswerTokens`) and where it was given:
    episode, agent (slot), decision index."""

    episode: int
    agent: int
    decision: int


ContextFn = Callable[[DecisionBatch, np.ndarray], list[AgentContext]]


class LanguagePolicy:
    """A language-model driver for every focal agent (see the module docstring).

    Args:
      engine: an :class:`~jax_drive.sampling.Engine` (``generate_chat``).
      config: :class:`AgentConfig`.
      key: PRNG key; decision d samples with ``fold_in(key, call index)``.
      context: optional ``context(batch, rows) -> [AgentContext]`` giving each asked agent
        (rows (N, 2) of (episode, slot)) its knowledge, strategy and retrieved examples.
      name: shown in results.
      record_tokens: keep a :class:`DecisionTokens` of every answer in ``decisions`` (the RL
        trainer's rows; :mod:`jax_drive.coop.rl`).

    State: ``calls`` (one :class:`CallRecord` per engine call, kept until :meth:`reset`),
    ``decisions`` (with ``record_tokens``, also until :meth:`reset`), ``failures``
    {episode: Counter of typed failures and ``cut_off`` answers} and ``commands`` {episode:
    Counter of the commands taken, fallbacks included} of the current batch of episodes
    (both cleared at its first decision).
    """

    def __init__(self, engine, config: AgentConfig = AgentConfig(), key=None, context: ContextFn | None = None,
                 name: str = "llm", record_tokens: bool = False):
        self.engine = engine
        self.config = config
        self.key = jax.random.key(0) if key is None else key
        self.context = context
        self.name = name
        self.record_tokens = record_tokens
        self.decisions: list[DecisionTokens] = []
        self.calls: list[CallRecord] = []
        self.failures: dict[int, collections.Counter] = {}
        self.commands: dict[int, collections.Counter] = {}
        self._count = 0
        if config.answer_prefix and getattr(engine, "tokenizer", None) is None:
            raise ValueError("answer_prefix needs an engine with a local chat template (engine.tokenizer)")
        # every call's decoding settings: with constrain_answers the grammar and its budget
        self.sampling = config.sampling.replace(max_new_tokens=config.answer_budget(engine),
                                                grammar=config.answer_grammar())

    def reset(self) -> None:
        """Forget call records, recorded tokens, failure and command counters (before a new batch of episodes)."""
        self.calls, self.failures, self.commands, self.decisions = [], {}, {}, []

    def rows(self, batch: DecisionBatch) -> np.ndarray:
        """(N, 2) agents to ask: every live focal agent; when silent, not the stopped ones."""
        if self.config.communicate:
            return batch.agents
        keep = [not is_stopped(batch.views[int(e)], int(i)) for e, i in batch.agents]
        return batch.agents[np.asarray(keep, bool)] if len(batch.agents) else batch.agents

    def _generate(self, prompts: list[list[dict]], key) -> list:
        """One engine call for every prompt; with an answer prefix, the templated prompts
        end in the prefix and go through ``generate``."""
        cfg = self.config
        if not cfg.answer_prefix:
            return self.engine.generate_chat(prompts, self.sampling, key)
        tok = self.engine.tokenizer
        texts = [tok.apply_chat_template(p, add_generation_prompt=True) + cfg.answer_prefix for p in prompts]
        return self.engine.generate(texts, self.sampling, key)

    def decide(self, batch: DecisionBatch) -> PolicyOutput:
        out = PolicyOutput.keep(batch)
        rows = self.rows(batch)
        if batch.decision == 0:  # a new batch of episodes: episode indices start again
            self.failures, self.commands = {}, {}
        if len(rows) == 0:
            return out
        cfg = self.config
        inboxes = {(int(e), int(i)): (batch.buses[int(e)].texts(int(i), batch.time) if cfg.communicate else [])
                   for e, i in rows}
        contexts = self.context(batch, rows) if self.context is not None else [EMPTY_CONTEXT] * len(rows)
        build = PROMPT_STYLES[cfg.style]
        prompts = [build(batch.views[int(e)], int(i), inboxes[(int(e), int(i))], communicate=cfg.communicate,
                         chain_of_thought=cfg.chain_of_thought, context=ctx) for (e, i), ctx in zip(rows, contexts)]
        key = jax.random.fold_in(self.key, self._count)
        self._count += 1
        start = time.perf_counter()
        completions = self._generate(prompts, key)  # ONE call for all agents
        seconds = time.perf_counter() - start
        record = CallRecord(decision=batch.decision, agents=len(rows), seconds=seconds,
                            prompt_tokens=sum(len(c.prompt_token_ids) for c in completions),
                            new_tokens=sum(c.num_tokens for c in completions))
        self.calls.append(record)
        for (e, i), prompt, completion in zip(rows, prompts, completions):
            e, i = int(e), int(i)
            view = batch.views[e]
            answer = cfg.answer_prefix + completion.text
            action = parse_action(answer, cfg.max_message_bytes)
            out.command[e, i] = action.command
            out.target_speed[e, i] = float(view["cruise_speed"][i])
            talks = cfg.communicate and action.message and bool(view["transceiver"][i])
            if talks:
                out.messages.setdefault(e, []).append(Message(sender=i, sender_vid=int(view["vehicle_id"][i]),
                                                              time=batch.time, text=action.message))
            if self.record_tokens:
                self.decisions.append(DecisionTokens(episode=e, agent=i, decision=batch.decision,
                                                     **AnswerTokens.fields_of(completion)))
            counter = self.failures.setdefault(e, collections.Counter())
            counter.update(action.failures)
            if completion.finish_reason == "length":
                counter["cut_off"] += 1
            self.commands.setdefault(e, collections.Counter())[CMD_NAMES[action.command]] += 1
            out.info[(e, i)] = {
                "prompt": prompt, "answer": answer, "command": CMD_NAMES[action.command],
                "message": action.message if talks else "", "failures": list(action.failures),
                "finish_reason": completion.finish_reason, "prompt_tokens": len(completion.prompt_token_ids),
                "new_tokens": completion.num_tokens, "batch_seconds": seconds, "agent_seconds": record.per_agent,
                "student_observation": compact_observation(view, i, inboxes[(e, i)]),
            }
        return out
