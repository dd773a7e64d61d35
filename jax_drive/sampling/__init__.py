"""Sampling: the jitted KV-cache sampler and the engine interface.

Public API:
  SamplingParams                    decoding settings shared by every engine
  Completion, Engine                the engine interface (``generate`` / ``generate_chat``)
  SessionEngine, supports_sessions  engines that keep KV caches between turns
  JaxEngine, Session                local flax.nnx CausalLM + jitted sampler; its sessions
  OpenAIEngine, OpenAIEngineError   OpenAI-compatible HTTP server (vLLM)
  SamplerConfig, generate_tokens    the low-level sampler on token ids
  PromptLookup                      prompt-lookup speculative decoding settings
"""

from jax_drive.sampling.engine import Completion, Engine, SessionEngine, supports_sessions
from jax_drive.sampling.local import JaxEngine
from jax_drive.sampling.openai_engine import OpenAIEngine, OpenAIEngineError
from jax_drive.sampling.params import SamplingParams
from jax_drive.sampling.sampler import SamplerConfig, SamplerOutput, generate_tokens
from jax_drive.sampling.session import Session
from jax_drive.sampling.speculative import PromptLookup

__all__ = [
    "Completion",
    "Engine",
    "JaxEngine",
    "OpenAIEngine",
    "OpenAIEngineError",
    "PromptLookup",
    "SamplerConfig",
    "SamplerOutput",
    "SamplingParams",
    "Session",
    "SessionEngine",
    "generate_tokens",
    "supports_sessions",
]
