"""jax-drive: a JAX-native accelerated RL stack for language-model driving policies."""

__version__ = "0.1.0"
