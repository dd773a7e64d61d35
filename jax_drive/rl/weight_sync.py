"""Weight sync: keep a remote rollout engine on the trainer's current policy.

When a server (vLLM, ``jax-drive serve``) generates the rollouts, every mtGRPO step changes
the policy the server must sample from; without a push the next step trains on rollouts of
a stale policy, and nothing fails: the trainer's recomputed pi_old simply drifts from the
sampler's (``logp_mismatch`` in the step record). :class:`WeightSync` is an ``Engine`` around
an :class:`~jax_drive.sampling.OpenAIEngine` that pushes the trainer's live model to the
server and always samples the version pushed last:

    sync = WeightSync(OpenAIEngine(url, "base-name", tokenizer=tok, require_token_logprobs=True),
                      model, WeightSyncConfig(directory="runs/x/sync"))
    grpo_train(model, tok, scenes, config, engine=sync, on_step=sync.on_step)

Its first ``generate`` pushes the model as it is (SFT weights, or a resumed checkpoint),
and ``on_step`` pushes after every trainer step, so every rollout is sampled on-policy.

Modes:

* ``"lora"`` (LoRA training): ``export_peft`` writes the adapter (PEFT directory), then
  ``POST /v1/load_lora_adapter`` loads it. With ``versioned=True`` (default) push k is
  loaded under a new name ``{adapter_name}-v{k}`` and the previous version is unloaded once
  the new one answers; requests name the version. A new name is a new adapter to the
  server, so nothing cached for an older version (vLLM's prefix cache is keyed by the
  adapter) can be reused. ``versioned=False`` reloads one name in place (vLLM's
  ``load_inplace``; unload + load on servers without it).
* ``"full"`` (full fine-tuning, or LoRA folded in): ``save_safetensors`` writes the whole
  model, then ``POST /update_weights_from_disk`` reloads the base weights (``jax-drive
  serve``; SGLang has the same endpoint). vLLM has no HTTP reload from disk: its trainers
  (TRL, OpenRLHF, veRL) broadcast tensors over NCCL (``/init_communicator`` +
  ``/update_named_param`` in TRL's server, ``collective_rpc`` in OpenRLHF) and then reset the
  prefix cache; that needs GPUs on both sides and is not implemented here.

Exports go to ``directory/v{k:06d}`` (it must be readable by the server: same machine or a
shared file system); the ``keep`` newest stay on disk.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.configs import at_least
from jax_drive.sampling.engine import Completion, Message, Prompt
from jax_drive.sampling.openai_engine import OpenAIEngine, OpenAIEngineError
from jax_drive.sampling.params import SamplingParams

PROBE_TEXT = "The light ahead turns red. What do you do?"

@dataclasses.dataclass(frozen=True)
class WeightSyncConfig:
    """How the trainer's weights reach the server.

    Attributes:
      mode: 'lora' (push the PEFT adapter; default) or 'full' (push all weights).
      directory: where exports are written (readable by the server); None = a new
        temporary directory.
      adapter_name: served name of the adapter ('lora' mode; default 'policy').
      versioned: 'lora' mode: a new name per push (default True) or one name reloaded in
        place (False).
      keep: exports kept on disk (the newest; default 2, at least 1).
      base_model_name: recorded in the PEFT adapter_config.json (optional).
      verify_tolerance: after every push, sample a short probe from the server and compare
        its log-probs with the trainer's (``served_logprob_gap``; needs the engine's
        tokenizer); the gap is recorded and a larger one than this warns (a server on other
        base weights or in another dtype). None (default) = no probe.
    """

    mode: Literal["lora", "full"] = "lora"
    directory: str | None = None
    adapter_name: str = "policy"
    versioned: bool = True
    keep: int = 2
    base_model_name: str = ""
    verify_tolerance: float | None = None

    def __post_init__(self):
        if self.mode not in ("lora", "full"):
            raise ValueError(f"mode must be 'lora' or 'full', got {self.mode!r}")
        if not self.adapter_name:
            raise ValueError("adapter_name must be non-empty")
        at_least(self, 1, "keep")


@dataclasses.dataclass(frozen=True)
class SyncRecord:
    """One push: push index, trainer step, served name, export directory, seconds spent
    exporting and loading, and the probe's max |served - trainer| log-prob (None unprobed)."""

    version: int
    step: int | None
    model: str
    path: str
    export_seconds: float
    load_seconds: float
    logprob_gap: float | None = None


