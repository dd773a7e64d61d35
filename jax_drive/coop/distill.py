"""Distillation: successful talking episodes -> chat SFT data -> a compact SmolLM2 policy.

Sources of successful episodes:
  * the rule-based cooperative baseline turned into language (:class:`LanguageRuleTeacher`):
    its commands, plus messages written in natural language from what its structured
    payload holds (a moving sender's intent, the moving vehicles a stopped observer sees that
    do not talk themselves, e.g. "Car oncoming, 29 m."; "All clear." once they are gone), optionally
    with exploration noise on the executed commands (:class:`Explore`, DART-style: the label
    stays the teacher's command, so the data also covers states just off the teacher's path);
  * the learning loop (:class:`~jax_drive.coop.agent.LanguagePolicy` replay records);
  * the student itself driving with the teacher labelling every state it visits
    (:class:`TeacherLabels`, DAgger: Ross et al. 2011), so the data covers the states the
    student's own mistakes lead to; these episodes are kept whether or not they succeed,
    since the labels are the teacher's.

Each decision of every focal agent of a successful episode becomes one chat sample: the user
turn is the agent's :func:`~jax_drive.coop.agent.compact_observation`, the assistant turn the
compact JSON answer. The student keeps SmolLM2's tokenizer with a minimal chat template
(:data:`COMPACT_TEMPLATE`: the user text and a newline, then the answer and ``<|im_end|>``),
so a decision prompt is ~40 tokens instead of ~300. Training goes through the project's
SFT trainer (:func:`jax_drive.rl.sft.sft_train`).

Evaluation episodes never enter the data: every sample carries its episode's
:class:`~jax_drive.coop.learning.EpisodeSpec` tag, the builders refuse specs of the
``eval`` split, and :func:`check_disjoint` verifies a data set against evaluation specs.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from collections.abc import Sequence

import numpy as np

from jax_drive.coop.agent import compact_observation, format_action, is_stopped
from jax_drive.coop.baselines import HORIZON, RuleBasedPolicy
from jax_drive.coop.learning import EpisodeSpec, episode_success, run_specs
from jax_drive.coop.messages import Message, MessageBus
from jax_drive.coop.policy import DecisionBatch, PolicyOutput
from jax_drive.coop.replay import Transition
from jax_drive.coop.runner import EpisodeResult
from jax_drive.rl.sft import SFTConfig
from jax_drive.sim import observe
from jax_drive.sim.state import CMD_NAMES, Behaviour, Cmd

# The distilled policy's chat template: "<observation>\n" then "<answer><eos>".
COMPACT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token }}{% else %}{{ message['content'] + '\n' }}{% endif %}{% endfor %}"
)
_INTENT = {0: "Going straight", 1: "Turning right", 2: "Turning left", 3: "Changing lanes"}
MAX_HAZARDS = 2


# ----------------------------------------------------------------------------- language teacher
def talks(view: dict, j: int) -> bool:
    """A focal vehicle with a transceiver that moves (it reports itself)."""
    return bool(view["transceiver"][j]) and int(view["behaviour"][j]) == Behaviour.POLICY


def hazard_sentence(view: dict, i: int, j: int) -> str:
    """Vehicle j as sender i describes it: 'Car oncoming, 29 m.'"""
    dx, dy = float(view["x"][j] - view["x"][i]), float(view["y"][j] - view["y"][i])
    where = observe.sector(np.arctan2(dy, dx) - float(view["heading"][i]))
    motion = observe.relative_motion(float(view["heading"][j] - view["heading"][i]))
    if motion == "towards you":
        rel = "oncoming"
    elif motion == "in the same direction":
        rel = "behind me" if "behind" in where else "beside me" if where in ("to the left", "to the right") else "ahead of me"
    else:
        rel = "crossing from my " + ("left" if "left" in where else "right")
    kind = "Truck" if view["kind"][j] else "Car"
    return f"{kind} {rel}, {np.hypot(dx, dy):.0f} m."


def hazards(view: dict, i: int) -> list[str]:
    """What a stopped observer i reports: the nearest moving vehicles it sees that do not
    talk themselves (at most :data:`MAX_HAZARDS`)."""
    seen = [int(j) for j in np.flatnonzero(view["visible"][i]) if view["speed"][j] >= 0.5 and not talks(view, int(j))]
    seen.sort(key=lambda j: np.hypot(view["x"][j] - view["x"][i], view["y"][j] - view["y"][i]))
    return [hazard_sentence(view, i, j) for j in seen[:MAX_HAZARDS]]


def intent(view: dict, i: int, command: int) -> str:
    """A moving talker's intent: yielding while it brakes or waits, else its manoeuvre."""
    if command in (Cmd.STOP, Cmd.SLOW_DOWN):
        return "Yielding, slowing down."
    if command in (Cmd.LANE_LEFT, Cmd.LANE_RIGHT):
        return "Changing lanes."
    return _INTENT.get(int(view["lane_maneuver"][int(view["lane"][i])]), "Going straight") + "."


