"""What a TalkingVehicles evaluation was run with, as a short hash: the key of its saved
chunks, so a policy that changed (a retrained student, new memories, another model or
prompt setting) is evaluated again instead of reusing the old policy's records.

A policy's identity is a JSON-able description: for a rule-based baseline its name, for an
LLM agent the model (a local directory or file: a hash of its bytes), the engine and the
agent's prompt / decoding settings, plus for the learning methods the learned memories (a
hash of their checkpoint files) and for the distilled policy the student's saved files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence

_BLOCK = 1 << 20


def files_digest(paths: Sequence[str]) -> str:
    """sha256 (hex) over the files under ``paths`` (files or directories, walked in sorted
    order): each file's path relative to its root and its bytes. A missing path counts as
    its name only, so adding it later changes the digest."""
    digest = hashlib.sha256()
    for root in paths:
        root = os.fspath(root)
        files = [root] if os.path.isfile(root) else sorted(
            os.path.join(d, f) for d, _, names in os.walk(root) for f in names)
        base = root if os.path.isdir(root) else os.path.dirname(root)
        digest.update(f"root:{os.path.basename(os.path.normpath(root))}:{len(files)}\0".encode())
        for path in files:
            digest.update(os.path.relpath(path, base).encode() + b"\0")
            with open(path, "rb") as f:
                while block := f.read(_BLOCK):
                    digest.update(block)
    return digest.hexdigest()


def model_identity(source: str) -> dict:
    """A model source as an identity: a local file or directory is hashed (its weights may be
    rewritten under the same name); a named source ('smollm2-135m-instruct', 'tiny') or a
    served model name is its name."""
    if os.path.exists(source):
        return {"model_files": files_digest([source])}
    return {"model": source}


def config_identity(config) -> dict:
    """A frozen settings dataclass as a JSON-able dict (non-JSON leaves as their repr)."""
    return json.loads(json.dumps(dataclasses.asdict(config), sort_keys=True, default=repr))


def digest(identity: dict) -> str:
    """12 hex digits of sha256 over ``identity`` as canonical JSON (the chunk key)."""
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
