"""``jax-drive serve``: an OpenAI-compatible HTTP server over our Flax policy.

Public API:
  PolicyRegistry       base model + named LoRA adapters (hot-swappable)
  RequestBatcher, BatcherConfig, GenerationJob   concurrent requests -> one engine call
  PolicyServer, ServeConfig, create_app, run      the HTTP layer (FastAPI + uvicorn)
"""

from jax_drive.serve.app import PolicyServer, ServeConfig, create_app, run
from jax_drive.serve.batcher import BatcherConfig, GenerationJob, RequestBatcher
from jax_drive.serve.policies import PolicyRegistry

__all__ = [
    "BatcherConfig",
    "GenerationJob",
    "PolicyRegistry",
    "PolicyServer",
    "RequestBatcher",
    "ServeConfig",
    "create_app",
    "run",
]