class WeightSync:
    """An ``Engine`` that samples the trainer's latest pushed policy from a server.

    Args:
      engine: ``OpenAIEngine`` of the server; its ``model`` is the served base model.
      model: the trainer's live ``CausalLM`` (``grpo_train`` writes each step's weights into
        it before calling ``on_step``).
      config: WeightSyncConfig.
    """

    supports_sessions = False

    def __init__(self, engine: OpenAIEngine, model, config: WeightSyncConfig = WeightSyncConfig()):
        if not isinstance(engine, OpenAIEngine):
            raise TypeError(f"engine must be an OpenAIEngine, got {type(engine).__name__}")
        self.base = engine
        self.model = model
        self.config = config
        if config.directory is None:
            import tempfile

            self.directory = Path(tempfile.mkdtemp(prefix="jax-drive-sync-"))
        else:
            self.directory = Path(config.directory)
            self.directory.mkdir(parents=True, exist_ok=True)
        self.history: list[SyncRecord] = []
        self._current: OpenAIEngine | None = None
        self._exports: list[Path] = []

    # ------------------------------------------------------------------ pushing
    @property
    def version(self) -> int | None:
        """Index of the last push (None before the first)."""
        return self.history[-1].version if self.history else None

    @property
    def served_model(self) -> str | None:
        """The name requests use now (None before the first push)."""
        return None if self._current is None else self._current.model

    def _export(self, path: Path) -> None:
        from jax_drive.models.export import export_peft, save_safetensors

        if path.exists():
            shutil.rmtree(path)
        if self.config.mode == "lora":
            export_peft(self.model, path, self.config.base_model_name)
        else:
            save_safetensors(self.model, path)

    def _load(self, path: Path, version: int) -> OpenAIEngine:
        base, cfg = self.base, self.config
        if cfg.mode == "full":
            base.update_weights_from_disk(str(path))
            return base
        name = f"{cfg.adapter_name}-v{version}" if cfg.versioned else cfg.adapter_name
        base.load_lora_adapter(name, str(path), replace=True)
        if cfg.versioned:
            # the previous version, or on the first push the versions a killed run left behind
            stale = [self.served_model] if self.served_model is not None else [
                m for m in base.list_models() if m.startswith(f"{cfg.adapter_name}-v")]
            for old in stale:
                if old == name:
                    continue
                try:
                    base.unload_lora_adapter(old)
                except OpenAIEngineError as error:
                    if error.status != 404:  # already gone is fine
                        raise
        return base.with_model(name)

    def push(self, step: int | None = None) -> SyncRecord:
        """Exports the live model and loads it into the server; later requests use it.

        Args:
          step: the trainer step the weights belong to (recorded only).
        Raises:
          OpenAIEngineError / UnsupportedParameterError: the server refused the load (e.g.
            no LoRA endpoints, or 'full' mode on a server without weight reloading).
        """
        version = 0 if self.version is None else self.version + 1
        path = self.directory / f"v{version:06d}"
        t0 = time.perf_counter()
        self._export(path)
        t1 = time.perf_counter()
        self._current = self._load(path, version)
        t2 = time.perf_counter()
        self._exports.append(path)
        while len(self._exports) > self.config.keep:
            shutil.rmtree(self._exports.pop(0), ignore_errors=True)
        record = SyncRecord(version, step, self._current.model, str(path), t1 - t0, t2 - t1, self._probe(version))
        self.history.append(record)
        with open(self.directory / "history.jsonl", "a") as handle:
            handle.write(json.dumps(dataclasses.asdict(record)) + "\n")
        return record

    def _probe(self, version: int) -> float | None:
        tolerance, tokenizer = self.config.verify_tolerance, self.base.tokenizer
        if tolerance is None or tokenizer is None:
            return None
        prompt = list(tokenizer.encode(PROBE_TEXT))
        gap = served_logprob_gap(self._current, self.model, [prompt], jax.random.key(version))["max_abs"]
        if gap > tolerance:
            warnings.warn(f"after push {version} the server's log-probs differ from the trainer's by up to "
                          f"{gap:.2e} (> {tolerance:g}): does it serve the trainer's base weights and dtype?",
                          RuntimeWarning, stacklevel=3)
        return gap

    def on_step(self, state, record: dict | None = None) -> None:
        """``grpo_train``'s ``on_step`` callback: pushes the step's weights (``state.step``)."""
        self.push(int(getattr(state, "step", 0)))

    def engine(self) -> OpenAIEngine:
        """The server engine on the latest pushed version (pushes the model first if nothing
        was pushed yet)."""
        if self._current is None:
            self.push()
        assert self._current is not None
        return self._current

    # ---------------------------------------------------------------- interface
    def generate(self, prompts: Sequence[Prompt], params: SamplingParams, key: jax.Array) -> list[Completion]:
        """``Engine.generate`` on the latest pushed version."""
        return self.engine().generate(prompts, params, key)

    def generate_chat(self, conversations: Sequence[Sequence[Message]], params: SamplingParams,
                      key: jax.Array) -> list[Completion]:
        """``Engine.generate_chat`` on the latest pushed version."""
        return self.engine().generate_chat(conversations, params, key)