class LanguageRuleTeacher(RuleBasedPolicy):
    """The cooperative rule-based baseline, talking in natural language.

    Commands are the baseline's, computed from the baseline's structured payloads, which
    travel on a private bus per episode with the public bus's delivery rules (radius, one
    decision delay, TTL), so the decisions are exactly the baseline's. The public messages
    (what other agents and the student read) are natural language, sent only when they carry
    news: a stopped observer reports the moving vehicles it sees that do not talk ("Car
    oncoming, 29 m.") at every decision, and "All clear." once when they are gone; a moving
    talker states its intent ("Yielding, slowing down.", "Changing lanes.", "Going
    straight.") when it changes. Every asked agent's ``info`` holds the labels
    (``label_command``, ``label_message``) and its ``student_observation``.
    """

    name = "rule_based_language"

    def __init__(self, horizon: float = HORIZON):
        super().__init__(horizon)
        self._buses: dict[int, MessageBus] = {}
        self._last: dict[tuple[int, int], str] = {}

    def _payload_inboxes(self, batch: DecisionBatch, e: int) -> list[list[Message]]:
        view = batch.views[e]
        if batch.decision == 0 or e not in self._buses:
            cfg = batch.cfg
            self._buses[e] = MessageBus(cfg.max_agents, cfg.comm_radius, cfg.message_ttl)
        bus = self._buses[e]
        present = view["valid"] & (view["success_step"] < 0)
        bus.deliver(batch.time, np.stack([view["x"], view["y"]], -1), view["transceiver"], present)
        return [bus.inbox(i, batch.time) for i in range(batch.cfg.max_agents)]

    def decide(self, batch: DecisionBatch) -> PolicyOutput:
        if batch.decision == 0:
            self._buses, self._last = {}, {}
        out = PolicyOutput.keep(batch)
        for e in map(int, batch.episodes):
            view = batch.views[e]
            command, speed, payloads = self.act(view, self._payload_inboxes(batch, e))
            out.command[e], out.target_speed[e] = command, speed
            for m in payloads:
                self._buses[e].post(m)
            texts = []
            for m in payloads:
                i = m.sender
                if is_stopped(view, i):
                    found = hazards(view, i)
                    text = " ".join(found) if found else ("All clear." if self._last.get((e, i), "All clear.")
                                                          != "All clear." else "")
                else:
                    said = intent(view, i, int(command[i]))
                    text = said if said != self._last.get((e, i)) else ""
                if text:
                    self._last[(e, i)] = text
                    texts.append(dataclasses.replace(m, text=text, data=None))
            out.messages[e] = texts
        for e, i in batch.agents:
            e, i = int(e), int(i)
            sent = next((m.text for m in out.messages.get(e, []) if m.sender == i), "")
            out.info[(e, i)] = {
                "label_command": CMD_NAMES[Cmd(int(out.command[e, i]))], "label_message": sent,
                "student_observation": compact_observation(batch.views[e], i, batch.buses[e].texts(i, batch.time)),
            }
        return out


class Explore:
    """Wraps a policy and, with probability ``epsilon`` per decision, replaces a moving agent's
    executed command by a random one of ``commands`` (the labels in ``info`` stay the inner
    policy's). ``rng``: a NumPy generator (or seed)."""

    def __init__(self, policy, epsilon: float, rng=0,
                 commands: Sequence[Cmd] = (Cmd.GO, Cmd.STOP, Cmd.SLOW_DOWN, Cmd.SPEED_UP)):
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError("epsilon must be in [0, 1]")
        self.policy, self.epsilon, self.commands = policy, float(epsilon), tuple(commands)
        self.rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        self.name = f"{policy.name}+explore{epsilon:g}"

    def decide(self, batch: DecisionBatch) -> PolicyOutput:
        out = self.policy.decide(batch)
        for e, i in batch.agents:
            e, i = int(e), int(i)
            if is_stopped(batch.views[e], i) or self.rng.random() >= self.epsilon:
                continue
            out.command[e, i] = self.commands[int(self.rng.integers(len(self.commands)))]
            out.info.setdefault((e, i), {})["explored"] = CMD_NAMES[Cmd(int(out.command[e, i]))]
        return out


