"""mtGRPO / GRPO: the update step and the training loop (MTDrive Algorithm 1).

One trainer step:

1. take ``prompts_per_step`` scenes (deterministic order per seed and epoch);
2. multi-turn rollouts, G per scene (:func:`jax_drive.rollout.run_rollouts`) with the
   current policy (the sampler reads the live model, which holds pi_old);
3. turn rewards -> advantages (:func:`jax_drive.rl.advantages.compute_advantages`, the
   three Table 3 variants) -> per-token advantages via each token's turn id;
4. log-probs of the sampled tokens under pi_old (recomputed by the trainer, as veRL does, or
   the sampler's) and under the frozen reference pi_ref (the policy at the start of training:
   for LoRA a copy of the initial adapters, so the base weights are shared);
5. ``ppo_epochs`` (mu) passes over shuffled mini-batches of rows, each an optimiser step on
   the clipped loss + beta K3 KL (:func:`jax_drive.rl.loss.policy_loss`).

Defaults follow MTDrive: G = 8, 6 turns, 32 prompts (256 rollouts) per step, mini-batch 128
rows, lr 1e-6 constant, beta 0.01 (K3), cross-turn mtGRPO advantages.

Several processes (:mod:`jax_drive.distributed.multihost`; the trainer's mesh spans them
all): each process takes its block of the step's scenes and samples their rollouts on its
own devices with its own key (``fold_in(key, process)``: no work is done twice, and a run
repeats for a given process count); advantages are per group, so per process; each process
pads its rows to the length and row count every process agrees on, and the update runs on
the global batch. The step's record is computed from every process's rollouts (gathered),
so process 0 logs the whole step.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_drive.configs import at_least
from jax_drive.parallel import (
    MeshConfig,
    barrier,
    batch_shards,
    gather_objects,
    host_local,
    host_values,
    local_batch_shards,
    local_mesh,
    make_mesh,
    process_block,
    require_global_mesh,
    round_up,
    shard_batch,
)
from jax_drive.rl.advantages import AdvantageConfig, compute_advantages_jit, token_advantages
from jax_drive.data.tokens import TokenRow
from jax_drive.rl.batching import GRAMMAR_KEYS, add_images, batch_token_logprobs, bucket_length, pad_rows
from jax_drive.rl.checkpoint import RunState
from jax_drive.rl.logging import peak_rss_gb
from jax_drive.rl.loop import (LoopConfig, StepOutcome, TrainResult, initial_state, open_checkpointer, restored,
                               train_loop)
from jax_drive.rl.loss import LossConfig, policy_loss
from jax_drive.rl.optim import (
    OptimConfig,
    copy_tree,
    make_eval_fn,
    make_optimizer,
    make_train_step,
    minibatch_indices,
)
from jax_drive.rollout import (
    RolloutConfig,
    RolloutResult,
    compute_reference,
    concat_results,
    run_rollouts,
    scene_prompts,
    select_scenes,
    summarize,
)
from jax_drive.scenes import index_scene
from jax_drive.types import Scene


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """mtGRPO trainer settings (defaults: MTDrive section 4 / the reference page).

    Attributes:
      rollout: G, turns, reward weights, decoding.
      advantage: 'mtgrpo_cross' (default), 'mtgrpo_intra' or 'grpo'.
      loss: clip 0.2, beta 0.01 K3, aggregation.
      optim: AdamW lr 1e-6 constant, clip 1.0, LoRA or full.
      prompts_per_step: scenes per step (32 x G 8 = global batch 256).
      minibatch_size: rows per optimiser step (128).
      ppo_epochs: mu, passes over the step's rollouts.
      steps: trainer steps (300).
      recompute_old_logprobs: pi_old log-probs from the trainer (True, veRL) or the sampler.
        The trainer scores tokens under softmax(logits / T) at the rollout's sampling
        temperature T (as veRL's actor does), so sampling below 1 keeps the ratio on the
        distribution the tokens came from; sampler log-probs then need
        ``logprobs_mode="processed"`` without top-k/top-p (checked here).
      bucket_size: padded sequence lengths are multiples of this.
      chunk_size: token chunk of ``token_logprobs``.
      seed: data order, rollouts and mini-batch shuffling.
      drop_degenerate_groups: leave out of the update the groups whose advantages are all 0
        (every rollout of the prompt earned the same turn rewards), as DAPO's dynamic
        sampling filter does (without resampling); a step with no group left skips the
        update (``skipped_update`` = 1 in its record). Such groups carry no policy
        gradient, only the KL term when beta > 0, so this saves their forward/backward.
      checkpoint_every: steps between checkpoints (None: only at the end; needs out_dir).
      log_every: steps between metric records.
      stream_logprobs: MTDrive's IPSS in our setting: the pi_old / pi_ref log-probs of the
        rows that finished at turn j are computed in a worker thread while turn j + 1
        generates (:mod:`jax_drive.rl.streaming`); default False (after the rollout).
      share_prompt_prefix: MTDrive's IPTC in our setting: each group's prompt is run once per
        model and its keys / values reused by the group's G rows; default False. Either
        option gives the log-probs of the default path up to float rounding (text prompts
        only: with images in the prompts, either option is an error).
      mesh: devices of the trainer (default one): update rows split over ``data * fsdp``,
        parameters and optimiser state split along ``fsdp`` (``jax_drive.parallel``); the
        default engine then splits its sampling rows the same way. ``minibatch_size`` must
        be a multiple of ``data * fsdp``.
    """

    rollout: RolloutConfig = RolloutConfig()
    advantage: AdvantageConfig = AdvantageConfig()
    loss: LossConfig = LossConfig()
    optim: OptimConfig = OptimConfig(learning_rate=1e-6)
    prompts_per_step: int = 32
    minibatch_size: int = 128
    ppo_epochs: int = 1
    steps: int = 300
    recompute_old_logprobs: bool = True
    bucket_size: int = 128
    chunk_size: int = 256
    seed: int = 0
    drop_degenerate_groups: bool = False
    checkpoint_every: int | None = 50
    log_every: int = 1
    stream_logprobs: bool = False
    share_prompt_prefix: bool = False
    mesh: MeshConfig = MeshConfig()

    def __post_init__(self):
        if min(self.prompts_per_step, self.minibatch_size, self.ppo_epochs, self.bucket_size) < 1:
            raise ValueError("prompts_per_step, minibatch_size, ppo_epochs, bucket_size must be >= 1")
        at_least(self, 0, "steps")
        sampling = self.rollout.sampling
        if not self.recompute_old_logprobs and self.logprob_temperature != 1.0:
            if sampling.logprobs_mode != "processed" or sampling.top_k or sampling.top_p < 1.0:
                raise ValueError(
                    f"with recompute_old_logprobs=False and sampling temperature {sampling.temperature}, "
                    "the sampler's log-probs must be the trainer's softmax(logits / T): set "
                    "SamplingParams(logprobs_mode='processed') with top_k=0 and top_p=1.0")
        if (self.stream_logprobs or self.share_prompt_prefix) and self.rollout.prompt.uses_images:
            raise ValueError("stream_logprobs / share_prompt_prefix score text rows only; prompts with images "
                             "(PromptConfig perception='image') need the plain log-prob pass")
        if (self.stream_logprobs or self.share_prompt_prefix) and self.rollout.answer_grammar() is not None:
            raise ValueError("stream_logprobs / share_prompt_prefix score unmasked log-probs; constrained answers "
                             "(rollout.constrain_answers) need the plain log-prob pass")
        if (self.stream_logprobs or self.share_prompt_prefix) and not self.mesh.single_device:
            # the streamed log-probs are computed unsharded; not combined with a mesh (untested)
            raise ValueError("stream_logprobs / share_prompt_prefix run on one device; use the default "
                             "log-prob pass with a mesh")

    @property
    def logprob_temperature(self) -> float:
        """T of the trainer's log-probs: the rollout's sampling temperature (1 when greedy)."""
        t = self.rollout.sampling.temperature
        return float(t) if t > 0 else 1.0


# ----------------------------------------------------------------------------- batches
def build_train_batch(result: RolloutResult, advantages: Any, pad_id: int, bucket_size: int = 128,
                      multiple_of: int = 1, model=None, grammar_rows=None,
                      length: int | None = None) -> dict[str, np.ndarray]:
    """Padded training arrays from rollouts.

    Args:
      result: RolloutResult of S scenes x G rollouts (R rows).
      advantages: (S, G, N) per-turn advantages.
      pad_id: padding token.
      bucket_size: the padded length is a multiple of this.
      multiple_of: the row count is padded (with empty rows) to a multiple of this.
      model: the policy, needed when the rollouts' prompts hold images (see
        :func:`jax_drive.rl.batching.add_images`).
      grammar_rows: (grammar id, token budget per turn) of every row's answers when they were
        sampled under a grammar (its index in the update's ``GrammarTables``), else None.
      length: the padded length (default: the rows' longest, bucketed); rows longer than
        ``length + 1`` tokens are cut. With it, ``result`` may hold no scene (an all-padding batch).
    Returns:
      dict of (R', L) arrays: input_ids, targets, positions, attention_mask, loss_mask
      (1 on generated tokens), old_logp (sampling log-probs), advantages (the token's turn
      advantage), turn_id (float, -1 off-loss); with images, positions (R', 3, L) and vision;
      with ``grammar_rows``, grammar_id and grammar_budget (R',) int32.
    """
    adv = np.asarray(advantages, np.float32)
    if adv.shape[:2] != result.pdms.shape[:2]:
        raise ValueError(f"advantages {adv.shape} do not match the rollouts {result.pdms.shape}")
    rows = [TokenRow(t.tokens, (t.turn_ids >= 0).astype(np.float32), t.images) for t in result.rows]
    if length is None:
        length = bucket_length(max(len(r) for r in rows) - 1, bucket_size)
    num_rows = max(-(-len(rows) // multiple_of) * multiple_of, multiple_of)
    batch = pad_rows(rows, length, pad_id, num_rows=num_rows,
                     extra={"old_logp": result.sample_logprobs, "turn_id": result.turn_ids})
    # padding carries turn id 0 in pad_rows' extras: off-loss tokens get -1 here
    turn_id = np.where(batch["loss_mask"] > 0, batch["turn_id"], -1).astype(np.int32)
    row_adv = np.zeros((num_rows, adv.shape[-1]), np.float32)
    row_adv[:len(rows)] = adv.reshape(len(rows), adv.shape[-1])
    batch["turn_id"] = turn_id
    batch["advantages"] = np.asarray(token_advantages(row_adv, turn_id))
    if grammar_rows is not None:
        grammar_id, budget = grammar_rows
        batch["grammar_id"] = np.full((num_rows,), grammar_id, np.int32)
        batch["grammar_budget"] = np.full((num_rows,), budget, np.int32)
    return add_images(batch, rows, model)


def _loss_fn(loss_config: LossConfig, chunk_size: int, temperature: float):
    def loss_fn(model, batch, grammar=None):
        logp = batch_token_logprobs(model, batch, chunk_size, temperature, grammar)
        return policy_loss(logp, batch["old_logp"], batch["advantages"], batch["loss_mask"],
                           ref_logp=batch.get("ref_logp"), config=loss_config)

    return loss_fn


def _logp_fn(chunk_size: int, temperature: float):
    def fn(model, batch, grammar=None):  # grammar: the rollout's GrammarTables (masked policy)
        return batch_token_logprobs(model, batch, chunk_size, temperature, grammar)

    return fn


@functools.lru_cache(maxsize=8)
def _compiled(graphdef, loss_config: LossConfig, chunk_size: int, optim: OptimConfig, temperature: float,
              mesh=None):
    """(train step, log-prob fn) per model structure, settings and mesh (reused across runs)."""
    step = make_train_step(graphdef, _loss_fn(loss_config, chunk_size, temperature), make_optimizer(optim), mesh)
    logp = make_eval_fn(graphdef, _logp_fn(chunk_size, temperature), mesh)
    return step, logp


_MODEL_KEYS = ("input_ids", "targets", "positions", "attention_mask", "vision") + GRAMMAR_KEYS


def _rows(batch: dict, index) -> dict:
    """The rows ``index`` (a slice or index array) of every entry (a per-row vision layout
    included), taken by one compiled program with the indices as host data: a batch spread over
    several processes must only be indexed by programs every process runs alike (eager indexing
    with an index on one local device can leave the processes in different collectives)."""
    if isinstance(index, slice):
        index = np.arange(int(jax.tree.leaves(batch)[0].shape[0]))[index]
    return _take_rows(batch, np.asarray(index, np.int32))


@jax.jit
def _take_rows(batch: dict, index) -> dict:
    return jax.tree.map(lambda v: v[index], batch)


def batch_logprobs(logp_fn, params, rest, batch: dict, rows_per_call: int, grammar=None) -> jax.Array:
    """Log-probs of the batch's targets, ``rows_per_call`` rows at a time (bounded memory);
    ``grammar``: the rollout's GrammarTables when its answers were constrained."""
    n = batch["input_ids"].shape[0]
    parts = []
    model_inputs = {k: batch[k] for k in _MODEL_KEYS if k in batch}
    for start in range(0, n, rows_per_call):
        sub = _rows(model_inputs, slice(start, start + rows_per_call))
        parts.append(logp_fn(params, rest, sub, grammar))
    return jnp.concatenate(parts, axis=0)


def grpo_update(graphdef, params, rest, opt_state, ref_params, batch: dict, config: GRPOConfig,
                key: jax.Array, precomputed: dict | None = None, grammar=None):
    """mu epochs of mini-batch steps on one step's rollouts.

    Args:
      graphdef, params, rest: the split model (params = trainable state).
      opt_state: optax state. ref_params: frozen reference trainable state (or None).
      batch: :func:`build_train_batch` output (numpy or jax arrays; in several processes,
        this process's rows of the global batch, the same shape in every process).
      config: GRPOConfig. key: mini-batch shuffling key (the same in every process).
      precomputed: optional 'old_logp' / 'ref_logp' arrays shaped like the batch, already
        computed under params / ref_params (:class:`jax_drive.rl.streaming.RowLogprobs`);
        they replace the recomputation here.
      grammar: the rollout's ``GrammarTables`` when its answers were sampled under grammars
        (the batch then has ``grammar_id`` / ``grammar_budget``): pi_old, pi_ref and pi_theta
        are then the masked policies the sampler drew from.
    Returns:
      (params, opt_state, metrics) with metrics averaged over the mini-batch steps, plus
      ``logp_mismatch`` (mean |sampler - trainer| log-prob on generated tokens).
    """
    mesh = make_mesh(config.mesh)
    require_global_mesh(mesh, "grpo_update")
    step_fn, logp_fn = _compiled(graphdef, config.loss, config.chunk_size, config.optim,
                                 config.logprob_temperature, mesh)
    batch = shard_batch(batch, mesh) if mesh is not None else jax.tree.map(jnp.asarray, batch)
    rows = batch["input_ids"].shape[0]
    mbs = min(config.minibatch_size, rows)
    mask = batch["loss_mask"]
    extra = {}
    precomputed = precomputed or {}
    if config.recompute_old_logprobs:
        old = (jnp.asarray(precomputed["old_logp"]) if "old_logp" in precomputed
               else batch_logprobs(logp_fn, params, rest, batch, mbs, grammar))
        n = jnp.maximum(mask.sum(), 1.0)
        extra["logp_mismatch"] = jnp.sum(jnp.abs(old - batch["old_logp"]) * mask) / n
        batch["old_logp"] = old
    if config.loss.uses_reference:
        if ref_params is None:
            raise ValueError("the loss uses a reference model but ref_params is None")
        batch["ref_logp"] = (jnp.asarray(precomputed["ref_logp"]) if "ref_logp" in precomputed
                             else batch_logprobs(logp_fn, ref_params, rest, batch, mbs, grammar))
    history = []
    for epoch in range(config.ppo_epochs):
        for index in minibatch_indices(jax.random.fold_in(key, epoch), rows, mbs):
            params, opt_state, loss, metrics = step_fn(params, rest, opt_state, _rows(batch, index), grammar)
            history.append(dict(metrics, loss=loss))
    metrics = {k: float(np.mean([float(h[k]) for h in history])) for k in history[0]}
    metrics.update({k: float(v) for k, v in extra.items()})
    metrics["optimizer_steps"] = len(history)
    return params, opt_state, metrics


# ----------------------------------------------------------------------------- IPSS / IPTC
def _row_logprobs(graphdef, rest, params, ref_params, config: GRPOConfig):
    """A RowLogprobs for the step's pi_old / pi_ref log-probs when streaming or prefix
    sharing is on and the step needs them; None otherwise (the plain path)."""
    if not (config.stream_logprobs or config.share_prompt_prefix):
        return None
    from jax_drive.rl.streaming import RowLogprobs, StreamConfig

    policies = {}
    if config.recompute_old_logprobs:
        policies["old_logp"] = params
    if config.loss.uses_reference:
        if ref_params is None:
            raise ValueError("the loss uses a reference model but ref_params is None")
        policies["ref_logp"] = ref_params
    if not policies:
        return None
    _, logp_fn = _compiled(graphdef, config.loss, config.chunk_size, config.optim, config.logprob_temperature)
    stream = StreamConfig(background=config.stream_logprobs, share_prefix=config.share_prompt_prefix,
                          group_size=config.rollout.group_size, bucket_size=config.bucket_size,
                          chunk_size=config.chunk_size, temperature=config.logprob_temperature)
    return RowLogprobs(graphdef, rest, policies, stream, logp_fn)


def _precomputed(rows_logp, result: RolloutResult, keep: np.ndarray, group_size: int, batch: dict) -> dict:
    """The RowLogprobs values of the kept scenes' rows, laid out like ``batch``."""
    from jax_drive.rl.streaming import rows_to_batch

    if not rows_logp.config.background:  # deferred: everything is scored now
        rows_logp.submit(range(len(result.rows)), result.rows)
    values = rows_logp.results()
    rows_logp.close()
    rows = [int(s) * group_size + g for s in keep for g in range(group_size)]
    shape = batch["input_ids"].shape
    return {name: rows_to_batch([by_row[r] for r in rows], shape[1], shape[0]) for name, by_row in values.items()}


def answer_grammar_tables(tokenizer, vocab_size: int, rollout: RolloutConfig):
    """(GrammarTables, (grammar id, budget)) of the rollouts' answer grammar, compiled exactly
    as the engine compiles it (the same grammar and stop ids), or (None, None) without one."""
    return sampling_grammar_tables(tokenizer, vocab_size, rollout.sampling.replace(grammar=rollout.answer_grammar()))


def sampling_grammar_tables(tokenizer, vocab_size: int, sampling):
    """(GrammarTables, (grammar id, budget)) of the grammar of ``sampling`` (SamplingParams),
    compiled as the engine compiles it (the same grammar and stop ids), or (None, None)."""
    if sampling.grammar is None:
        return None, None
    from jax_drive.sampling.grammar.rows import RowGrammars

    stops = sampling.resolved_stop_ids(tuple(int(i) for i in tokenizer.eos_token_ids))
    tables, ids, _ = RowGrammars(tokenizer, vocab_size).tables([sampling.grammar], stops)
    return tables, (int(ids[0]), sampling.max_new_tokens)


# ----------------------------------------------------------------------------- processes
def _references(scenes: Scene, pdm_config) -> np.ndarray:
    """PDM-Closed references of every scene; in several processes each computes its block."""
    if jax.process_count() == 1:
        return np.asarray(compute_reference(scenes, pdm_config), np.float32)
    block = process_block(int(scenes.command.shape[0]))
    own = np.asarray(compute_reference(index_scene(scenes, np.arange(block.start, block.stop)), pdm_config))
    return np.concatenate(gather_objects(own.astype(np.float32)), axis=0)


def _common_shape(result: RolloutResult, config: GRPOConfig, local_shards: int) -> tuple[int, dict]:
    """(groups kept by all processes, {"rows", "length"} of every process's block): the most
    rows any process holds, rounded up to its devices, and the longest row's bucketed length."""
    lengths = [len(t.tokens) for t in result.rows]
    found = host_values(np.asarray([len(lengths), max(lengths, default=1)], np.int64), stack=True)
    rows, longest = int(found[:, 0].max()), int(found[:, 1].max())
    shape = {"rows": round_up(max(rows, 1), local_shards), "length": bucket_length(longest - 1, config.bucket_size)}
    return int(found[:, 0].sum()) // config.rollout.group_size, shape


# ----------------------------------------------------------------------------- data
def scene_order(num_scenes: int, seed: int, start: int, count: int) -> np.ndarray:
    """Indices ``start .. start + count`` of the endless stream of per-epoch permutations."""
    out = []
    pos = start
    while len(out) < count:
        epoch, offset = divmod(pos, num_scenes)
        perm = np.random.default_rng([seed, epoch]).permutation(num_scenes)
        take = min(count - len(out), num_scenes - offset)
        out.extend(perm[offset:offset + take].tolist())
        pos += take
    return np.asarray(out, np.int64)


# ----------------------------------------------------------------------------- trainer
def grpo_train(
    model,
    tokenizer,
    scenes: Scene,
    config: GRPOConfig = GRPOConfig(),
    *,
    engine=None,
    references: Any = None,
    prompts: Sequence[str] | None = None,
    pdm_config=None,
    out_dir: str | os.PathLike | None = None,
    resume: bool = False,
    progress: bool = True,
    on_step: Callable[[RunState, dict], None] | None = None,
) -> TrainResult:
    """Trains ``model`` in place with (mt)GRPO on multi-turn PDM rollouts.

    Args:
      model: CausalLM (LoRA applied for ``optim.trainable == 'lora'``); also the sampler's
        model: the default engine is ``JaxEngine(model, tokenizer)``.
      tokenizer: the policy's tokenizer.
      scenes: training scenes, one batch dim (N,).
      config: GRPOConfig.
      engine: optional engine (must read the live ``model``, or be a remote server that is
        synchronised elsewhere).
      references: (N, 40, 3) PDM-Closed poses (computed once when None).
      prompts: N turn-1 prompts (default: :func:`jax_drive.rollout.scene_prompts`).
      pdm_config: scorer config.
      out_dir: metrics.jsonl, tb/, checkpoints/ (None: nothing written).
      resume: continue from the latest checkpoint in out_dir.
      progress: tqdm bar.
      on_step: called after every trainer step with the new RunState (its ``params`` are
        the updated trainable state, already written into ``model``) and the step's metric
        record ({} on steps not logged), before the step's checkpoint; the place to push
        weights to engines that do not read the live model.
    Returns:
      TrainResult with one record per step (rollout summary + update metrics).
    """
    from jax_drive.sampling import JaxEngine, SamplerConfig

    n = int(scenes.command.shape[0])
    processes = jax.process_count()
    if processes > 1 and config.prompts_per_step % processes:
        raise ValueError(f"prompts_per_step {config.prompts_per_step} does not split over {processes} processes")
    if references is None:
        references = _references(scenes, pdm_config)
    references = np.asarray(references, np.float32)
    if references.shape != (n, 40, 3):
        raise ValueError(f"references must be ({n}, 40, 3), got {references.shape}")
    prompts = list(scene_prompts(scenes, config.rollout.prompt, config.rollout.caption) if prompts is None else prompts)
    if len(prompts) != n:
        raise ValueError(f"{len(prompts)} prompts for {n} scenes")
    mesh = make_mesh(config.mesh)
    require_global_mesh(mesh, "grpo_train")
    shards = batch_shards(mesh)
    if config.minibatch_size % shards:
        raise ValueError(f"minibatch_size {config.minibatch_size} is not a multiple of the {shards} devices "
                         "that share each mini-batch")
    sampler_model = None  # several processes: each samples with its own copy on its own devices
    if engine is None and processes > 1:
        sampler_model = nnx.clone(model)  # before sharding: every process holds the same arrays
        engine = JaxEngine(sampler_model, tokenizer, SamplerConfig(mesh=local_mesh(MeshConfig(data=-1))))
    engine = JaxEngine(model, tokenizer, SamplerConfig(mesh=config.mesh)) if engine is None else engine
    pad_id = int(getattr(tokenizer, "pad_token_id", 0) or 0)

    graphdef, params, rest, state = initial_state(model, config.optim, mesh, config.seed)
    ref_params = copy_tree(params) if config.loss.uses_reference else None
    ckpt = open_checkpointer(out_dir, "grpo")
    state = restored(state, ckpt, resume)
    rows_multiple = min(config.minibatch_size, config.prompts_per_step * config.rollout.group_size)
    grammar, grammar_rows = answer_grammar_tables(tokenizer, model.config.vocab_size, config.rollout)

    def step(state: RunState) -> StepOutcome:
        rng, k_roll, k_mb = jax.random.split(state.rng, 3)
        idx = scene_order(n, config.seed, state.data_position, config.prompts_per_step)
        if processes > 1:  # this process's scenes, its own rollout key
            idx, k_roll = idx[process_block(len(idx))], jax.random.fold_in(k_roll, jax.process_index())
            if sampler_model is not None:
                nnx.update(sampler_model, host_local(state.params))
        rows_logp = _row_logprobs(graphdef, rest, state.params, ref_params, config)
        t0 = time.perf_counter()
        result = run_rollouts(engine, tokenizer, index_scene(scenes, idx), k_roll, config.rollout,
                              reference=references[idx], pdm_config=pdm_config, prompts=[prompts[i] for i in idx],
                              on_finished=rows_logp.submit if rows_logp and config.stream_logprobs else None)
        t1 = time.perf_counter()
        adv = compute_advantages_jit(result.reward, result.turn_mask, config.advantage)
        train_result, train_adv = result, np.asarray(adv)
        keep = np.arange(train_adv.shape[0])
        if config.drop_degenerate_groups:
            keep = np.flatnonzero(np.any(train_adv != 0.0, axis=(1, 2)))
            train_result, train_adv = select_scenes(result, keep), train_adv[keep]
        kept = train_adv.shape[0]
        shape = {}
        if processes > 1:  # one row count and length for every process's block
            barrier(f"grpo-rollouts:{state.step}")  # rollouts take uneven time; the update's collectives wait
            kept, shape = _common_shape(train_result, config, local_batch_shards(mesh))
        if kept:
            multiple = int(np.lcm(min(rows_multiple, kept * config.rollout.group_size), shards))
            batch = build_train_batch(train_result, train_adv, pad_id, config.bucket_size,
                                      multiple_of=shape.get("rows", multiple), model=model,
                                      grammar_rows=grammar_rows, length=shape.get("length"))
            precomputed = None
            if rows_logp is not None:
                precomputed = _precomputed(rows_logp, result, keep, config.rollout.group_size, batch)
            params, opt_state, update = grpo_update(graphdef, state.params, rest, state.opt_state, ref_params,
                                                    batch, config, k_mb, precomputed, grammar)
            jax.block_until_ready(params)
            if rows_logp is not None:  # scoring time, and the part the trainer waited for
                update.update(logprob_seconds=rows_logp.compute_seconds, logprob_wait_seconds=rows_logp.wait_seconds)
        else:
            batch, params, opt_state = None, state.params, state.opt_state
            update = {"optimizer_steps": 0}
            if rows_logp is not None:
                rows_logp.close()
        update = {**update, "skipped_update": float(not kept), "groups_kept": kept}
        t2 = time.perf_counter()
        after = RunState(params=params, opt_state=opt_state, rng=rng, step=state.step + 1,
                         data_position=state.data_position + config.prompts_per_step)
        train_tokens = float(np.asarray(batch["attention_mask"]).sum()) * config.ppo_epochs if batch is not None else 0.0
        adv = np.asarray(adv)
        if processes > 1:  # the record covers every process's rollouts
            parts = gather_objects((result, adv, train_tokens))
            result, adv = concat_results([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
            train_tokens = float(sum(p[2] for p in parts))
        summary = summarize(result)
        record = {
            **summary,
            **update,
            "advantage_abs_mean": float(np.abs(adv)[result.turn_mask].mean()),
            "rollout_seconds": t1 - t0,
            "update_seconds": t2 - t1,
            "rollout_tokens_per_s": summary["generated_tokens"] / max(t1 - t0, 1e-9),
            "train_tokens_per_s": train_tokens / max(t2 - t1, 1e-9),
            "padded_length": int(batch["input_ids"].shape[1]) if batch is not None else 0,
            "peak_rss_gb": peak_rss_gb,
        }
        finite = {k: update[k] for k in ("loss", "grad_norm", "kl") if k in update}
        postfix = {"pdms": f"{summary['pdms_final']:.3f}", "turns": f"{summary['turns_mean']:.2f}",
                   "kl": f"{update.get('kl', float('nan')):.4f}"}
        return StepOutcome(after, record, finite=finite, postfix=postfix)

    loop = LoopConfig("grpo", config.steps, config.checkpoint_every, config.log_every, config.optim.skip_nonfinite,
                      live_model=True)
    return train_loop(model, state, step, loop, ckpt=ckpt, out_dir=out_dir, resume=resume, progress=progress,
                      on_step=on_step)
