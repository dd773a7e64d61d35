"""The policies a server holds: one base model and named LoRA adapters on top of it.

Each adapter is a clone of the base ``CausalLM`` (the clone shares the base's weight
arrays; only the adapter's A/B matrices are new) with a PEFT adapter applied by
``jax_drive.models.export.load_peft``, wrapped in its own ``JaxEngine``. Loading builds the
new engine first and then swaps it in under a lock, so a batch already running finishes on
the old weights and every request that arrives after the load answer uses the new ones:
a trainer can export its adapter after each step (``export_peft``) and push it with
``load_lora_adapter(name, path, load_inplace=True)`` to sample on-policy from then on.

A full fine-tuning trainer instead saves its whole model (``save_safetensors``) and has the
base weights reloaded from that directory (``load_weights``; SGLang's
``/update_weights_from_disk``): the new base model and its engine are built, the loaded
adapters are applied again on top of it from their directories, and everything is swapped
in at once. One update (adapter or weights) runs at a time.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path

from flax import nnx

from jax_drive.sampling import Engine, JaxEngine
from jax_drive.serve.errors import InvalidRequest


class PolicyRegistry:
    """Name -> engine for the base model and its LoRA adapters.

    Args:
      model: the base ``CausalLM`` (without LoRA adapters when adapters are to be loaded).
      tokenizer: its tokenizer (encode / decode / apply_chat_template / eos_token_ids).
      name: the base model's served name.
      max_loras: most adapters held at once (loading one more is refused).
      engine_factory: model -> Engine (default ``JaxEngine(model, tokenizer)``).
    """

    def __init__(self, model, tokenizer, name: str, max_loras: int = 4,
                 engine_factory: Callable[[object], Engine] | None = None):
        if not name:
            raise ValueError("the served model name must be non-empty")
        if max_loras < 0:
            raise ValueError("max_loras must be >= 0")
        self.base_name = name
        self.model = model
        self.tokenizer = tokenizer
        self.max_loras = int(max_loras)
        self.engine_factory = engine_factory or (lambda m: JaxEngine(m, tokenizer))
        self._engines: dict[str, Engine] = {name: self.engine_factory(model)}
        self._paths: dict[str, str] = {}
        self._lock = threading.Lock()  # guards the name -> engine tables
        self._update_lock = threading.Lock()  # one adapter / weight update at a time
        self.weights_path: str | None = None  # where the base weights were last reloaded from

    @property
    def max_model_len(self) -> int:
        return int(self.model.config.max_position_embeddings)

    def names(self) -> list[str]:
        """Served names: the base first, then adapters in load order."""
        with self._lock:
            return list(self._engines)

    def adapters(self) -> dict[str, str]:
        """Adapter name -> the directory it was loaded from."""
        with self._lock:
            return dict(self._paths)

    def engine(self, name: str) -> Engine:
        """The engine serving ``name``; ``InvalidRequest`` (404) for an unknown name."""
        with self._lock:
            engine = self._engines.get(name)
            served = list(self._engines)
        if engine is None:
            raise InvalidRequest(f"The model `{name}` does not exist (served: {served})",
                                 "model", status=404, code="model_not_found")
        return engine

    def build_adapter_engine(self, path: str | Path, base=None) -> Engine:
        """A new engine: the base model (or ``base``) with the PEFT adapter at ``path`` (slow
        part, no lock)."""
        from jax_drive.models.export import load_peft

        clone = nnx.clone(self.model if base is None else base)
        try:
            load_peft(clone, path)
        except (FileNotFoundError, ValueError, KeyError) as error:
            raise InvalidRequest(f"cannot load the LoRA adapter at {str(path)!r}: {error}",
                                 "lora_path") from None
        return self.engine_factory(clone)

    def load_adapter(self, name: str, path: str | Path, load_inplace: bool = False) -> None:
        """Loads (or with ``load_inplace`` replaces) the adapter served as ``name``."""
        if name == self.base_name:
            raise InvalidRequest(f"{name!r} is the base model's name", "lora_name")
        if not Path(path).is_dir():
            raise InvalidRequest(f"LoRA adapter directory {str(path)!r} does not exist", "lora_path")
        with self._update_lock:
            with self._lock:
                exists = name in self._paths
            if exists and not load_inplace:
                raise InvalidRequest(f"The lora adapter '{name}' has already been loaded "
                                     "(pass load_inplace=true to replace it)", "lora_name")
            if not exists and len(self._paths) >= self.max_loras:
                raise InvalidRequest(f"{self.max_loras} adapters are loaded already (max_loras)",
                                     "lora_name")
            engine = self.build_adapter_engine(path)
            with self._lock:
                self._engines[name] = engine
                self._paths[name] = str(path)

    def load_weights(self, path: str | Path) -> None:
        """Replaces the base model's weights by the checkpoint in ``path`` (an HF directory:
        config.json + safetensors, as ``save_safetensors`` writes), in the served dtype.

        Raises:
          InvalidRequest: no such directory, an unreadable checkpoint, or a model config that
            differs from the served one (only weights can change).
        """
        from jax_drive.models.loading import WeightLoadError, load_safetensors_dir

        if not Path(path).is_dir():
            raise InvalidRequest(f"weights directory {str(path)!r} does not exist", "model_path")
        with self._update_lock:
            try:
                model, config = load_safetensors_dir(path, dtype=self.model.config.dtype)
            except (FileNotFoundError, WeightLoadError, ValueError, KeyError) as error:
                raise InvalidRequest(f"cannot load weights from {str(path)!r}: {error}",
                                     "model_path") from None
            served = self.model.config
            if config != served:
                changed = sorted(f.name for f in dataclasses.fields(served)
                                 if getattr(config, f.name) != getattr(served, f.name))
                raise InvalidRequest(f"the checkpoint in {str(path)!r} has another model config "
                                     f"(differs in {changed}); only weights can be reloaded",
                                     "model_path")
            with self._lock:
                paths = dict(self._paths)
            engines = {self.base_name: self.engine_factory(model)}
            engines.update({name: self.build_adapter_engine(p, model) for name, p in paths.items()})
            with self._lock:
                self.model = model
                self._engines = engines
                self.weights_path = str(path)

    def unload_adapter(self, name: str) -> None:
        if name == self.base_name:
            raise InvalidRequest("the base model cannot be unloaded", "lora_name")
        with self._update_lock, self._lock:
            if name not in self._paths:
                raise InvalidRequest(f"The lora adapter '{name}' cannot be found", "lora_name",
                                     status=404)
            del self._engines[name]
            del self._paths[name]
