"""Agent memory: versioned knowledge / strategy text per agent, and embedding retrieval.

* :class:`AgentMemory`: one agent's in-context knowledge ``K`` and cooperative strategy
  ``S`` (seed Section 4.1) with every earlier version (episode and source of each change).
* :class:`MemoryBank`: the memories of one run, keyed by :func:`memory_key` (scenario, seed,
  vehicle id), plus per-agent :class:`VectorMemory` stores (Correction+RAG); saved as one
  JSON file.
* :class:`Embedder`: text -> unit vectors, the mean over real tokens of a Flax ``CausalLM``'s
  final hidden states (no extra dependency, no download: the policy's own SmolLM2 works).
* :class:`VectorMemory`: texts with payloads and their embeddings; top-k retrieval by cosine
  similarity with scores. The *centralized memory* of the seed's generalisation study is one
  VectorMemory over every agent's best knowledge, shared across scenarios.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_drive.models import positions_from_mask
from jax_drive.sampling.sampler import count_bucket


def memory_key(scenario: str, seed: int, vehicle_id: int) -> str:
    """'tv_red_light/seed0/109': one learning agent (a role of a scenario in one seed's run)."""
    return f"{scenario}/seed{int(seed)}/{int(vehicle_id)}"


@dataclasses.dataclass
class AgentMemory:
    """Knowledge and strategy of one agent; ``observations`` are the observations (key
    frames) the current version was learnt from (the retrieval keys of the centralized
    memory); ``versions`` holds every state it had, oldest first, each {"version",
    "episode", "source", "knowledge", "strategy"}."""

    knowledge: str = ""
    strategy: str = ""
    observations: list = dataclasses.field(default_factory=list)
    versions: list = dataclasses.field(default_factory=list)

    @property
    def version(self) -> int:
        return len(self.versions)

    def update(self, knowledge: str, strategy: str, *, episode: int, source: str, max_chars: int = 600,
               observations: Sequence[str] = ()) -> None:
        """Replaces K and S (each cut to ``max_chars``) and records the new version."""
        self.knowledge, self.strategy = knowledge.strip()[:max_chars], strategy.strip()[:max_chars]
        self.observations = [str(o) for o in observations]
        self.versions.append({"version": len(self.versions) + 1, "episode": int(episode), "source": source,
                              "knowledge": self.knowledge, "strategy": self.strategy})

    def reset(self, *, episode: int) -> None:
        """Clears K and S (a knowledge reset), recorded as a version."""
        self.update("", "", episode=episode, source="reset")

    def to_json(self) -> dict:
        return {"knowledge": self.knowledge, "strategy": self.strategy, "observations": list(self.observations),
                "versions": list(self.versions)}

    @classmethod
    def from_json(cls, d: dict) -> AgentMemory:
        return cls(knowledge=str(d.get("knowledge", "")), strategy=str(d.get("strategy", "")),
                   observations=[str(o) for o in d.get("observations", [])], versions=list(d.get("versions", [])))


# ----------------------------------------------------------------------------- embeddings
@nnx.jit
def _mean_pooled(model, ids, mask):
    hidden = model.hidden_states(ids, positions_from_mask(mask), mask)  # (B, L, H)
    weight = mask[..., None].astype(jnp.float32)
    pooled = jnp.sum(hidden.astype(jnp.float32) * weight, axis=1) / jnp.maximum(jnp.sum(weight, axis=1), 1.0)
    return pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)