# ----------------------------------------------------------------------------- data
@dataclasses.dataclass(frozen=True)
class DistillSample:
    """One chat sample with its provenance (episode tag, source, vehicle, decision)."""

    observation: str
    answer: str
    scenario: str
    episode: str
    source: str
    vehicle_id: int = 0
    step: int = 0
    executed: str = ""  # the command the acting policy drove when it was not the label's (DAgger)

    def chat(self) -> dict:
        return {"messages": [{"role": "user", "content": self.observation},
                             {"role": "assistant", "content": self.answer}]}


def _refuse_eval(specs: Sequence[EpisodeSpec]) -> None:
    bad = [s.tag for s in specs if s.split == "eval"]
    if bad:
        raise ValueError(f"evaluation episodes may not become distillation data: {bad[:3]}")


def samples_from_episodes(specs: Sequence[EpisodeSpec], results: Sequence[EpisodeResult],
                          transitions: Sequence[Transition], source: str, *,
                          successful_only: bool = True, mark_disagreements: bool = False) -> list[DistillSample]:
    """Chat samples from every decision of every focal agent of the *successful* episodes
    (of every episode when not ``successful_only``: teacher-labelled student runs).

    Labels: ``info['label_command'/'label_message']`` (teacher) or the executed
    ``info['command'/'message']`` (language policies). ``mark_disagreements``: a decision
    whose executed command (``tr.command``) differs from its label records it in
    ``executed``. Raises ValueError for eval specs.
    """
    specs = list(specs)
    _refuse_eval(specs)
    if len(results) != len(specs):
        raise ValueError("one result per spec is needed")
    good = {n for n, r in enumerate(results) if episode_success(r) or not successful_only}
    out = []
    for tr in transitions:
        if tr.episode not in good or "student_observation" not in tr.info:
            continue
        info = tr.info
        command = info.get("label_command", info.get("command", tr.command))
        message = info.get("label_message", info.get("message", tr.message))
        executed = tr.command if mark_disagreements and tr.command != command else ""
        spec = specs[tr.episode]
        out.append(DistillSample(info["student_observation"], format_action(command, message, compact=True),
                                 spec.scenario, spec.tag, source, tr.vehicle_id, tr.step, executed))
    return out


def collect_teacher(specs: Sequence[EpisodeSpec], *, epsilon: float = 0.0, seed: int = 0,
                    progress=None) -> tuple[list[DistillSample], list[EpisodeResult]]:
    """Runs the language teacher (with exploration ``epsilon``) on ``specs`` in one batch and
    returns the samples of its successful episodes and every episode result."""
    specs = list(specs)
    _refuse_eval(specs)
    teacher = LanguageRuleTeacher()
    policy = Explore(teacher, epsilon, seed) if epsilon > 0 else teacher
    results, transitions = run_specs(specs, policy, record=True, progress=progress)
    return samples_from_episodes(specs, results, transitions, policy.name), results


def teacher_data(scenarios: Sequence[str], seeds: Sequence[int], epsilons: Sequence[float], episodes: int, *,
                 keep_fraction: float) -> tuple[list[DistillSample], list[dict], dict]:
    """The distillation data: the teacher drives ``episodes`` ``distill`` episodes per scenario
    for each seed (with that seed's exploration epsilon); its decisions are deduplicated and
    the informative ones kept (:func:`select_informative`).

    Returns (samples, one record per teacher run {seed, epsilon, episodes, successful}, the
    raw data's :func:`data_summary`)."""
    samples, runs = [], []
    for seed, eps in zip(seeds, epsilons, strict=True):
        specs = [EpisodeSpec(s, int(seed), k, "distill") for s in scenarios for k in range(episodes)]
        found, results = collect_teacher(specs, epsilon=eps, seed=seed)
        samples += found
        runs.append({"seed": seed, "epsilon": eps, "episodes": len(results),
                     "successful": int(sum(episode_success(r) for r in results))})
    raw = data_summary(samples)
    return select_informative(dedupe(samples, 1), keep_fraction=keep_fraction), runs, raw


