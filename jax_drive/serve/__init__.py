"""``jax-drive serve``: an OpenAI-compatible HTTP server over our Flax policy.

Public API:
  PolicyRegistry       base model + named LoRA adapters (hot-swappable)
  RequestBatcher, BatcherConfig, GenerationJob, QueueFull   concurrent requests -> one engine call
  PolicyServer, ServeConfig                      request -> rows -> answer (no HTTP)
  ServeLimits                                    per-request limits (body, rows, tokens, time)
  (streaming.StreamedAnswer)                     stream=true: a job's chunks -> server-sent events
  create_app, bind_socket, run                   the HTTP layer (FastAPI + uvicorn)
Imported lazily, so the limits, errors and security modules (standard library only) load
without the model stack (the `jax-drive serve` parser reads its defaults from them).
"""

_LAZY = {
    "create_app": "app", "bind_socket": "app", "run": "app",
    "BatcherConfig": "batcher", "GenerationJob": "batcher", "QueueFull": "batcher",
    "RequestBatcher": "batcher",
    "ServeLimits": "limits",
    "PolicyRegistry": "policies",
    "PolicyServer": "server", "ServeConfig": "server",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"jax_drive.serve.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'jax_drive.serve' has no attribute {name!r}")


__all__ = sorted(_LAZY)
