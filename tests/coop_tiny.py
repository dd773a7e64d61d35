"""The tiny random model of the coop tests, imported in this one place (its module may move),
and an engine wrapper that counts batch sizes."""

from jax_drive.models.tiny import byte_tokenizer, tiny_policy  # noqa: F401


def tiny_model(seed: int = 0):
    """(model, tokenizer): a fresh tiny random CausalLM over the byte tokenizer, no LoRA."""
    model, _, tokenizer = tiny_policy(seed=seed, lora_rank=None)
    return model, tokenizer


def tiny_engine(seed: int = 0):
    """A JaxEngine over the tiny random model with the pipeline's prompt buckets."""
    from jax_drive.pipelines.engines import EngineSpec, make_engine
    from jax_drive.pipelines.talking_vehicles.presets import PROMPT_BUCKETS

    return make_engine(EngineSpec(prompt_buckets=PROMPT_BUCKETS, min_gen_bucket=8, max_batch=64), *tiny_model(seed))


class CountingEngine:
    """Wraps a real engine; ``calls`` records every generate_chat call's number of conversations."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def generate_chat(self, conversations, params, key):
        self.calls.append(len(conversations))
        return self.engine.generate_chat(conversations, params, key)