class TeacherLabels:
    """DAgger's data collector: ``student`` (a batched policy, e.g. the distilled
    :class:`~jax_drive.coop.agent.LanguagePolicy`) drives and talks; a
    :class:`LanguageRuleTeacher` looks at the same decision batch and its command and message
    become the labels (``info['label_command'/'label_message']``) of every asked agent. The
    teacher's structured payloads still travel on its private buses, so its labels are what
    it would decide in the student's state if the other vehicles were teachers too."""

    def __init__(self, student, teacher: LanguageRuleTeacher | None = None):
        self.student, self.teacher = student, teacher or LanguageRuleTeacher()
        self.name = f"{getattr(student, 'name', 'student')}+teacher_labels"

    def decide(self, batch: DecisionBatch) -> PolicyOutput:
        labels = self.teacher.decide(batch)
        out = self.student.decide(batch)
        for e, i in batch.agents:
            key = (int(e), int(i))
            label = labels.info[key]
            info = out.info.setdefault(key, {})
            info.update(label_command=label["label_command"], label_message=label["label_message"])
            info.setdefault("student_observation", label["student_observation"])
        return out


def collect_student(student, specs: Sequence[EpisodeSpec], *, progress=None, max_time: float | None = None
                    ) -> tuple[list[DistillSample], list[EpisodeResult]]:
    """Runs ``student`` with teacher labels (:class:`TeacherLabels`) on ``specs`` in one
    batch; returns the labelled samples of every episode (failed ones too) and the results.
    ``max_time``: optional cap on the episodes' length, s (quick checks)."""
    specs = list(specs)
    _refuse_eval(specs)
    policy = TeacherLabels(student)
    results, transitions = run_specs(specs, policy, record=True, progress=progress, max_time=max_time)
    return samples_from_episodes(specs, results, transitions, policy.name, successful_only=False,
                                 mark_disagreements=True), results


def dedupe(samples: Sequence[DistillSample], max_repeats: int = 2) -> list[DistillSample]:
    """Keeps at most ``max_repeats`` samples per identical (observation, answer) pair (waiting
    and cruising decisions repeat for many steps), in their original order."""
    seen: collections.Counter = collections.Counter()
    out = []
    for s in samples:
        seen[(s.observation, s.answer)] += 1
        if seen[(s.observation, s.answer)] <= max_repeats:
            out.append(s)
    return out


def select_informative(samples: Sequence[DistillSample], *, window: int = 3, keep_fraction: float = 0.25,
                       seed: int = 0) -> list[DistillSample]:
    """Keeps the decisions that teach something and a random ``keep_fraction`` of the rest.

    A sample is informative when its answer carries a message, when the acting policy drove
    another command than the label (``executed``: DAgger's corrections), or when the same
    agent's command differs from this one within ``window`` decisions (the moments around a
    stop, a yield, a lane change or a restart); long runs of identical cruising or waiting
    decisions are thinned. Order is preserved.
    """
    if not 0.0 <= keep_fraction <= 1.0 or window < 0:
        raise ValueError("keep_fraction must be in [0, 1] and window >= 0")
    rng = np.random.default_rng(seed)
    command = [json.loads(s.answer).get("command") for s in samples]
    runs: dict[tuple[str, int], list[int]] = collections.defaultdict(list)
    for n, s in enumerate(samples):
        runs[(s.episode, s.vehicle_id)].append(n)
    keep = np.zeros(len(samples), bool)
    for idx in runs.values():
        idx = sorted(idx, key=lambda n: samples[n].step)
        steps = np.array([samples[n].step for n in idx])
        for a, n in enumerate(idx):
            near = [idx[b] for b in range(len(idx)) if abs(steps[b] - steps[a]) <= window]
            informative = ('"message"' in samples[n].answer or bool(samples[n].executed)
                           or any(command[m] != command[n] for m in near))
            keep[n] = informative or rng.random() < keep_fraction
    return [s for s, k in zip(samples, keep) if k]


def balance_commands(samples: Sequence[DistillSample], min_share: float) -> list[DistillSample]:
    """Repeats the samples of rare commands so that each command makes up about ``min_share``
    of the result (whole copies; commands already at or above it are left alone).

    The teacher cruises and waits far more often than it changes lanes, slows or stops
    (lane changes are ~3 % of its selected decisions), and one epoch of SFT then learns the frequent
    commands only. The copies follow the originals; the SFT trainer shuffles every epoch.
    """
    if not 0.0 <= min_share < 1.0:
        raise ValueError(f"min_share must be in [0, 1), got {min_share}")
    if not min_share or not samples:
        return list(samples)
    by_command: dict[str, list[DistillSample]] = collections.defaultdict(list)
    for s in samples:
        by_command[json.loads(s.answer).get("command")].append(s)
    target = min_share * len(samples)
    extra = []
    for group in by_command.values():
        copies = int(np.ceil(target / len(group))) - 1
        extra += [s for _ in range(max(copies, 0)) for s in group]
    return list(samples) + extra


