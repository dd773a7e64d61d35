"""Optional Pallas kernels for jax-drive's hottest operations, each with a pure-JAX twin.

The twin is the default on CPU and the oracle the kernel is tested against (in Pallas'
interpret mode); on a GPU or TPU the dispatcher runs the kernel. ``impl=`` overrides the
choice per call (see :mod:`kernels.dispatch`).

* :func:`token_logprobs`: vocabulary-chunked log-softmax + gather with a custom VJP, for
  the trainer's token log-probs without a (B, L, V) logits tensor.
* :func:`boxes_overlap`: separating-axis overlap of oriented boxes for (proposals x steps x
  objects), for the PDM collision / TTC checks and the simulator's collision test.
"""

from kernels.box_overlap import BoxOverlapConfig, boxes_overlap, rectangles_overlap
from kernels.dispatch import IMPLS, resolve_impl
from kernels.logprob import AllowedTokens, LogprobConfig, token_logprobs

__all__ = [
    "AllowedTokens",
    "IMPLS",
    "BoxOverlapConfig",
    "LogprobConfig",
    "boxes_overlap",
    "rectangles_overlap",
    "resolve_impl",
    "token_logprobs",
]
