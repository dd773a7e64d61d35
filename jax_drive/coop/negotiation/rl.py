"""mtGRPO for the negotiator: negotiation rounds as turns, the critic's scores as turn rewards.

CoLMDriver's actor-critic loop feeds the critic's text back into the prompt; no weight moves.
Here the actor (the negotiator that speaks) is trained by gradient from the critic's scores.
One trainer step (:func:`negotiation_mtgrpo_train`):

1. **Groups.** ``groups_per_step`` InterDrive episodes of the training seeds
   (:func:`training_episodes`), each repeated G times: the G copies share their scenario
   key, so they start from the same state, and differ only by the actor's sampled replies.
   All of them drive as ONE batch of the closed loop (:class:`NegotiatingPolicy`); every
   negotiation round of every group of every episode is ONE actor call
   (``turns='parallel'``).
2. **Actor and critic.** :class:`TrainedActor` speaks from the live model and keeps every
   reply's prompt ids, sampled ids and sampler log-probs (under the reply grammar, at the
   sampling temperature); the critic roles (sum actions, consensus) come from a frozen
   negotiator (the SFT start): the reward giver does not move while the actor learns.
3. **Turns and rewards.** An episode's turns are its negotiation rounds in order (its
   negotiations in time order, each one's rounds in order). Turn t's reward
   (:func:`turn_rewards`) is ``quality_weight * q_t + driving_weight * DS / 100``: ``q_t``
   the critic's quality of the round (its weighted consensus, safety and efficiency,
   divided by the weights' sum, in [0, 1]) and DS the episode's driving score. The driving
   score sits on every turn, not only the last: under ``mtgrpo_cross`` a reward only on the
   last turn would rank last turns above the others whatever they said.
4. **Advantages.** The project's estimators (``mtgrpo_cross`` by default, ``mtgrpo_intra``,
   ``grpo``) over the G episodes of each group; every reply of a round gets its turn's
   advantage.
5. **Update.** One row ``prompt + reply`` per recorded reply (:func:`jax_drive.coop.rl.decision_batch`),
   at most ``max_rows`` per step, through :func:`jax_drive.rl.grpo.grpo_update` under the
   reply grammar's masks, K3 KL to the start policy.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from typing import Callable

import jax
import numpy as np

from jax_drive.configs import at_least
from jax_drive.coop.agent import AnswerTokens
from jax_drive.coop.negotiation import prompts as P
from jax_drive.coop.negotiation.negotiate import GroupTalk, actor_request
from jax_drive.coop.negotiation.policy import CONTROL_5HZ, NegotiatingPolicy, NegotiationConfig
from jax_drive.coop.rl import RecordUpdateSettings, record_step, record_trainer, train_on_records
from jax_drive.coop.runner import EpisodeResult, run_episodes
from jax_drive.rl.advantages import AdvantageConfig, compute_advantages_jit
from jax_drive.rl.checkpoint import RunState
from jax_drive.rl.loop import LoopConfig, StepOutcome, TrainResult, train_loop
from jax_drive.sampling import SamplingParams


# ----------------------------------------------------------------------------- configuration
@dataclasses.dataclass(frozen=True)
class NegotiationRLConfig(RecordUpdateSettings):
    """Settings of :func:`negotiation_mtgrpo_train` (the update's in
    :class:`~jax_drive.coop.rl.RecordUpdateSettings`; here mtGRPO across turns by default).

    Attributes:
      types: InterDrive training types (cycled); train_seeds: their seeds (cycled within a type).
      negotiation: the closed loop (grouping, rounds, critic parts); Table 2's arm (5) by default.
      groups_per_step: groups per trainer step (one closed-loop batch).
      actor_tokens: reply budget; max_words: the reply grammar's word cap; style: prompt style.
      temperature: sampling temperature of the replies (and the trainer's log-prob temperature).
      quality_weight, driving_weight: the turn reward's weights (module docstring).
      background: background traffic in the training episodes; max_time: optional episode cap, s.
    """

    types: tuple[str, ...] = ()
    train_seeds: tuple[int, ...] = (100,)
    negotiation: NegotiationConfig = NegotiationConfig()
    groups_per_step: int = 4
    actor_tokens: int = 40
    max_words: int = P.MAX_WORDS
    style: P.PromptStyle = "compact"
    temperature: float = 1.0
    quality_weight: float = 1.0
    driving_weight: float = 1.0
    background: bool = False
    max_time: float | None = None
    steps: int = 10
    advantage: AdvantageConfig = AdvantageConfig(mode="mtgrpo_cross")
    max_rows: int | None = 256
    minibatch_size: int = 32

    def __post_init__(self):
        if not self.types:
            raise ValueError("types must name at least one InterDrive training type")
        if not self.train_seeds:
            raise ValueError("train_seeds must hold at least one seed")
        if not self.negotiation.negotiate:
            raise ValueError("the negotiation config must negotiate (there is nothing to train otherwise)")
        if self.negotiation.rounds.turns != "parallel":
            raise ValueError("training records one actor call per round: rounds.turns must be 'parallel'")
        super().__post_init__()
        at_least(self, 1, "groups_per_step", "actor_tokens")
        at_least(self, 0.0, "quality_weight", "driving_weight")
        if self.temperature <= 0:
            raise ValueError("RL rollouts sample: temperature must be > 0")

    def answer_sampling(self) -> SamplingParams:
        """The actor's decoding: the reply grammar, log pi at the sampling temperature."""
        from jax_drive.sampling.grammar import actor_reply_grammar

        return SamplingParams(max_new_tokens=self.actor_tokens, temperature=self.temperature,
                              logprobs_mode="processed", grammar=actor_reply_grammar(self.max_words))


# ----------------------------------------------------------------------------- episodes
@dataclasses.dataclass(frozen=True)
class TrainingEpisode:
    """One InterDrive training episode: type, seed, index k (key ``fold_in(key(seed), k)``,
    accident-prone when k is even)."""

    type: str
    seed: int
    k: int

    @property
    def key(self) -> jax.Array:
        return jax.random.fold_in(jax.random.key(int(self.seed)), int(self.k))

    @property
    def accident_prone(self) -> bool:
        return self.k % 2 == 0


def training_episodes(types: Sequence[str], seeds: Sequence[int], start: int, count: int) -> list[TrainingEpisode]:
    """Episodes ``start .. start + count`` of the endless training stream: episode n is type
    ``types[n % T]``, seed ``seeds[(n // T) % S]``, index ``n // (T * S)`` (so consecutive rounds
    over the seeds alternate accident-prone and safe)."""
    t, s = len(types), len(seeds)
    return [TrainingEpisode(types[n % t], int(seeds[(n // t) % s]), n // (t * s)) for n in range(start, start + count)]


def group_copies(episodes: Sequence[TrainingEpisode], group_size: int) -> list[TrainingEpisode]:
    """Each episode repeated ``group_size`` times, group-major: copy ``p * G + i`` is rollout i
    of group p (the same key: the same initial state)."""
    return [ep for ep in episodes for _ in range(group_size)]


# ----------------------------------------------------------------------------- actor
@dataclasses.dataclass(frozen=True)
class ReplyTokens(AnswerTokens):
    """One recorded actor reply (:class:`~jax_drive.coop.agent.AnswerTokens`) and where it was
    said: episode, negotiation time, the group's vids, round, member index."""

    episode: int
    time: float
    vids: tuple[int, ...]
    round: int
    member: int

    @property
    def turn_key(self) -> tuple:
        return turn_key(self.episode, self.time, self.vids, self.round)


def turn_key(episode: int, t: float, vids, rnd: int) -> tuple:
    """Names one round of one negotiation (groups of an episode at one time are disjoint)."""
    return int(episode), round(float(t), 2), tuple(int(v) for v in vids), int(rnd)


class TrainedActor:
    """A negotiator whose actor replies come from ``engine`` (the live model, every reply
    recorded in ``records``) and whose critic roles come from ``critic`` (a frozen
    :class:`~jax_drive.coop.negotiation.negotiate.LLMNegotiator`; the rule teacher sums only
    what it said itself, so it cannot judge another actor).

    Each :meth:`speak` is ONE ``engine.generate_chat`` call (counted in ``actor_calls``);
    call n samples with ``fold_in(key, n)``, every row with its own randomness.
    """

    def __init__(self, engine, critic, sampling: SamplingParams, *, style: P.PromptStyle = "compact",
                 key: jax.Array | None = None, name: str = "mtgrpo"):
        self.engine, self.critic, self.sampling, self.style, self.name = engine, critic, sampling, style, name
        self.key = jax.random.key(0) if key is None else key
        self.records: list[ReplyTokens] = []
        self.actor_calls = 0

    @property
    def last_readouts(self):
        return getattr(self.critic, "last_readouts", None)

    def speak(self, requests: list[tuple[GroupTalk, int, list]]) -> list[str]:
        conversations = [actor_request(g, k, visible, self.style) for g, k, visible in requests]
        self.actor_calls += 1
        outs = self.engine.generate_chat(conversations, self.sampling, jax.random.fold_in(self.key, self.actor_calls))
        for (g, k, _), o in zip(requests, outs):
            self.records.append(ReplyTokens(episode=g.episode, time=g.time, vids=tuple(g.vids), round=len(g.rounds),
                                            member=k, **AnswerTokens.fields_of(o)))
        return [o.text for o in outs]

    def sum_actions(self, groups):
        return self.critic.sum_actions(groups)

    def consensus(self, groups):
        return self.critic.consensus(groups)


# ----------------------------------------------------------------------------- rewards
def round_quality(round_record: dict, weights: Sequence[float]) -> float:
    """A round's critic quality divided by the weights' sum: in [0, 1]."""
    return float(round_record["quality"]) / float(sum(weights))


def turn_rewards(log: Sequence[dict], driving_scores: np.ndarray, group_size: int, weights: Sequence[float],
                 quality_weight: float = 1.0, driving_weight: float = 1.0) -> tuple[np.ndarray, np.ndarray, dict]:
    """Negotiation rounds as turns.

    Args:
      log: the policy's negotiation records (``NegotiatingPolicy.log``: episode, time, vids,
        rounds with their ``quality``), in the order they happened.
      driving_scores: (E,) each episode's DS (0..100), E = P * G episodes group-major.
      group_size: G. weights: the critic's (consensus, safety, efficiency) weights.
      quality_weight, driving_weight: the reward's weights.
    Returns:
      rewards (P, G, T) float32, turn_mask (P, G, T) bool, and {turn_key: (episode, turn index)}.
    """
    e_count = len(driving_scores)
    if e_count % group_size:
        raise ValueError(f"{e_count} episodes do not split into groups of {group_size}")
    turns: list[list[tuple[tuple, float]]] = [[] for _ in range(e_count)]
    for rec in log:
        for r in rec["rounds"]:
            key = turn_key(rec["episode"], rec["time"], rec["vids"], r["round"])
            turns[int(rec["episode"])].append((key, round_quality(r, weights)))
    depth = max([len(t) for t in turns] + [1])
    rewards = np.zeros((e_count, depth), np.float32)
    mask = np.zeros((e_count, depth), bool)
    index = {}
    for e, taken in enumerate(turns):
        for j, (key, quality) in enumerate(taken):
            rewards[e, j] = quality_weight * quality + driving_weight * float(driving_scores[e]) / 100.0
            mask[e, j] = True
            index[key] = (e, j)
    shape = (e_count // group_size, group_size, depth)
    return rewards.reshape(shape), mask.reshape(shape), index


def reply_advantages(records: Sequence[ReplyTokens], log: Sequence[dict], driving_scores: np.ndarray,
                     group_size: int, config: NegotiationRLConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(R,) every recorded reply's advantage (its round's turn advantage over the episode's
    group), and the rewards (P, G, T) and turn mask behind them. A reply whose round the log
    does not hold (cannot happen in one closed-loop run) raises."""
    weights = config.negotiation.rounds.criteria.weights
    rewards, mask, index = turn_rewards(log, driving_scores, group_size, weights, config.quality_weight,
                                        config.driving_weight)
    adv = np.asarray(compute_advantages_jit(rewards, mask, config.advantage)).reshape(len(driving_scores), -1)
    missing = [r.turn_key for r in records if r.turn_key not in index]
    if missing:
        raise ValueError(f"{len(missing)} replies have no round in the negotiation log, e.g. {missing[0]}")
    return np.asarray([adv[index[r.turn_key]] for r in records], np.float32), rewards, mask


# ----------------------------------------------------------------------------- rollouts and trainer
def rollout_groups(actor: TrainedActor, config: NegotiationRLConfig, episodes: Sequence[TrainingEpisode], *,
                   progress: Callable[[int], None] | None = None) -> tuple[list[EpisodeResult], NegotiatingPolicy]:
    """G copies of every episode as one closed-loop batch under ``actor`` (records cleared first)."""
    actor.records = []
    policy = NegotiatingPolicy(actor, config.negotiation, name="mtgrpo")
    copies = group_copies(episodes, config.group_size)
    results, _ = run_episodes([ep.type for ep in copies], [ep.key for ep in copies],
                              accident_prone=[ep.accident_prone for ep in copies], policy=policy,
                              background=config.background, cfg=CONTROL_5HZ, progress=progress,
                              max_time=config.max_time)
    return results, policy


def step_stats(results: Sequence[EpisodeResult], rewards: np.ndarray, mask: np.ndarray, actor: TrainedActor,
               policy: NegotiatingPolicy) -> dict:
    """A step's driving and negotiation figures: DS, SR (percent), collisions, negotiations,
    rounds, replies, their mean length in characters, replies cut at the token budget, mean
    turn reward and round quality."""
    ds = np.asarray([r.metrics["DS"] for r in results], np.float64)
    rounds = [r for rec in policy.log for r in rec["rounds"]]
    texts = [m["text"] for rec in policy.log for m in rec["conversation"]]
    return {"ds": float(ds.mean()), "sr": 100.0 * float(np.mean([bool(r.metrics["success"]) for r in results])),
            "episodes": len(results), "negotiations": len(policy.log), "rounds": len(rounds),
            "replies": len(actor.records), "actor_calls": actor.actor_calls,
            "reply_chars_mean": float(np.mean([len(t) for t in texts])) if texts else 0.0,
            "replies_at_budget": sum(r.finish_reason == "length" for r in actor.records),
            "turn_reward_mean": float(rewards[mask].mean()) if mask.any() else 0.0,
            "quality_mean": float(np.mean([r["quality"] for r in rounds])) if rounds else 0.0}


def negotiation_mtgrpo_train(model, tokenizer, critic, config: NegotiationRLConfig, *, engine=None,
                             out_dir: str | os.PathLike | None = None, resume: bool = False, progress: bool = True,
                             on_step: Callable[[RunState, dict], None] | None = None) -> TrainResult:
    """Trains the actor ``model`` in place with mtGRPO on negotiation rounds.

    Args:
      model: the actor's CausalLM (LoRA applied for ``optim.trainable == 'lora'``); the default
        engine samples from it live. tokenizer: its tokenizer.
      critic: the frozen critic roles (sum actions, consensus): an LLMNegotiator over a frozen
        copy of the start model.
      config: :class:`NegotiationRLConfig`; engine: optional engine reading the live model.
      out_dir: metrics.jsonl, tb/, checkpoints/ (None: nothing written); resume: continue from
        its latest checkpoint. progress, on_step: as in :func:`jax_drive.rl.grpo.grpo_train`.
    Returns:
      TrainResult with one record per step.
    """
    from jax_drive.sampling import JaxEngine

    engine = JaxEngine(model, tokenizer) if engine is None else engine
    sampling = config.answer_sampling()
    trainer, state, ckpt = record_trainer(model, tokenizer, config, sampling, "negotiation_mtgrpo", out_dir, resume)

    def step(state: RunState) -> StepOutcome:
        rng, k_roll, k_rows, k_mb = jax.random.split(state.rng, 4)
        episodes = training_episodes(config.types, config.train_seeds, state.data_position, config.groups_per_step)
        actor = TrainedActor(engine, critic, sampling, style=config.style, key=k_roll)
        t0 = time.perf_counter()
        results, policy = rollout_groups(actor, config, episodes)
        t1 = time.perf_counter()
        ds = np.asarray([r.metrics["DS"] for r in results], np.float32)
        records = actor.records
        if records:
            adv, rewards, mask = reply_advantages(records, policy.log, ds, config.group_size, config)
        else:  # no episode negotiated: nothing to train
            adv, rewards, mask = np.zeros(0, np.float32), np.zeros((1, 1, 1), np.float32), np.zeros((1, 1, 1), bool)
        stats = step_stats(results, rewards, mask, actor, policy)
        update = train_on_records(trainer, state, records, adv, k_rows, k_mb)
        seconds = {"rollout_seconds": t1 - t0, "update_seconds": time.perf_counter() - t1}
        return record_step(state, rng, config.groups_per_step, update, stats, adv, seconds,
                           {"ds": f"{stats['ds']:.1f}", "q": f"{stats['quality_mean']:.2f}"})

    loop = LoopConfig("negotiation_mtgrpo", config.steps, config.checkpoint_every, config.log_every,
                      config.optim.skip_nonfinite, live_model=True)
    return train_loop(model, state, step, loop, ckpt=ckpt, out_dir=out_dir, resume=resume, progress=progress,
                      on_step=on_step)
