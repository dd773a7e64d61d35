"""The protocol side of ``OpenAIEngine`` (``jax_drive.sampling.openai_engine``), one concern
per module: ``errors``; ``dialects`` (what each server accepts and returns, as data);
``requests`` (JSON bodies per dialect, seeds); ``responses`` (answers -> ``Completion``,
never raising on malformed output: a typed ``ParseFailure``); ``transport`` (HTTP with
retries)."""
