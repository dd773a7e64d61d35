"""Which implementation of a kernel runs: the pure-JAX twin or the Pallas kernel.

``impl`` names, shared by every kernel in this package:

* ``"jax"``: the pure-JAX twin (the default on CPU, and the oracle of the tests);
* ``"pallas"``: the compiled Pallas kernel (GPU via Triton, TPU via Mosaic);
* ``"interpret"``: the same Pallas kernel run by Pallas' interpreter, on any backend (slow;
  how the tests check the kernel against its twin on a CPU).

``None`` picks ``"pallas"`` when JAX's default backend is a GPU or TPU and ``"jax"`` otherwise.
"""

from __future__ import annotations

import jax

IMPLS: tuple[str, ...] = ("jax", "pallas", "interpret")
ACCELERATORS: tuple[str, ...] = ("gpu", "tpu")


def resolve_impl(impl: str | None) -> str:
    """The implementation to run for ``impl`` (see the module docstring).

    Raises ValueError for an unknown name, or for ``"pallas"`` without a GPU or TPU (a
    compiled Pallas kernel cannot run on the CPU backend; use ``"interpret"`` there).
    """
    backend = jax.default_backend()
    if impl is None:
        return "pallas" if backend in ACCELERATORS else "jax"
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS} or None, got {impl!r}")
    if impl == "pallas" and backend not in ACCELERATORS:
        raise ValueError(f"impl='pallas' needs a GPU or TPU backend, this one is {backend!r}; "
                         "use impl='interpret' to run the kernel on the CPU")
    return impl