def server_api_key(api_key: str | None = None) -> str | None:
    """``api_key``, else ``$JAX_DRIVE_API_KEY`` (the variable `jax-drive serve` reads too), else None."""
    from jax_drive.serve.security import API_KEY_ENV

    return api_key if api_key is not None else (os.environ.get(API_KEY_ENV) or None)


def served_base_model(url: str, served_model: str | None = None, api_key: str | None = None) -> str:
    """The server's name of the base model to train against: ``served_model`` once checked
    to be served, or (None) the first model the server lists. ``api_key``: see
    ``server_api_key``.

    Raises:
      OpenAIEngineError: the server cannot be reached (after the engine's retries), serves
        nothing, or does not serve ``served_model``.
    """
    names = OpenAIEngine(url, "unset", server_api_key(api_key), check_model=False).list_models()
    if not names:
        raise OpenAIEngineError(f"{url} serves no model")
    if served_model is None:
        return names[0]
    if served_model not in names:
        raise OpenAIEngineError(f"{url} does not serve {served_model!r} (served: {names})")
    return served_model


def connect_trainer(url: str, model, tokenizer, trainable: str, directory: str | None = None,
                    served_model: str | None = None, verify_tolerance: float | None = 1e-3,
                    api_key: str | None = None) -> WeightSync:
    """A :class:`WeightSync` for training ``model`` against the server at ``url``.

    Args:
      url: server root, e.g. 'http://localhost:8000'.
      model, tokenizer: the trainer's live policy and its tokenizer.
      trainable: the trainer's ``OptimConfig.trainable``: 'lora' pushes adapters, 'full'
        all weights.
      directory: where exports go (None: a temporary directory).
      served_model: the server's name of the base model (default: the first model it lists).
      verify_tolerance: see ``WeightSyncConfig`` (default 1e-3: warn when the server's
        log-probs are further from the trainer's).
      api_key: the server's API key (default ``$JAX_DRIVE_API_KEY``; pushing weights to
        `jax-drive serve` needs one).
    """
    api_key = server_api_key(api_key)
    served_model = served_base_model(url, served_model, api_key)
    engine = OpenAIEngine(url, served_model, api_key, tokenizer=tokenizer, require_token_logprobs=True)
    config = WeightSyncConfig(mode="lora" if trainable == "lora" else "full", directory=directory,
                              verify_tolerance=verify_tolerance)
    return WeightSync(engine, model, config)


def trainer_logprobs(model, prompt_ids: Sequence[int], token_ids: Sequence[int],
                     temperature: float = 1.0, bucket_size: int = 64) -> np.ndarray:
    """log pi(token_ids[i] | prompt_ids + token_ids[:i]) under ``model``, as (n,) float32:
    the trainer's view of a completion the server sampled. The sequence is padded to a
    multiple of ``bucket_size`` (one compiled program per bucket)."""
    from jax_drive.data.tokens import TokenRow
    from jax_drive.rl.batching import bucket_length, pad_rows

    if len(token_ids) == 0 or len(prompt_ids) == 0:
        raise ValueError("need a non-empty prompt and completion")
    ids = np.asarray(list(prompt_ids) + list(token_ids), np.int32)
    batch = pad_rows([TokenRow(ids, np.ones_like(ids, np.float32))], bucket_length(len(ids) - 1, bucket_size), 0)
    logp = model.token_logprobs(*(jnp.asarray(batch[k]) for k in ("input_ids", "positions", "attention_mask",
                                                                    "targets")), temperature=temperature)
    start = len(prompt_ids) - 1
    return np.asarray(logp[0, start:start + len(token_ids)], np.float32)


def served_logprob_gap(engine, model, prompts: Sequence[Sequence[int]], key: jax.Array,
                       max_new_tokens: int = 8) -> dict[str, Any]:
    """How far the server's policy is from the trainer's: samples each token-id prompt once
    (temperature 1, raw log-probs) and compares the served log-probs with ``model``'s.

    Returns:
      {'max_abs': max |served - trainer| over all sampled tokens, 'tokens': their count}.
    """
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0)
    completions = engine.generate([list(p) for p in prompts], params, key)
    gaps = []
    for prompt, c in zip(prompts, completions):
        if not c.token_ids:
            continue
        mine = trainer_logprobs(model, prompt, c.token_ids)
        gaps.append(np.abs(mine - np.asarray(c.logprobs, np.float32)))
    every = np.concatenate(gaps) if gaps else np.zeros((0,), np.float32)
    return {"max_abs": float(every.max()) if every.size else 0.0, "tokens": int(every.size)}