class Embedder:
    """Unit-norm text embeddings: the mean of a ``CausalLM``'s final (normed) hidden states
    over the real tokens of each text.

    Args:
      model: a ``jax_drive.models.CausalLM``; tokenizer: its tokenizer (``encode``).
      max_tokens: texts are cut to their first ``max_tokens`` tokens.
      bucket: padded lengths are multiples of this; batches are padded to
        :func:`~jax_drive.sampling.sampler.count_bucket` sizes (few compiled shapes, under a
        quarter of the rows padding).
    """

    def __init__(self, model, tokenizer, max_tokens: int = 128, bucket: int = 32):
        if max_tokens < 1 or bucket < 1:
            raise ValueError("max_tokens and bucket must be >= 1")
        self.model, self.tokenizer, self.max_tokens, self.bucket = model, tokenizer, max_tokens, bucket

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        """(N, H) float32 unit vectors (N = len(texts); (0, H) for none)."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        pad = int(self.tokenizer.pad_token_id or 0)
        rows = [(self.tokenizer.encode(t) or [pad])[: self.max_tokens] for t in texts]
        length = -(-max(len(r) for r in rows) // self.bucket) * self.bucket
        size = count_bucket(len(rows))
        ids = np.full((size, length), pad, np.int32)
        mask = np.zeros((size, length), bool)
        for k, r in enumerate(rows):
            ids[k, : len(r)], mask[k, : len(r)] = r, True
        mask[len(rows):, 0] = True  # padding rows: one token, discarded below
        return np.asarray(_mean_pooled(self.model, jnp.asarray(ids), jnp.asarray(mask)))[: len(rows)]


@dataclasses.dataclass
class Hit:
    """A retrieved entry: cosine score, the stored text and its payload."""

    score: float
    text: str
    payload: dict


class VectorMemory:
    """Texts with payloads and their unit embeddings; cosine top-k retrieval.

    ``vectors`` is (N, H) float32; entries are {"text", "payload"} dicts.
    """

    def __init__(self, dim: int):
        self.dim = int(dim)
        self.entries: list[dict] = []
        self.vectors = np.zeros((0, self.dim), np.float32)

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, texts: Sequence[str], payloads: Sequence[dict], vectors: np.ndarray) -> None:
        """Stores texts with payloads and their (N, H) embeddings (from an :class:`Embedder`)."""
        vectors = np.asarray(vectors, np.float32)
        if len(texts) != len(payloads) or vectors.shape != (len(texts), self.dim):
            raise ValueError(f"need one payload and one {self.dim}-vector per text, got {len(texts)} texts, "
                             f"{len(payloads)} payloads, vectors {vectors.shape}")
        self.entries += [{"text": str(t), "payload": dict(p)} for t, p in zip(texts, payloads)]
        self.vectors = np.concatenate([self.vectors, vectors], 0)

    def search(self, queries: np.ndarray, k: int = 1) -> list[list[Hit]]:
        """Top-``k`` entries per query (Q, H), best first, by cosine similarity."""
        queries = np.atleast_2d(np.asarray(queries, np.float32))
        if queries.shape[-1] != self.dim:
            raise ValueError(f"queries have dimension {queries.shape[-1]}, memory has {self.dim}")
        if not self.entries or k < 1:
            return [[] for _ in range(len(queries))]
        scores = queries @ self.vectors.T  # (Q, N)
        k = min(k, len(self.entries))
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return [[Hit(float(scores[q, j]), self.entries[j]["text"], self.entries[j]["payload"]) for j in top[q]]
                for q in range(len(queries))]

    def to_json(self) -> dict:
        return {"dim": self.dim, "entries": self.entries, "vectors": self.vectors.round(6).tolist()}

    @classmethod
    def from_json(cls, d: dict) -> VectorMemory:
        mem = cls(int(d["dim"]))
        vectors = np.asarray(d.get("vectors", []), np.float32).reshape(-1, mem.dim)
        entries = list(d.get("entries", []))
        if len(entries) != len(vectors):
            raise ValueError(f"{len(entries)} entries but {len(vectors)} vectors")
        mem.entries, mem.vectors = entries, vectors
        return mem


class MemoryBank:
    """All agent memories of one run: ``agents`` {key: AgentMemory} and ``corrections``
    {key: VectorMemory} (keys from :func:`memory_key`). ``meta`` holds free-form run
    information (method, episodes, solved lanes...)."""

    def __init__(self):
        self.agents: dict[str, AgentMemory] = {}
        self.corrections: dict[str, VectorMemory] = {}
        self.meta: dict = {}

    def agent(self, key: str) -> AgentMemory:
        """The memory of ``key`` (created empty on first use)."""
        return self.agents.setdefault(key, AgentMemory())

    def store(self, key: str, dim: int) -> VectorMemory:
        """The correction store of ``key`` (created empty on first use)."""
        return self.corrections.setdefault(key, VectorMemory(dim))

    def reset(self, prefix: str, *, episode: int) -> None:
        """Knowledge reset of every agent whose key starts with ``prefix`` (memories and
        correction stores)."""
        for key, mem in self.agents.items():
            if key.startswith(prefix):
                mem.reset(episode=episode)
        for key, store in list(self.corrections.items()):
            if key.startswith(prefix):
                self.corrections[key] = VectorMemory(store.dim)

    def to_json(self) -> dict:
        return {"agents": {k: m.to_json() for k, m in sorted(self.agents.items())},
                "corrections": {k: s.to_json() for k, s in sorted(self.corrections.items())}, "meta": self.meta}

    @classmethod
    def from_json(cls, d: dict) -> MemoryBank:
        bank = cls()
        bank.agents = {k: AgentMemory.from_json(v) for k, v in d.get("agents", {}).items()}
        bank.corrections = {k: VectorMemory.from_json(v) for k, v in d.get("corrections", {}).items()}
        bank.meta = dict(d.get("meta", {}))
        return bank

    def save(self, path: str | os.PathLike) -> str:
        from jax_drive.runinfo import write_json

        return write_json(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike) -> MemoryBank:
        with open(path, encoding="utf-8") as f:
            return cls.from_json(json.load(f))


def central_memory(bank: MemoryBank, embedder: Embedder) -> VectorMemory:
    """The seed's centralized memory: every agent's current (non-empty) knowledge and
    strategy in one store shared across scenarios. Entries are keyed by the observations the
    knowledge was learnt from (so a query, an agent's current observation, is compared with
    text of the same kind; the knowledge text itself when there are none); the payload holds
    the knowledge, the strategy and the agent's key."""
    texts, payloads = [], []
    for key, mem in sorted(bank.agents.items()):
        if mem.knowledge or mem.strategy:
            payload = {"key": key, "knowledge": mem.knowledge, "strategy": mem.strategy}
            for text in mem.observations or [f"{mem.knowledge} {mem.strategy}".strip()]:
                texts.append(text)
                payloads.append(payload)
    store = VectorMemory(embedder.dim)
    if texts:
        store.add(texts, payloads, embedder(texts))
    return store
