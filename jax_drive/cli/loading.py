"""Model loading shared by the commands that take ``--model``/``SOURCE``, ``--dtype`` and ``--lora``."""

from __future__ import annotations

from jax_drive.runinfo import InputError


def load_model(source: str, dtype: str, lora: str | None = None):
    """(model, config, tokenizer) from ``source`` with the PEFT adapter ``lora`` merged when given;
    a missing or unreadable checkpoint is a usage error (exit 2), not a traceback."""
    from jax_drive.models import load_pretrained

    try:
        model, config, tokenizer = load_pretrained(source, dtype=dtype)
        if lora:
            from jax_drive.models.export import load_peft

            load_peft(model, lora)
    except (FileNotFoundError, ValueError) as error:
        raise InputError(str(error)) from None
    return model, config, tokenizer
