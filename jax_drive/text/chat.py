"""Chat conversations as plain message lists any Hugging Face chat template can render.

A conversation is ``[{"role": "system" | "user" | "assistant", "content": str}, ...]``.
A multi-turn MTDrive episode reads::

    [system?] user: planning prompt
              assistant: trajectory 1
              user: PDM feedback on trajectory 1
              assistant: trajectory 2
              ...

For SFT samples the final assistant message is the target; everything before it is the
prompt (:func:`split_prompt_target`).
"""

from __future__ import annotations

from typing import Any

from jax_drive.configs import one_of

ROLES = ("system", "user", "assistant")
Message = dict[str, str]


def message(role: str, content: str) -> Message:
    """One message; raises ValueError for an unknown role or non-string content."""
    one_of("role", role, ROLES)
    if not isinstance(content, str):
        raise ValueError(f"content must be a str, got {type(content).__name__}")
    return {"role": role, "content": content}


def conversation(prompt: str, system: str | None = None) -> list[Message]:
    """Starts a conversation: optional system message + the user prompt."""
    messages = [message("system", system)] if system else []
    messages.append(message("user", prompt))
    return messages


def add_turn(messages: list[Message], answer: str, feedback: str | None = None) -> list[Message]:
    """Returns a new list with the assistant ``answer`` and, if given, the user ``feedback``."""
    out = list(messages) + [message("assistant", answer)]
    if feedback:
        out.append(message("user", feedback))
    return out


def validate(messages: Any) -> list[Message]:
    """Checks a conversation: roles, string contents, system only first, user/assistant
    alternate starting with user. Returns it; raises ValueError otherwise."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("a conversation is a non-empty list of messages")
    expected = "user"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) != {"role", "content"}:
            raise ValueError(f"message {i} must be a dict with role and content")
        message(m["role"], m["content"])
        if m["role"] == "system":
            if i != 0:
                raise ValueError("a system message may only come first")
            continue
        if m["role"] != expected:
            raise ValueError(f"message {i}: expected role {expected}, got {m['role']}")
        expected = "assistant" if expected == "user" else "user"
    return messages


def split_prompt_target(messages: list[Message]) -> tuple[list[Message], str]:
    """Prompt messages and the final assistant target of an SFT sample."""
    validate(messages)
    if messages[-1]["role"] != "assistant":
        raise ValueError("an SFT sample must end with the assistant target")
    return messages[:-1], messages[-1]["content"]


def num_turns(messages: list[Message]) -> int:
    """Number of assistant turns in a conversation."""
    return sum(m["role"] == "assistant" for m in messages)
