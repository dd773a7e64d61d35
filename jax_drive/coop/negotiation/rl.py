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
from jax_drive.coop.negotiation import prompts as P
from jax_drive.coop.negotiation.negotiate import GroupTalk, actor_request
from jax_drive.coop.negotiation.policy import CONTROL_5HZ, NegotiatingPolicy, NegotiationConfig
from jax_drive.coop.rl import decision_batch
from jax_drive.coop.runner import EpisodeResult, run_episodes
from jax_drive.rl.advantages import AdvantageConfig, compute_advantages_jit
from jax_drive.rl.checkpoint import RunState
from jax_drive.rl.grpo import GRPOConfig, grpo_update, sampling_grammar_tables
from jax_drive.rl.logging import peak_rss_gb
from jax_drive.rl.loop import LoopConfig, StepOutcome, TrainResult, initial_state, open_checkpointer, restored, train_loop
from jax_drive.rl.loss import LossConfig
from jax_drive.rl.optim import OptimConfig, copy_tree
from jax_drive.rollout import RolloutConfig
from jax_drive.sampling import SamplingParams


# ----------------------------------------------------------------------------- configuration
@dataclasses.dataclass(frozen=True)
class NegotiationRLConfig:
    """Settings of :func:`negotiation_mtgrpo_train`.

    Attributes:
      negotiation: the closed loop (grouping, rounds, critic parts); Table 2's arm (5) by default.
      types: InterDrive training types (cycled); train_seeds: their seeds (cycled within a type).
      group_size: G episodes per group; groups_per_step: groups per trainer step (one batch).
      steps: trainer steps.
      actor_tokens: reply budget; max_words: the reply grammar's word cap; style: prompt style.
      temperature: sampling temperature of the replies (and the trainer's log-prob temperature).
      quality_weight, driving_weight: the turn reward's weights (module docstring).
      advantage, loss, optim: as in GRPOConfig.
      max_rows: replies trained per step at most (a uniform sample; None: all).
      minibatch_size, ppo_epochs, bucket_size, chunk_size: as in GRPOConfig.
      background: background traffic in the training episodes; max_time: optional episode cap, s.
      seed: episode stream, rollouts and row sampling. checkpoint_every, log_every: as in GRPOConfig.
    """

    types: tuple[str, ...] = ()
    train_seeds: tuple[int, ...] = (100,)
    negotiation: NegotiationConfig = NegotiationConfig()
    group_size: int = 4
    groups_per_step: int = 4
    steps: int = 10
    actor_tokens: int = 40
    max_words: int = P.MAX_WORDS
    style: P.PromptStyle = "compact"
    temperature: float = 1.0
    quality_weight: float = 1.0
    driving_weight: float = 1.0
    advantage: AdvantageConfig = AdvantageConfig(mode="mtgrpo_cross")
    loss: LossConfig = LossConfig(kl_coef=0.01)
    optim: OptimConfig = OptimConfig(learning_rate=1e-5)
    max_rows: int | None = 256
    minibatch_size: int = 32
    ppo_epochs: int = 1
    bucket_size: int = 32
    chunk_size: int = 256
    background: bool = False
    max_time: float | None = None
    seed: int = 0
    checkpoint_every: int | None = 5
    log_every: int = 1

    def __post_init__(self):
        if not self.types:
            raise ValueError("types must name at least one InterDrive training type")
        if not self.train_seeds:
            raise ValueError("train_seeds must hold at least one seed")
        if not self.negotiation.negotiate:
            raise ValueError("the negotiation config must negotiate (there is nothing to train otherwise)")
        if self.negotiation.rounds.turns != "parallel":
            raise ValueError("training records one actor call per round: rounds.turns must be 'parallel'")
        at_least(self, 2, "group_size")
        at_least(self, 1, "groups_per_step", "actor_tokens", "minibatch_size", "ppo_epochs", "bucket_size",
                 "chunk_size")
        at_least(self, 0, "steps")
        at_least(self, 0.0, "quality_weight", "driving_weight")
        if self.max_rows is not None and self.max_rows < 1:
            raise ValueError(f"max_rows must be >= 1 or None, got {self.max_rows}")
        if self.temperature <= 0:
            raise ValueError("RL rollouts sample: temperature must be > 0")

    def sampling(self) -> SamplingParams:
        """The actor's decoding: the reply grammar, log pi at the sampling temperature."""
        from jax_drive.sampling.grammar import actor_reply_grammar

        return SamplingParams(max_new_tokens=self.actor_tokens, temperature=self.temperature,
                              logprobs_mode="processed", grammar=actor_reply_grammar(self.max_words))

    def update_config(self) -> GRPOConfig:
        """The :class:`GRPOConfig` of :func:`grpo_update` (its rollout carries the temperature)."""
        rollout = RolloutConfig(group_size=self.group_size, sampling=self.sampling())
        return GRPOConfig(rollout=rollout, advantage=self.advantage, loss=self.loss, optim=self.optim,
                          minibatch_size=self.minibatch_size, ppo_epochs=self.ppo_epochs, steps=self.steps,
                          bucket_size=self.bucket_size, chunk_size=self.chunk_size, seed=self.seed,
                          checkpoint_every=self.checkpoint_every, log_every=self.log_every)


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
class ReplyTokens:
    """One recorded actor reply: where it was said (episode, negotiation time, the group's
    vids, round, member index) and what it was made of (prompt ids, sampled ids with the final
    stop token, one sampler log-prob per sampled id, finish reason)."""

    episode: int
    time: float
    vids: tuple[int, ...]
    round: int
    member: int
    prompt_ids: tuple[int, ...]
    answer_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str

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
            self.records.append(ReplyTokens(
                episode=g.episode, time=g.time, vids=tuple(g.vids), round=len(g.rounds), member=k,
                prompt_ids=tuple(o.prompt_token_ids), answer_ids=tuple(o.token_ids), logprobs=tuple(o.logprobs),
                finish_reason=o.finish_reason))
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

    update = config.update_config()
    engine = JaxEngine(model, tokenizer) if engine is None else engine
    pad_id = int(getattr(tokenizer, "pad_token_id", 0) or 0)
    graphdef, params, rest, state = initial_state(model, config.optim, None, config.seed)
    ref_params = copy_tree(params) if config.loss.uses_reference else None
    ckpt = open_checkpointer(out_dir, "negotiation_mtgrpo")
    state = restored(state, ckpt, resume)
    sampling = config.sampling()
    grammar, grammar_rows = sampling_grammar_tables(tokenizer, model.config.vocab_size, sampling)

    def step(state: RunState) -> StepOutcome:
        rng, k_roll, k_rows, k_mb = jax.random.split(state.rng, 4)
        episodes = training_episodes(config.types, config.train_seeds, state.data_position, config.groups_per_step)
        actor = TrainedActor(engine, critic, sampling, style=config.style, key=k_roll)
        t0 = time.perf_counter()
        results, policy = rollout_groups(actor, config, episodes)
        t1 = time.perf_counter()
        ds = np.asarray([r.metrics["DS"] for r in results], np.float32)
        records = actor.records
        adv, rewards, mask = (reply_advantages(records, policy.log, ds, config.group_size, config) if records
                              else (np.zeros(0, np.float32), np.zeros((1, 1, 1), np.float32), np.zeros((1, 1, 1), bool)))
        chosen = np.arange(len(records))
        if config.max_rows is not None and len(chosen) > config.max_rows:
            chosen = np.sort(np.asarray(jax.random.choice(k_rows, len(chosen), (config.max_rows,), replace=False)))
        if not config.loss.uses_reference:  # rows with advantage 0 then carry no gradient at all
            chosen = chosen[adv[chosen] != 0.0]
        stats = step_stats(results, rewards, mask, actor, policy)
        if len(chosen):
            batch = decision_batch([records[i] for i in chosen], adv[chosen], pad_id, bucket_size=config.bucket_size,
                                   multiple_of=min(config.minibatch_size, len(chosen)), grammar_rows=grammar_rows)
            params, opt_state, metrics = grpo_update(graphdef, state.params, rest, state.opt_state, ref_params,
                                                     batch, update, k_mb, grammar=grammar)
            jax.block_until_ready(params)
        else:
            params, opt_state, metrics = state.params, state.opt_state, {"optimizer_steps": 0}
        t2 = time.perf_counter()
        after = RunState(params=params, opt_state=opt_state, rng=rng, step=state.step + 1,
                         data_position=state.data_position + config.groups_per_step)
        record = {**stats, **metrics, "rows_trained": int(len(chosen)),
                  "advantage_abs_mean": float(np.abs(adv).mean()) if len(adv) else 0.0,
                  "rollout_seconds": t1 - t0, "update_seconds": t2 - t1, "peak_rss_gb": peak_rss_gb}
        finite = {k: metrics[k] for k in ("loss", "grad_norm", "kl") if k in metrics}
        postfix = {"ds": f"{stats['ds']:.1f}", "q": f"{stats['quality_mean']:.2f}",
                   "kl": f"{metrics.get('kl', float('nan')):.4f}"}
        return StepOutcome(after, record, finite=finite, postfix=postfix)

    loop = LoopConfig("negotiation_mtgrpo", config.steps, config.checkpoint_every, config.log_every,
                      config.optim.skip_nonfinite, live_model=True)
    return train_loop(model, state, step, loop, ckpt=ckpt, out_dir=out_dir, resume=resume, progress=progress,
                      on_step=on_step)
