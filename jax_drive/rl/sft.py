"""Supervised fine-tuning on chat datasets: masked cross-entropy on assistant tokens.

``sft_train(model, dataset, config, tokenizer=...)`` tokenises every conversation
(:func:`jax_drive.data.tokens.tokenize_chat`), groups samples of similar length into batches
padded to a multiple of ``bucket_size`` (few distinct shapes -> few compiles), and minimises

    L = - sum_{b,t} m_bt log p(x_{b,t+1} | x_{b,<=t}) / sum_{b,t} m_bt

(token mean over the assistant tokens of the batch) with the shared optimiser plumbing
(AdamW, constant lr, global-norm clip; LoRA or full fine-tuning). Log-probs come from
``model.token_logprobs`` (vocab-chunked, no (B, L, V) float32 tensor). The run is
checkpointed with orbax and resumes exactly (``resume=True``). ``SFTConfig.mesh`` runs the
step data-parallel and FSDP-sharded on a device mesh (``jax_drive.parallel``). In several
processes (:mod:`jax_drive.distributed.multihost`) the mesh spans them all: every process
plans the same batches (from the rows' lengths) and pads only its own block of each batch's
rows, so the global batch, the losses and the updates are those of one process.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any

import jax
import jax.numpy as jnp

from jax_drive.data.tokens import TokenRow, chat_samples, tokenize_chat
from jax_drive.rl.batching import add_images, batch_token_logprobs, bucket_length, iterate_epochs, pad_rows
from jax_drive.rl.checkpoint import RunState
from jax_drive.rl.loop import (LoopConfig, StepOutcome, TrainResult, initial_state, open_checkpointer, restored,
                               train_loop)
from jax_drive.rl.logging import peak_rss_gb
from jax_drive.parallel import (
    MeshConfig,
    batch_shards,
    make_mesh,
    process_block,
    require_global_mesh,
    round_up,
    shard_batch,
)
from jax_drive.rl.optim import OptimConfig, make_optimizer, make_train_step


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """SFT settings (MTDrive: lr 4e-5, global batch 128, 4 epochs, max 11,500 tokens).

    Attributes:
      optim: optimiser (default lr 4e-5, LoRA).
      batch_size: sequences per optimiser step.
      epochs: passes over the data (ignored when max_steps is set).
      max_steps: stop after this many steps (None = epochs * batches per epoch).
      max_length: longer samples are truncated to this many tokens.
      bucket_size: padded lengths are multiples of this.
      train_on: 'all' assistant messages or only the 'last' one (a sample's own "train_on" wins).
      seed: data order seed.
      chunk_size: token chunk of ``token_logprobs``.
      checkpoint_every: steps between checkpoints (None = only at the end; needs out_dir).
      log_every: steps between metric records.
      mesh: devices of the step (default one): rows split over ``data * fsdp``, parameters
        and optimiser state split along ``fsdp``. A batch that does not divide is padded with
        empty rows (no loss tokens, so the loss is unchanged).
    """

    optim: OptimConfig = OptimConfig(learning_rate=4e-5)
    batch_size: int = 8
    epochs: int = 4
    max_steps: int | None = None
    max_length: int = 11_500
    bucket_size: int = 64
    train_on: str = "all"
    seed: int = 0
    chunk_size: int = 256
    checkpoint_every: int | None = None
    log_every: int = 1
    mesh: MeshConfig = MeshConfig()

    def __post_init__(self):
        if self.batch_size < 1 or self.epochs < 1 or self.bucket_size < 1 or self.max_length < 2:
            raise ValueError("batch_size, epochs, bucket_size must be >= 1 and max_length >= 2")
        if self.max_steps is not None and self.max_steps < 0:
            raise ValueError("max_steps must be >= 0")


def sft_loss_fn(chunk_size: int = 256):
    """loss_fn(model, batch) -> (token-mean NLL over loss_mask, metrics)."""

    def loss_fn(model, batch):
        logp = batch_token_logprobs(model, batch, chunk_size)
        m = batch["loss_mask"]
        n = jnp.sum(m)
        loss = -jnp.sum(logp * m) / jnp.maximum(n, 1.0)
        return loss, {"nll": loss, "loss_tokens": n}

    return loss_fn


@functools.lru_cache(maxsize=8)
def _cached_step(graphdef, chunk_size: int, optim: OptimConfig, mesh=None):
    """One jitted SFT step per (model structure, chunk size, optimiser, mesh): repeated runs in
    a process (resume, sweeps) reuse the compiled step."""
    return make_train_step(graphdef, sft_loss_fn(chunk_size), make_optimizer(optim), mesh)


def tokenize_dataset(dataset: Any, tokenizer, max_length: int, train_on: str = "all") -> list[TokenRow]:
    """Chat dataset (path / list) -> TokenRows truncated to max_length (pre-tokenised rows pass through)."""
    if isinstance(dataset, (list, tuple)) and dataset and isinstance(dataset[0], TokenRow):
        rows = list(dataset)
    else:
        if tokenizer is None:
            raise ValueError("a tokenizer is needed to tokenise a chat dataset")
        rows = [tokenize_chat(tokenizer, m, t) for m, t in chat_samples(dataset, train_on)]
    rows = [dataclasses.replace(r, ids=r.ids[:max_length], weight=r.weight[:max_length]) for r in rows]
    rows = [r for r in rows if len(r) >= 2 and r.weight[1:].sum() > 0]
    if not rows:
        raise ValueError("no sample has a trainable (assistant) token after truncation")
    return rows


def sft_train(model, dataset: Any, config: SFTConfig = SFTConfig(), *, tokenizer=None,
              out_dir: str | os.PathLike | None = None, resume: bool = False, progress: bool = True,
              pad_id: int | None = None) -> TrainResult:
    """Fine-tunes ``model`` in place on a chat dataset.

    Args:
      model: a CausalLM (with LoRA applied when ``config.optim.trainable == 'lora'``).
      dataset: JSONL path, list of message lists / {'messages': ...} dicts, or TokenRows.
      config: SFTConfig.
      tokenizer: needed unless ``dataset`` holds TokenRows.
      out_dir: where metrics.jsonl, tb/ and checkpoints/ go (None = no files).
      resume: continue from the latest checkpoint in ``out_dir/checkpoints``.
      progress: show a tqdm bar.
      pad_id: padding id (default tokenizer.pad_token_id or 0).
    Returns:
      TrainResult (history of per-step metrics, final RunState).
    """
    rows = tokenize_dataset(dataset, tokenizer, config.max_length, config.train_on)
    if pad_id is None:
        pad_id = int(getattr(tokenizer, "pad_token_id", 0) or 0)
    per_epoch = -(-len(rows) // config.batch_size)
    total = config.max_steps if config.max_steps is not None else config.epochs * per_epoch

    mesh = make_mesh(config.mesh)
    require_global_mesh(mesh, "sft_train")
    graphdef, _, rest, state = initial_state(model, config.optim, mesh, config.seed)
    ckpt = open_checkpointer(out_dir, "sft")
    state = restored(state, ckpt, resume)
    step_fn = _cached_step(graphdef, config.chunk_size, config.optim, mesh)
    stream = iterate_epochs(len(rows), [len(r) for r in rows], config.batch_size, config.seed)
    for _ in range(state.data_position):
        next(stream)
    num_rows = round_up(config.batch_size, batch_shards(mesh))
    mine = process_block(num_rows)  # this process's rows of every batch (all of them with one process)

    def step(state: RunState) -> StepOutcome:
        epoch, index = next(stream)
        chosen = [rows[i] for i in index]
        length = bucket_length(max(len(r) for r in chosen) - 1, config.bucket_size, config.max_length)
        own = chosen[mine]
        batch = add_images(pad_rows(own, length, pad_id, num_rows=mine.stop - mine.start), own, model)
        batch = shard_batch(batch, mesh) if mesh is not None else jax.tree.map(jnp.asarray, batch)
        tokens = sum(min(len(r), length) for r in chosen)  # real input tokens of the whole batch
        start = time.perf_counter()
        params, opt_state, loss, metrics = step_fn(state.params, rest, state.opt_state, batch)
        loss = float(loss)  # blocks
        seconds = time.perf_counter() - start
        after = dataclasses.replace(state, params=params, opt_state=opt_state, step=state.step + 1,
                                    data_position=state.data_position + 1)
        record = {
            "loss": loss,
            "grad_norm": metrics["grad_norm"],
            "loss_tokens": metrics["loss_tokens"],
            "epoch": epoch,
            "padded_length": length,
            "tokens_per_s": tokens / max(seconds, 1e-9),
            "step_seconds": seconds,
            "peak_rss_gb": peak_rss_gb,
        }
        return StepOutcome(after, record, finite={"loss": loss, "grad_norm": float(metrics["grad_norm"])},
                           postfix={"loss": f"{loss:.4f}"})

    loop = LoopConfig("sft", total, config.checkpoint_every, config.log_every, config.optim.skip_nonfinite)
    return train_loop(model, state, step, loop, ckpt=ckpt, out_dir=out_dir, resume=resume, progress=progress)
