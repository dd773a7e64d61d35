"""Sampling: the jitted KV-cache sampler and the engine interface.

Public API:
  SamplingParams                    decoding settings shared by every engine
  Completion, Engine                the engine interface (``generate`` / ``generate_chat``)
  SessionEngine, supports_sessions  engines that keep KV caches between turns
  JaxEngine, Session                local flax.nnx CausalLM + jitted sampler; its sessions
  DecodeStream, StreamChunk         ``JaxEngine.stream``: chunked decoding, cancellable rows
  OpenAIEngine, OpenAIEngineError   OpenAI-compatible HTTP server (vLLM, llama.cpp, jax-drive)
  SamplerConfig, generate_tokens    the low-level sampler on token ids
  PromptLookup                      prompt-lookup speculative decoding settings
  LogitsMask, NoMask                the decode loop's hook for constrained generation
  CompileCounter                    compilations counted from jax.monitoring events

Module map of the sampler: ``sampler`` (entry points) -> ``plan`` (pure request planning:
``shapes``, ``packing``) -> ``cache`` (prefill programs) -> ``decode`` (steps and the loop;
``selection``, ``speculative``, ``constraints``) -> ``outputs``; ``request`` (settings, keys),
``state`` (the loop carry), ``weights`` (the decode weight copy), ``session``, ``stream``.
The OpenAI engine: ``openai_engine`` on ``remote`` (dialects, requests, responses, transport).
"""

from jax_drive.sampling.compiles import CompileCounter
from jax_drive.sampling.constraints import LogitsMask, NoMask
from jax_drive.sampling.engine import Completion, Engine, SessionEngine, supports_sessions
from jax_drive.sampling.local import JaxEngine
from jax_drive.sampling.openai_engine import OpenAIEngine, OpenAIEngineError
from jax_drive.sampling.params import SamplingParams
from jax_drive.sampling.sampler import SamplerConfig, SamplerOutput, generate_tokens
from jax_drive.sampling.session import Session
from jax_drive.sampling.speculative import PromptLookup
from jax_drive.sampling.stream import DecodeStream, RowDelta, StreamChunk

__all__ = [
    "CompileCounter",
    "Completion",
    "DecodeStream",
    "Engine",
    "JaxEngine",
    "LogitsMask",
    "NoMask",
    "OpenAIEngine",
    "OpenAIEngineError",
    "PromptLookup",
    "RowDelta",
    "SamplerConfig",
    "SamplerOutput",
    "SamplingParams",
    "Session",
    "SessionEngine",
    "StreamChunk",
    "generate_tokens",
    "supports_sessions",
]
