"""Sampling: the jitted KV-cache sampler and the engine interface.

Public API:
  SamplingParams                    decoding settings shared by every engine
  Completion, Engine                the engine interface (``generate`` / ``generate_chat``)
  JaxEngine                         local flax.nnx CausalLM + jitted sampler
  OpenAIEngine, OpenAIEngineError   OpenAI-compatible HTTP server (vLLM)
  SamplerConfig, generate_tokens    the low-level sampler on token ids
"""

from jax_drive.sampling.engine import Completion, Engine
from jax_drive.sampling.local import JaxEngine
from jax_drive.sampling.openai_engine import OpenAIEngine, OpenAIEngineError
from jax_drive.sampling.params import SamplingParams
from jax_drive.sampling.sampler import SamplerConfig, SamplerOutput, generate_tokens

__all__ = [
    "Completion",
    "Engine",
    "JaxEngine",
    "OpenAIEngine",
    "OpenAIEngineError",
    "SamplerConfig",
    "SamplerOutput",
    "SamplingParams",
    "generate_tokens",
]