def check_disjoint(samples: Sequence[DistillSample], eval_specs: Sequence[EpisodeSpec]) -> None:
    """Raises ValueError if any sample comes from an evaluation episode (by tag or split)."""
    tags = {s.tag for s in eval_specs}
    bad = [s.episode for s in samples if s.episode in tags or "/eval/" in s.episode]
    if bad:
        raise ValueError(f"{len(bad)} samples come from evaluation episodes, e.g. {bad[0]}")


def save_samples(samples: Sequence[DistillSample], path: str | os.PathLike) -> str:
    """JSONL: one {"messages": [...], "meta": provenance} per line, written atomically (the
    pipelines take an existing file for a finished stage)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for s in samples:
            meta = {k: v for k, v in dataclasses.asdict(s).items() if k not in ("observation", "answer")}
            f.write(json.dumps({**s.chat(), "meta": meta}, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return os.fspath(path)


def load_samples(path: str | os.PathLike) -> list[DistillSample]:
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                msgs = d["messages"]
                out.append(DistillSample(msgs[0]["content"], msgs[1]["content"], **d["meta"]))
    return out


def data_summary(samples: Sequence[DistillSample]) -> dict:
    """Counts per scenario, source and answer command; mean message bytes."""
    commands = collections.Counter(json.loads(s.answer).get("command", "?") for s in samples)
    messages = [len(json.loads(s.answer).get("message", "").encode()) for s in samples]
    return {"samples": len(samples), "episodes": len({s.episode for s in samples}),
            "by_scenario": dict(collections.Counter(s.scenario for s in samples)),
            "by_source": dict(collections.Counter(s.source for s in samples)),
            "by_command": dict(commands),
            "mean_message_bytes": float(np.mean([m for m in messages if m])) if any(messages) else 0.0}


# ----------------------------------------------------------------------------- the student
def compact_chat_tokenizer(tokenizer):
    """The same tokenizer with :data:`COMPACT_TEMPLATE` as its chat template."""
    from jax_drive.models import Tokenizer

    return Tokenizer(tokenizer.backend, COMPACT_TEMPLATE, tokenizer.eos_token_ids, tokenizer.pad_token_id,
                     tokenizer.bos_token_id, add_bos=tokenizer.add_bos)


@dataclasses.dataclass(frozen=True)
class StudentConfig:
    """Fine-tuning of the distilled policy.

    Attributes:
      sft: the SFT trainer settings (data order seed, steps, lr, full or LoRA).
      lora_rank, lora_alpha: LoRA adapters (rank 0 = full fine-tuning, as in the seed), merged
        into the weights before saving.
      min_command_share: rare commands are repeated up to about this share of the training
        data (:func:`balance_commands`; 0 = the data as selected).
    """

    sft: SFTConfig = SFTConfig()
    lora_rank: int = 0
    lora_alpha: float = 32.0
    min_command_share: float = 0.0

    def __post_init__(self):
        if not 0.0 <= self.min_command_share < 1.0:
            raise ValueError(f"min_command_share must be in [0, 1), got {self.min_command_share}")


def train_student(model, tokenizer, samples: Sequence[DistillSample], config: StudentConfig, out_dir: str,
                  *, progress: bool = True):
    """Fine-tunes ``model`` in place on the samples with the compact chat template and saves
    the merged model and tokenizer to ``out_dir/model`` (loadable with
    ``jax_drive.models.load_pretrained``). Resumes from ``out_dir/sft`` checkpoints.

    Returns (model, compact tokenizer, training history).
    """
    from flax import nnx

    from jax_drive.models.export import save_safetensors
    from jax_drive.models.lora import apply_lora, remove_lora
    from jax_drive.rl.sft import sft_train

    if not samples:
        raise ValueError("no distillation samples")
    chat_tok = compact_chat_tokenizer(tokenizer)
    if config.lora_rank:
        apply_lora(model, rank=config.lora_rank, alpha=config.lora_alpha, rngs=nnx.Rngs(config.sft.seed + 1))
    rows = [s.chat() for s in balance_commands(samples, config.min_command_share)]
    result = sft_train(model, rows, config.sft, tokenizer=chat_tok,
                       out_dir=os.path.join(out_dir, "sft"), resume=True, progress=progress)
    if config.lora_rank:
        remove_lora(model, merge=True)
    save_safetensors(model, os.path.join(out_dir, "model"), tokenizer=chat_tok)
    return model, chat_tok, result.history
