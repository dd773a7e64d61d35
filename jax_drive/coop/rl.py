"""Gradient RL for talking language drivers: GRPO over groups of cooperative episodes.

One trainer step (:func:`coop_grpo_train`):

1. **Groups.** ``groups_per_step`` episode specs of the ``rl`` split (scenario, seed, index),
   each repeated G times (:func:`group_specs`). The G episodes of a group share their scenario
   key, so they start from the same state; they differ only by the sampler's draws (every row
   of an engine call samples with its own randomness). All groups run as ONE batch of the
   simulator with ONE engine call per decision for every live focal agent of every episode
   (parameters shared across agents: a row per agent per decision).
2. **Records.** The policy keeps every answer's prompt ids, sampled ids and the sampler's
   (masked) log-probs (:class:`~jax_drive.coop.agent.DecisionTokens`).
3. **Returns.** CoopReflect's objective is the focal population's joint reward: each
   episode's return is the mean over its reward-eligible focal agents of
   ``success * [arrived in time without collision] - collision * [collided]``
   (:func:`joint_returns`); every agent of the episode, a stopped one that only talks
   included, gets that return. A message that helps another agent arrive raises its
   sender's return: messages are tokens of the same answer and train by the same advantage.
4. **Advantages.** Decisions are turns: decision d of episode e has reward
   ``R_e - step_cost * (decisions of e after d)`` (returns-to-go of an optional per-decision
   cost; 0 by default, then every decision carries R_e) and the project's estimators
   (:func:`jax_drive.rl.advantages.compute_advantages`: ``grpo``, ``mtgrpo_intra``,
   ``mtgrpo_cross``) normalise over the G episodes of each group (:func:`decision_advantages`).
5. **Update.** Rows ``prompt + answer`` with the decision's advantage on every answer token
   (:func:`decision_batch`), at most ``max_rows`` of them (a uniform sample of the step's
   decisions, bounding the update's cost), go through :func:`jax_drive.rl.grpo.grpo_update`:
   the clipped loss with K3 KL to the starting policy, under the same grammar masks the
   sampler applied (constrained action answers).
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
from jax_drive.coop.agent import AgentConfig, AnswerTokens, DecisionTokens, LanguagePolicy
from jax_drive.coop.learning import EpisodeSpec, run_specs
from jax_drive.coop.runner import EpisodeResult
from jax_drive.data.tokens import TokenRow
from jax_drive.rl.advantages import AdvantageConfig, compute_advantages_jit
from jax_drive.rl.batching import bucket_length, pad_rows
from jax_drive.rl.checkpoint import RunState
from jax_drive.rl.grpo import GRPOConfig, grpo_update, sampling_grammar_tables
from jax_drive.rl.logging import peak_rss_gb
from jax_drive.rl.loop import LoopConfig, StepOutcome, TrainResult, initial_state, open_checkpointer, restored, train_loop
from jax_drive.rl.loss import LossConfig
from jax_drive.rl.optim import OptimConfig, copy_tree
from jax_drive.rollout import RolloutConfig
from jax_drive.sampling import SamplingParams
from jax_drive.sim import metrics as M
from jax_drive.sim.variations import variation_scale


# ----------------------------------------------------------------------------- configuration
@dataclasses.dataclass(frozen=True)
class ReturnConfig:
    """The joint return of an episode (see the module docstring).

    Attributes:
      success: weight of an eligible agent's arrival (averaged over the eligible agents).
      collision: penalty of an eligible agent's collision (averaged likewise; 0 = the seed's
        success-only objective).
      step_cost: cost per decision, summed from each decision to the episode's end (0: none).
    """

    success: float = 1.0
    collision: float = 0.0
    step_cost: float = 0.0

    def __post_init__(self):
        at_least(self, 0.0, "success", "collision", "step_cost")


@dataclasses.dataclass(frozen=True)
class RecordUpdateSettings:
    """The update settings of a trainer that learns from recorded answers (:func:`record_trainer`);
    the base of :class:`CoopRLConfig` and of the negotiator's
    :class:`~jax_drive.coop.negotiation.rl.NegotiationRLConfig`.

    Attributes:
      group_size: G episodes per group (same start, different draws).
      steps: trainer steps.
      advantage: the estimator over each group.
      loss: clip and KL to the starting policy. optim: optimiser (LoRA or full).
      max_rows: answers trained per step at most (a uniform sample; None: all).
      minibatch_size: rows per optimiser step; ppo_epochs: passes over the step's rows.
      bucket_size: padded row lengths are multiples of this; chunk_size: log-prob chunk.
      seed: episode stream, rollouts and row sampling.
      checkpoint_every, log_every: as in GRPOConfig.
    """

    group_size: int = 4
    steps: int = 20
    advantage: AdvantageConfig = AdvantageConfig(mode="grpo")
    loss: LossConfig = LossConfig(kl_coef=0.01)
    optim: OptimConfig = OptimConfig(learning_rate=1e-5)
    max_rows: int | None = 512
    minibatch_size: int = 64
    ppo_epochs: int = 1
    bucket_size: int = 32
    chunk_size: int = 256
    seed: int = 0
    checkpoint_every: int | None = 5
    log_every: int = 1

    def __post_init__(self):
        at_least(self, 2, "group_size")
        at_least(self, 1, "minibatch_size", "ppo_epochs", "bucket_size", "chunk_size")
        at_least(self, 0, "steps")
        if self.max_rows is not None and self.max_rows < 1:
            raise ValueError(f"max_rows must be >= 1 or None, got {self.max_rows}")

    def answer_sampling(self) -> SamplingParams:
        """The decoding the recorded answers were drawn with (its temperature is the trainer's)."""
        raise NotImplementedError

    def update_config(self) -> GRPOConfig:
        """The :class:`GRPOConfig` of :func:`grpo_update` (its rollout only carries the
        sampling the trainer scores tokens under)."""
        rollout = RolloutConfig(group_size=self.group_size, sampling=self.answer_sampling())
        return GRPOConfig(rollout=rollout, advantage=self.advantage, loss=self.loss, optim=self.optim,
                          minibatch_size=self.minibatch_size, ppo_epochs=self.ppo_epochs, steps=self.steps,
                          bucket_size=self.bucket_size, chunk_size=self.chunk_size, seed=self.seed,
                          checkpoint_every=self.checkpoint_every, log_every=self.log_every)


@dataclasses.dataclass(frozen=True)
class CoopRLConfig(RecordUpdateSettings):
    """Settings of :func:`coop_grpo_train` (the update's in :class:`RecordUpdateSettings`).

    Attributes:
      agent: prompts and decoding of every agent (its ``temperature`` is the rollouts' and the
        trainer's log-prob temperature; ``constrain_answers`` for well-formed actions).
      scenarios: training scenarios (cycled).
      groups_per_step: groups per trainer step (all run as one simulator batch).
      returns: the joint return.
      max_time: optional cap on training episodes' length, s.
      variation: the world the training episodes run in (:mod:`jax_drive.sim.variations`;
        'nominal', or a scaled world where the start policy still fails).
    """

    agent: AgentConfig = AgentConfig(style="compact", temperature=1.0, constrain_answers=True, max_message_chars=40)
    scenarios: tuple[str, ...] = ()
    groups_per_step: int = 6
    returns: ReturnConfig = ReturnConfig()
    max_time: float | None = None
    variation: str = "nominal"

    def __post_init__(self):
        if not self.scenarios:
            raise ValueError("scenarios must name at least one training scenario")
        variation_scale(self.variation)  # ValueError naming the choices
        super().__post_init__()
        at_least(self, 1, "groups_per_step")
        if self.agent.temperature <= 0:
            raise ValueError("RL rollouts sample: agent.temperature must be > 0")

    def answer_sampling(self) -> SamplingParams:
        return self.agent.sampling


# ----------------------------------------------------------------------------- groups
def training_specs(scenarios: Sequence[str], seed: int, start: int, count: int,
                   variation: str = "nominal") -> list[EpisodeSpec]:
    """Episodes ``start .. start + count`` of the endless ``rl`` stream of ``seed`` (in the
    world ``variation``): episode k
    is scenario ``scenarios[k % S]`` in round ``r = k // S``, with index ``2 r + (r + k % S) % 2``
    (an even index is accident-prone): each scenario alternates accident-prone and safe from
    round to round, and consecutive scenarios of a round alternate too, so a step's groups mix
    both. Keys of the ``rl`` split never meet the evaluation's."""
    s = len(scenarios)
    return [EpisodeSpec(scenarios[k % s], int(seed), 2 * (k // s) + (k // s + k % s) % 2, split="rl",
                        variation=variation) for k in range(start, start + count)]


def group_specs(specs: Sequence[EpisodeSpec], group_size: int) -> list[EpisodeSpec]:
    """Each spec repeated ``group_size`` times, group-major: episode ``p * G + i`` is rollout i
    of group p (the same scenario key: the same initial state)."""
    return [spec for spec in specs for _ in range(group_size)]


# ----------------------------------------------------------------------------- returns
def joint_returns(results: Sequence[EpisodeResult], config: ReturnConfig = ReturnConfig()) -> np.ndarray:
    """(E,) each episode's joint return: the mean over its reward-eligible focal agents of
    ``success * arrived - collision * collided`` (0 for an episode without eligible agents)."""
    out = np.zeros(len(results), np.float32)
    for e, result in enumerate(results):
        if result.outcomes:
            arrived = np.mean([o.outcome == M.SUCCESS for o in result.outcomes])
            collided = np.mean([o.outcome == M.COLLISION for o in result.outcomes])
            out[e] = config.success * arrived - config.collision * collided
    return out


def decision_rewards(returns: np.ndarray, decisions: Sequence[DecisionTokens], group_size: int,
                     step_cost: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decisions as turns.

    Args:
      returns: (E,) joint returns, E = P * G episodes group-major.
      decisions: the recorded answers (any order).
      group_size: G.
      step_cost: per-decision cost, summed to the episode's end.
    Returns:
      rewards (P, G, D) float32, turn_mask (P, G, D) bool (the decisions episode e took, in
      order), and (R,) the turn index of each record in ``decisions``.
    """
    e_count = len(returns)
    if e_count % group_size:
        raise ValueError(f"{e_count} episodes do not split into groups of {group_size}")
    taken_by = [set() for _ in range(e_count)]
    for d in decisions:
        taken_by[d.episode].add(d.decision)
    steps = [sorted(taken) for taken in taken_by]
    depth = max([len(s) for s in steps] + [1])
    rewards = np.zeros((e_count, depth), np.float32)
    mask = np.zeros((e_count, depth), bool)
    turn_of = {}
    for e, taken in enumerate(steps):
        n = len(taken)
        for j, d in enumerate(taken):
            rewards[e, j] = returns[e] - step_cost * (n - 1 - j)
            mask[e, j] = True
            turn_of[(e, d)] = j
    turns = np.asarray([turn_of[(d.episode, d.decision)] for d in decisions], np.int64)
    shape = (e_count // group_size, group_size, depth)
    return rewards.reshape(shape), mask.reshape(shape), turns


def decision_advantages(returns: np.ndarray, decisions: Sequence[DecisionTokens], group_size: int,
                        advantage: AdvantageConfig = AdvantageConfig(mode="grpo"),
                        step_cost: float = 0.0) -> np.ndarray:
    """(R,) the advantage of every recorded answer: its decision's turn advantage over the
    episode's group (:func:`decision_rewards` then the project's estimator)."""
    rewards, mask, turns = decision_rewards(returns, decisions, group_size, step_cost)
    adv = np.asarray(compute_advantages_jit(rewards, mask, advantage)).reshape(len(returns), -1)
    return np.asarray([adv[d.episode, t] for d, t in zip(decisions, turns)], np.float32)


# ----------------------------------------------------------------------------- batches
def decision_batch(decisions: Sequence[AnswerTokens], advantages: np.ndarray, pad_id: int, *,
                   bucket_size: int = 32, multiple_of: int = 1, grammar_rows=None) -> dict[str, np.ndarray]:
    """Training arrays of recorded answers: one row ``prompt_ids + answer_ids`` per decision.

    Args:
      decisions: R records; advantages: (R,) one per record.
      pad_id: padding token; bucket_size: the padded length is a multiple of this.
      multiple_of: the row count is padded (empty rows) to a multiple of this.
      grammar_rows: (grammar id, answer budget) when the answers were sampled under a grammar.
    Returns:
      :func:`jax_drive.rl.grpo.build_train_batch`'s arrays: input_ids, targets, positions,
      attention_mask, loss_mask (1 on answer tokens), old_logp (the sampler's), advantages,
      turn_id (0 on answer tokens, -1 elsewhere); grammar_id / grammar_budget with a grammar.
    """
    if len(decisions) != len(advantages) or not decisions:
        raise ValueError(f"need one advantage per record and at least one record ({len(decisions)} records, "
                         f"{len(advantages)} advantages)")
    rows, logp, adv = [], [], []
    for d, a in zip(decisions, np.asarray(advantages, np.float32)):
        n_prompt, n_answer = len(d.prompt_ids), len(d.answer_ids)
        weight = np.concatenate([np.zeros(n_prompt, np.float32), np.ones(n_answer, np.float32)])
        rows.append(TokenRow(np.asarray(d.prompt_ids + d.answer_ids, np.int32), weight))
        logp.append(np.concatenate([np.zeros(n_prompt, np.float32), np.asarray(d.logprobs, np.float32)]))
        adv.append(weight * a)
    length = bucket_length(max(len(r) for r in rows) - 1, bucket_size)
    num_rows = -(-len(rows) // multiple_of) * multiple_of
    batch = pad_rows(rows, length, pad_id, num_rows=num_rows, extra={"old_logp": logp, "advantages": adv})
    batch["turn_id"] = np.where(batch["loss_mask"] > 0, 0, -1).astype(np.int32)
    if grammar_rows is not None:
        grammar_id, budget = grammar_rows
        batch["grammar_id"] = np.full((num_rows,), grammar_id, np.int32)
        batch["grammar_budget"] = np.full((num_rows,), budget, np.int32)
    return batch


# ----------------------------------------------------------------------------- statistics
def episode_stats(results: Sequence[EpisodeResult], returns: np.ndarray, policy: LanguagePolicy) -> dict:
    """A step's driving and talking figures: return, SR / CR (percent over agent-episodes),
    messages and their length, typed parse failures, answers that used their whole token
    budget (``answers_at_budget``: under the action grammar these still parse; the
    finish-in-budget mask closed them), engine calls."""
    outcomes = [o for r in results for o in r.outcomes]
    rates = M.talking_vehicles_rates(outcomes)
    texts = [text for r in results for _, _, text in r.message_log]
    failures = sum(sum(v for k, v in c.items() if k != "cut_off") for c in policy.failures.values())
    cut_off = sum(c.get("cut_off", 0) for c in policy.failures.values())
    return {"return_mean": float(np.mean(returns)), "sr": rates["SR"], "cr": rates["CR"],
            "episodes": len(results), "decisions": len(policy.decisions), "engine_calls": len(policy.calls),
            "messages": len(texts), "message_chars_mean": float(np.mean([len(t) for t in texts])) if texts else 0.0,
            "parse_failures": int(failures), "answers_at_budget": int(cut_off)}


# ----------------------------------------------------------------------------- trainer
def rollout_groups(engine, config: CoopRLConfig, specs: Sequence[EpisodeSpec], key, *,
                   progress: Callable[[int], None] | None = None) -> tuple[list[EpisodeResult], LanguagePolicy]:
    """G episodes of every spec as one batch under a token-recording language policy."""
    policy = LanguagePolicy(engine, config.agent, key=key, name="grpo", record_tokens=True)
    # record log pi at the sampling temperature (the trainer's), not at temperature 1
    policy.sampling = policy.sampling.replace(logprobs_mode="processed")
    results, _ = run_specs(group_specs(specs, config.group_size), policy, progress=progress,
                           max_time=config.max_time)
    return results, policy


@dataclasses.dataclass(frozen=True)
class RecordTrainer:
    """The fixed parts of a trainer that learns from recorded answers (:func:`record_trainer`):
    the model split (graphdef, rest), the start policy's parameters for the KL (or None), the
    :class:`GRPOConfig` of the update, the sampler's grammar tables and (grammar id, budget),
    the padding id and the row settings (max_rows, minibatch_size, bucket_size, KL in use)."""

    graphdef: object
    rest: object
    ref_params: object
    update: GRPOConfig
    grammar: object
    grammar_rows: tuple | None
    pad_id: int
    max_rows: int | None
    minibatch_size: int
    bucket_size: int


def record_trainer(model, tokenizer, config, sampling, name: str, out_dir, resume: bool):
    """(RecordTrainer, the start RunState (restored on ``resume``), checkpointer) of a trainer
    whose ``config`` has update_config(), optim, loss, seed, max_rows, minibatch_size and
    bucket_size; ``sampling`` (SamplingParams) names the grammar the answers were drawn under."""
    graphdef, params, rest, state = initial_state(model, config.optim, None, config.seed)
    ckpt = open_checkpointer(out_dir, name)
    grammar, grammar_rows = sampling_grammar_tables(tokenizer, model.config.vocab_size, sampling)
    trainer = RecordTrainer(graphdef=graphdef, rest=rest,
                            ref_params=copy_tree(params) if config.loss.uses_reference else None,
                            update=config.update_config(), grammar=grammar, grammar_rows=grammar_rows,
                            pad_id=int(getattr(tokenizer, "pad_token_id", 0) or 0), max_rows=config.max_rows,
                            minibatch_size=config.minibatch_size, bucket_size=config.bucket_size)
    return trainer, restored(state, ckpt, resume), ckpt


def train_on_records(trainer: RecordTrainer, state: RunState, records: Sequence, adv: np.ndarray, k_rows, k_mb):
    """One update on recorded answers: at most ``max_rows`` of them (a uniform sample), without
    the rows of advantage 0 when no KL is used (they carry no gradient), one row each
    (:func:`decision_batch`) through :func:`grpo_update`. Returns (params, opt_state,
    metrics, rows trained)."""
    chosen = np.arange(len(records))
    if trainer.max_rows is not None and len(chosen) > trainer.max_rows:
        chosen = np.sort(np.asarray(jax.random.choice(k_rows, len(chosen), (trainer.max_rows,), replace=False)))
    if trainer.ref_params is None:
        chosen = chosen[adv[chosen] != 0.0]
    if not len(chosen):
        return state.params, state.opt_state, {"optimizer_steps": 0}, 0
    batch = decision_batch([records[i] for i in chosen], adv[chosen], trainer.pad_id,
                           bucket_size=trainer.bucket_size, multiple_of=min(trainer.minibatch_size, len(chosen)),
                           grammar_rows=trainer.grammar_rows)
    params, opt_state, metrics = grpo_update(trainer.graphdef, state.params, trainer.rest, state.opt_state,
                                             trainer.ref_params, batch, trainer.update, k_mb, grammar=trainer.grammar)
    jax.block_until_ready(params)
    return params, opt_state, metrics, int(len(chosen))


def record_step(state: RunState, rng, advance: int, update: tuple, stats: dict, adv: np.ndarray,
                seconds: dict, postfix: dict) -> StepOutcome:
    """The :class:`StepOutcome` of a step that trained on records: the next state (the episode
    stream moved on by ``advance``), the record (stats, update metrics, rows trained, mean |advantage|, the
    ``seconds`` given, peak RSS), the finite checks and the bar's postfix (plus KL)."""
    params, opt_state, metrics, rows = update
    after = RunState(params=params, opt_state=opt_state, rng=rng, step=state.step + 1,
                     data_position=state.data_position + advance)
    record = {**stats, **metrics, "rows_trained": rows,
              "advantage_abs_mean": float(np.abs(adv).mean()) if len(adv) else 0.0, **seconds,
              "peak_rss_gb": peak_rss_gb}
    finite = {k: metrics[k] for k in ("loss", "grad_norm", "kl") if k in metrics}
    return StepOutcome(after, record, finite=finite,
                       postfix={**postfix, "kl": f"{metrics.get('kl', float('nan')):.4f}"})


def coop_grpo_train(model, tokenizer, config: CoopRLConfig, *, engine=None,
                    out_dir: str | os.PathLike | None = None, resume: bool = False, progress: bool = True,
                    on_step: Callable[[RunState, dict], None] | None = None) -> TrainResult:
    """Trains ``model`` in place with group-relative policy gradients on cooperative episodes.

    Args:
      model: the agents' CausalLM (LoRA applied for ``optim.trainable == 'lora'``); the default
        engine samples from it live.
      tokenizer: its tokenizer. config: :class:`CoopRLConfig`.
      engine: optional engine that reads the live ``model``.
      out_dir: metrics.jsonl, tb/, checkpoints/ (None: nothing written); resume: continue
        from its latest checkpoint.
      progress: tqdm bar; on_step: as in :func:`jax_drive.rl.grpo.grpo_train`.
    Returns:
      TrainResult with one record per step.
    """
    from jax_drive.sampling import JaxEngine

    engine = JaxEngine(model, tokenizer) if engine is None else engine
    probe = LanguagePolicy(engine, config.agent)  # the sampler's grammar and answer budget
    trainer, state, ckpt = record_trainer(model, tokenizer, config, probe.sampling, "coop_grpo", out_dir, resume)
    per_step = config.groups_per_step

    def step(state: RunState) -> StepOutcome:
        rng, k_roll, k_rows, k_mb = jax.random.split(state.rng, 4)
        specs = training_specs(config.scenarios, config.seed, state.data_position, per_step, config.variation)
        t0 = time.perf_counter()
        results, policy = rollout_groups(engine, config, specs, k_roll)
        t1 = time.perf_counter()
        returns = joint_returns(results, config.returns)
        adv = decision_advantages(returns, policy.decisions, config.group_size, config.advantage,
                                  config.returns.step_cost)
        stats = episode_stats(results, returns, policy)
        update = train_on_records(trainer, state, policy.decisions, adv, k_rows, k_mb)
        seconds = {"rollout_seconds": t1 - t0, "update_seconds": time.perf_counter() - t1,
                   "decisions_per_s": stats["decisions"] / max(t1 - t0, 1e-9)}
        return record_step(state, rng, per_step, update, stats, adv, seconds,
                           {"return": f"{stats['return_mean']:.3f}", "sr": f"{stats['sr']:.0f}"})

    loop = LoopConfig("coop_grpo", config.steps, config.checkpoint_every, config.log_every,
                      config.optim.skip_nonfinite, live_model=True)
    return train_loop(model, state, step, loop, ckpt=ckpt, out_dir=out_dir, resume=resume, progress=progress,
                      on_step=on_step)
