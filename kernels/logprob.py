"""Token log-probs over a large vocabulary without a (tokens, V) logits tensor.

For hidden states h_n (D,), an output head W (V, D), targets t_n and a temperature T:

    z_nv    = <h_n, W_v> / T
    lse_n   = log sum_v exp(z_nv)
    logp_n  = z_{n, t_n} - lse_n

The tokens are taken ``token_chunk`` at a time and, within a token chunk, the vocabulary
``vocab_chunk`` columns at a time, merging each chunk's (max, sum of exponentials, target
logit) into running values (the online logsumexp), so the largest live float32 block is
(token_chunk, vocab_chunk). The custom VJP keeps only lse (tokens,) from the forward pass and
recomputes each logits block in the backward pass:

    dz_nv = g_n / T * (1[v = t_n] - exp(z_nv - lse_n))
    dh_n  = sum_v dz_nv W_v              dW_v = sum_n dz_nv h_n

The gradient of the head is skipped when the head is not differentiated (LoRA training).

With an :class:`AllowedTokens` mask (structured generation: the tokens a grammar allowed at
each position) the sum runs over the allowed columns only: disallowed logits are -inf in
every block of both passes, so logp_n is the log-probability under the masked policy (0 for
a token that was the only one allowed, whose gradient is then 0 too). The mask is given per
token as allowed token *classes* plus a class per vocabulary column (one row per grammar),
never as a (tokens, V) array.

Two implementations of the per-block work share the loops above: the pure-JAX twin (an
einsum per block) and a Pallas kernel (tiles of ``token_block`` x ``vocab_block`` logits,
accumulated over ``hidden_block`` slices of D); :mod:`kernels.dispatch` picks one.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Literal

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels.dispatch import resolve_impl

HeadLayout = Literal["vd", "dv"]


@dataclasses.dataclass(frozen=True)
class LogprobConfig:
    """Chunk and tile sizes of :func:`token_logprobs`.

    Attributes:
      token_chunk: tokens per outer step (1024).
      vocab_chunk: vocabulary columns per inner step (4096); with token_chunk, the live
        float32 logits block is token_chunk x vocab_chunk (16 MiB at the defaults).
        Both shrink to the problem and are rounded up to multiples of the tile.
      token_block, vocab_block: the Pallas kernel's logits tile (64 x 128); powers of two,
        as Triton needs.
      hidden_block: slice of D per step of the kernel's dot-product loop (64); D itself when
        it does not divide D.
    """

    token_chunk: int = 1024
    vocab_chunk: int = 4096
    token_block: int = 64
    vocab_block: int = 128
    hidden_block: int = 64

    def __post_init__(self):
        sizes = dataclasses.asdict(self)
        if any(not isinstance(v, int) or v < 1 for v in sizes.values()):
            raise ValueError(f"LogprobConfig sizes must be positive ints, got {sizes}")
        if self.token_block & (self.token_block - 1) or self.vocab_block & (self.vocab_block - 1):
            raise ValueError(f"token_block and vocab_block must be powers of two, got {sizes}")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AllowedTokens:
    """Which vocabulary entries each target position may take (the rest get probability 0).

    Fields:
      classes: (..., C) bool, the allowed token classes at each position (the targets' shape
        plus C); a position with every class allowed is unmasked.
      token_class: (G, V) int32, the class of each vocabulary entry, one row per grammar.
      grammar: (...) int32, the row of ``token_class`` each position uses.
    Token v is allowed at position n iff ``classes[n, token_class[grammar[n], v]]``.
    """

    classes: jax.Array
    token_class: jax.Array
    grammar: jax.Array


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Static sizes of one call (hashable: a non-differentiable argument of the custom VJP)."""

    impl: str
    temperature: float
    head_layout: str
    vocab: int  # V, real columns
    head_rows: int  # V padded up to one vocab chunk when V is smaller
    token_chunk: int
    vocab_chunk: int
    token_block: int
    vocab_block: int
    hidden_block: int

    @property
    def num_vocab_chunks(self) -> int:
        return -(-self.head_rows // self.vocab_chunk)


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


# ----------------------------------------------------------------------------- block math
# Shared by the twin and the Pallas kernel: plain jnp on values, so both run the same formulas.
def _scaled(dots: jax.Array, temperature: float) -> jax.Array:
    return dots if temperature == 1.0 else dots / temperature


def _block_stats(logits: jax.Array, cols: jax.Array, t_local: jax.Array):
    """(max, sum exp(z - max), target logit), each (n,), of an (n, c) logits block.

    cols: (1, c) column ids in the same frame as t_local (n,) (-1: target not in this block).
    Masked columns hold -inf; a block with every column masked gives (-inf, 0, 0).
    """
    m = jnp.max(logits, axis=-1)
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    s = jnp.sum(jnp.exp(logits - m_safe[:, None]), axis=-1)
    picked = jnp.sum(jnp.where(cols == t_local[:, None], logits, 0.0), axis=-1)
    return m, s, picked


def _merge_stats(a, b):
    """Online-logsumexp merge of two (max, sum, picked) triples over disjoint columns."""
    m = jnp.maximum(a[0], b[0])
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    s = a[1] * jnp.exp(a[0] - m_safe) + b[1] * jnp.exp(b[0] - m_safe)
    return m, s, a[2] + b[2]


def _block_dlogits(logits: jax.Array, cols: jax.Array, t_local: jax.Array, lse: jax.Array,
                   scale: jax.Array) -> jax.Array:
    """(n, c) d loss / d dots of a logits block: scale (n,) * (onehot(target) - softmax)."""
    probs = jnp.exp(logits - lse[:, None])
    onehot = (cols == t_local[:, None]).astype(jnp.float32)
    return scale[:, None] * (onehot - probs)


# ----------------------------------------------------------------------------- twin blocks
def _twin_logits(h, w, bias, plan: _Plan):
    dots = jnp.einsum("nd,cd->nc", h, w, preferred_element_type=jnp.float32)
    return _scaled(dots, plan.temperature) + (bias if bias.ndim == 2 else bias[None, :])


def _twin_stats(h, w, bias, t_local, plan: _Plan):
    cols = jnp.arange(w.shape[0], dtype=jnp.int32)[None, :]
    return _block_stats(_twin_logits(h, w, bias, plan), cols, t_local)


def _twin_dlogits(h, w, bias, t_local, lse, scale, plan: _Plan):
    cols = jnp.arange(w.shape[0], dtype=jnp.int32)[None, :]
    return _block_dlogits(_twin_logits(h, w, bias, plan), cols, t_local, lse, scale)


# ----------------------------------------------------------------------------- Pallas blocks
def _hidden_block(plan: _Plan, d: int) -> int:
    return plan.hidden_block if d % plan.hidden_block == 0 else d


def _kernel_logits(h_ref, w_ref, bias_ref, plan: _Plan):
    """(token_block, vocab_block) float32 logits of the refs' tile, D in hidden_block slices."""
    d = h_ref.shape[-1]
    hb = _hidden_block(plan, d)

    def body(k, acc):
        hk = h_ref[:, pl.ds(k * hb, hb)]
        wk = w_ref[:, pl.ds(k * hb, hb)]
        return acc + jax.lax.dot_general(hk, wk, (((1,), (1,)), ((), ())),
                                         preferred_element_type=jnp.float32)

    acc = jnp.zeros((h_ref.shape[0], w_ref.shape[0]), jnp.float32)
    acc = jax.lax.fori_loop(0, d // hb, body, acc)
    bias = bias_ref[...]
    return _scaled(acc, plan.temperature) + (bias if bias.ndim == 2 else bias[None, :])


def _kernel_cols(plan: _Plan):
    first = pl.program_id(1) * plan.vocab_block
    return first + jax.lax.broadcasted_iota(jnp.int32, (1, plan.vocab_block), 1)


def _stats_kernel(h_ref, w_ref, bias_ref, t_ref, m_ref, s_ref, p_ref, *, plan: _Plan):
    logits = _kernel_logits(h_ref, w_ref, bias_ref, plan)
    m, s, p = _block_stats(logits, _kernel_cols(plan), t_ref[...])
    m_ref[...], s_ref[...], p_ref[...] = m, s, p


def _dlogits_kernel(h_ref, w_ref, bias_ref, t_ref, lse_ref, scale_ref, out_ref, *, plan: _Plan):
    logits = _kernel_logits(h_ref, w_ref, bias_ref, plan)
    out_ref[...] = _block_dlogits(logits, _kernel_cols(plan), t_ref[...], lse_ref[...],
                                  scale_ref[...])


def _pallas_specs(plan: _Plan, d: int, bias_ndim: int):
    """Block specs of (hidden, head, bias) and of per-token vectors; a (n, c) bias (a per-token
    mask) is tiled like the logits."""
    tb, vb = plan.token_block, plan.vocab_block
    rows = pl.BlockSpec((tb,), lambda i, j: (i,))
    bias = (pl.BlockSpec((tb, vb), lambda i, j: (i, j)) if bias_ndim == 2
            else pl.BlockSpec((vb,), lambda i, j: (j,)))
    return [pl.BlockSpec((tb, d), lambda i, j: (i, 0)), pl.BlockSpec((vb, d), lambda i, j: (j, 0)), bias], rows


def _pallas_stats(h, w, bias, t_local, plan: _Plan):
    n, d = h.shape
    c = w.shape[0]
    grid = (n // plan.token_block, c // plan.vocab_block)
    specs, rows = _pallas_specs(plan, d, bias.ndim)
    partial_shape = jax.ShapeDtypeStruct((grid[1], n), jnp.float32)
    partial_spec = pl.BlockSpec((None, plan.token_block), lambda i, j: (j, i))
    m, s, p = pl.pallas_call(
        functools.partial(_stats_kernel, plan=plan),
        out_shape=(partial_shape,) * 3,
        grid=grid,
        in_specs=specs + [rows],
        out_specs=(partial_spec,) * 3,
        interpret=plan.impl == "interpret",
        name="token_logprob_stats",
    )(h, w, bias, t_local)
    # Merge the per-tile partials over the chunk's vocab tiles: (tiles, n) -> (n,).
    m_all = jnp.max(m, axis=0)
    m_safe = jnp.where(jnp.isfinite(m_all), m_all, 0.0)
    return m_all, jnp.sum(s * jnp.exp(m - m_safe), axis=0), jnp.sum(p, axis=0)


def _pallas_dlogits(h, w, bias, t_local, lse, scale, plan: _Plan):
    n, d = h.shape
    c = w.shape[0]
    specs, rows = _pallas_specs(plan, d, bias.ndim)
    return pl.pallas_call(
        functools.partial(_dlogits_kernel, plan=plan),
        out_shape=jax.ShapeDtypeStruct((n, c), jnp.float32),
        grid=(n // plan.token_block, c // plan.vocab_block),
        in_specs=specs + [rows, rows, rows],
        out_specs=pl.BlockSpec((plan.token_block, plan.vocab_block), lambda i, j: (i, j)),
        interpret=plan.impl == "interpret",
        name="token_logprob_dlogits",
    )(h, w, bias, t_local, lse, scale)


def _block_fns(plan: _Plan) -> tuple[Callable, Callable]:
    if plan.impl == "jax":
        return _twin_stats, _twin_dlogits
    return _pallas_stats, _pallas_dlogits


# ----------------------------------------------------------------------------- chunk loops
def _vocab_chunk(head: jax.Array, targets: jax.Array, j: jax.Array, plan: _Plan):
    """Chunk j of the head: (start, w (vocab_chunk, D), bias (vocab_chunk,), t_local (n,)).

    The last chunk is moved back to end at the head's last row instead of padding the head
    (no copy of W); its columns already covered by chunk j - 1 are masked by the bias.
    """
    c = plan.vocab_chunk
    lo = j * c
    start = jnp.minimum(lo, plan.head_rows - c)
    if plan.head_layout == "vd":
        w = jax.lax.dynamic_slice_in_dim(head, start, c, axis=0)
    else:
        w = jax.lax.dynamic_slice_in_dim(head, start, c, axis=1).T
    cols = start + jnp.arange(c, dtype=jnp.int32)
    bias = jnp.where((cols >= lo) & (cols < plan.vocab), 0.0, -jnp.inf).astype(jnp.float32)
    mine = (targets >= lo) & (targets < jnp.minimum(lo + c, plan.vocab))
    return start, w, bias, jnp.where(mine, targets - start, -1)


def _masked_bias(bias: jax.Array, start: jax.Array, allowed, plan: _Plan) -> jax.Array:
    """The chunk's bias (vocab_chunk,) without a mask, or (n, vocab_chunk) with -inf where a
    token's allowed classes (``allowed``: classes (n, C), token_class (G, head_rows), grammar
    (n,)) exclude the column."""
    if allowed is None:
        return bias
    classes, token_class, grammar = allowed
    cols = jax.lax.dynamic_slice_in_dim(token_class, start, plan.vocab_chunk, axis=1)  # (G, c)
    ok = jnp.take_along_axis(classes, cols[grammar], axis=1)  # (n, c)
    return jnp.where(ok, bias[None, :], -jnp.inf)


def _add_to_chunk(grad: jax.Array, start: jax.Array, update: jax.Array, plan: _Plan) -> jax.Array:
    """grad (head layout) += update (vocab_chunk, D) at rows [start, start + vocab_chunk)."""
    axis = 0 if plan.head_layout == "vd" else 1
    update = update if axis == 0 else update.T
    c = plan.vocab_chunk
    return jax.lax.dynamic_update_slice_in_dim(
        grad, jax.lax.dynamic_slice_in_dim(grad, start, c, axis) + update, start, axis)


def _token_chunks(x: jax.Array, plan: _Plan) -> jax.Array:
    return x.reshape(-1, plan.token_chunk, *x.shape[1:])


def _chunk_mask(allowed, token_class):
    """Per token chunk: (classes, token_class, grammar) for :func:`_masked_bias`, or None."""
    return None if allowed is None else (allowed[0], token_class, allowed[1])


def _forward(hidden, head, targets, plan: _Plan, allowed=None):
    """(logp, lse), each (N,), N a multiple of token_chunk. allowed: (classes (N, C),
    grammar (N,), token_class (G, head_rows)) or None."""
    stats_fn, _ = _block_fns(plan)
    hidden = hidden.astype(head.dtype)
    per_token = () if allowed is None else tuple(_token_chunks(x, plan) for x in allowed[:2])
    token_class = None if allowed is None else allowed[2]

    def token_chunk(args):
        h, t, *mask = args
        mask = _chunk_mask(mask or None, token_class)

        def vocab_step(carry, j):
            start, w, bias, t_local = _vocab_chunk(head, t, j, plan)
            bias = _masked_bias(bias, start, mask, plan)
            return _merge_stats(carry, stats_fn(h, w, bias, t_local, plan)), None

        init = (jnp.full(t.shape, -jnp.inf), jnp.zeros(t.shape), jnp.zeros(t.shape))
        (m, s, picked), _ = jax.lax.scan(vocab_step, init, jnp.arange(plan.num_vocab_chunks))
        lse = m + jnp.log(s)
        return picked - lse, lse

    logp, lse = jax.lax.map(token_chunk, (_token_chunks(hidden, plan), _token_chunks(targets, plan), *per_token))
    return logp.reshape(-1), lse.reshape(-1)


def _backward_loops(hidden, head, targets, lse, scale, need_head: bool, plan: _Plan, allowed=None):
    """(d hidden (N, D) float32, d head (head layout) float32 or None)."""
    _, dlogits_fn = _block_fns(plan)
    h_compute = hidden.astype(head.dtype)
    per_token = () if allowed is None else tuple(_token_chunks(x, plan) for x in allowed[:2])
    token_class = None if allowed is None else allowed[2]

    def token_chunk(grad_head, args):
        h, t, lse_c, scale_c, *mask = args
        mask = _chunk_mask(mask or None, token_class)

        def vocab_step(carry, j):
            grad_h, grad_head = carry
            start, w, bias, t_local = _vocab_chunk(head, t, j, plan)
            bias = _masked_bias(bias, start, mask, plan)
            dz = dlogits_fn(h, w, bias, t_local, lse_c, scale_c, plan)  # (n, vocab_chunk)
            grad_h = grad_h + jnp.einsum("nc,cd->nd", dz, w.astype(jnp.float32))
            if need_head:
                update = jnp.einsum("nc,nd->cd", dz, h.astype(jnp.float32))
                grad_head = _add_to_chunk(grad_head, start, update, plan)
            return (grad_h, grad_head), None

        grad_h = jnp.zeros(h.shape, jnp.float32)
        (grad_h, grad_head), _ = jax.lax.scan(vocab_step, (grad_h, grad_head),
                                              jnp.arange(plan.num_vocab_chunks))
        return grad_head, grad_h

    grad_head = jnp.zeros(head.shape if need_head else (0,), jnp.float32)
    chunks = tuple(_token_chunks(x, plan) for x in (h_compute, targets, lse, scale)) + per_token
    grad_head, grad_h = jax.lax.scan(token_chunk, grad_head, chunks)
    return grad_h.reshape(hidden.shape), grad_head if need_head else None


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _logprobs(hidden, head, targets, mask, allowed, plan: _Plan):
    logp, _ = _forward(hidden, head, targets, plan, allowed)
    return jnp.where(mask, logp, 0.0)


def _logprobs_fwd(hidden, head, targets, mask, allowed, plan: _Plan):
    h, w, t, m = hidden.value, head.value, targets.value, mask.value
    allowed = jax.tree.map(lambda x: x.value, allowed)
    logp, lse = _forward(h, w, t, plan, allowed)
    need_head = (None,) if head.perturbed else ()  # a static flag carried in the pytree structure
    return jnp.where(m, logp, 0.0), (h, w, t, m, allowed, lse, need_head)


def _logprobs_bwd(plan: _Plan, res, g):
    hidden, head, targets, mask, allowed, lse, need_head = res
    if isinstance(g, jax.custom_derivatives.SymbolicZero):
        return None, None, None, None, None
    scale = jnp.where(mask, g, 0.0).astype(jnp.float32) / plan.temperature
    grad_h, grad_head = _backward_loops(hidden, head, targets, lse, scale, bool(need_head), plan, allowed)
    grad_head = None if grad_head is None else grad_head.astype(head.dtype)
    return grad_h.astype(hidden.dtype), grad_head, None, None, None


_logprobs.defvjp(_logprobs_fwd, _logprobs_bwd, symbolic_zeros=True)


# ----------------------------------------------------------------------------- public API
@functools.partial(jax.jit, static_argnames=("temperature", "head_layout", "config", "impl"))
def token_logprobs(hidden: jax.Array, head: jax.Array, targets: jax.Array,
                   mask: jax.Array | None = None, *, temperature: float = 1.0,
                   head_layout: HeadLayout = "vd", config: LogprobConfig = LogprobConfig(),
                   impl: str | None = None, allowed: AllowedTokens | None = None) -> jax.Array:
    """log softmax(hidden @ W.T / temperature)[targets], never a (..., V) logits tensor.

    Args:
      hidden: (..., D) hidden states (e.g. (B, L, D)), any float dtype (cast to the head's).
      head: the output projection W, (V, D) for ``head_layout="vd"`` (a tied embedding) or
        (D, V) for ``"dv"`` (an untied ``lm_head`` stored input-major), not copied.
      targets: (...) int token ids in [0, V) (others give meaningless values: mask them).
      mask: (...) bool, True where the log-prob is wanted; elsewhere the output is 0 and
        the gradient is 0 (None: everywhere).
      temperature: static float > 0; the distribution of a sampler at that temperature.
      config: chunk and tile sizes (:class:`LogprobConfig`).
      impl: "jax" (twin), "pallas", "interpret" or None (see :mod:`kernels.dispatch`).
      allowed: normalise each position over its allowed tokens only (:class:`AllowedTokens`;
        None: the whole vocabulary).
    Returns:
      (...) float32 log-probs. Differentiable in hidden and head (custom VJP).
    """
    if head.ndim != 2:
        raise ValueError(f"head must be 2-D, got shape {head.shape}")
    if head_layout not in ("vd", "dv"):
        raise ValueError(f"head_layout must be 'vd' or 'dv', got {head_layout!r}")
    vocab, d = head.shape if head_layout == "vd" else head.shape[::-1]
    if hidden.shape[-1:] != (d,) or targets.shape != hidden.shape[:-1]:
        raise ValueError(f"hidden {hidden.shape} must be (..., {d}) and targets {targets.shape} "
                         f"its leading shape (head {head.shape}, layout {head_layout!r})")
    if mask is not None and mask.shape != targets.shape:
        raise ValueError(f"mask {mask.shape} must match targets {targets.shape}")
    if not jnp.issubdtype(targets.dtype, jnp.integer):
        raise ValueError(f"targets must be integer token ids, got {targets.dtype}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    lead = targets.shape
    n = targets.size
    mask = jnp.ones(lead, bool) if mask is None else mask.astype(bool)
    token_chunk = _round_up(min(config.token_chunk, max(n, 1)), config.token_block)
    vocab_chunk = _round_up(min(config.vocab_chunk, vocab), config.vocab_block)
    if vocab_chunk > vocab:  # a vocabulary smaller than one chunk: pad the (small) head
        pad = [(0, vocab_chunk - vocab), (0, 0)]
        head = jnp.pad(head, pad if head_layout == "vd" else pad[::-1])
    plan = _Plan(impl=resolve_impl(impl), temperature=float(temperature), head_layout=head_layout,
                 vocab=vocab, head_rows=max(vocab, vocab_chunk), token_chunk=token_chunk,
                 vocab_chunk=vocab_chunk, token_block=config.token_block,
                 vocab_block=config.vocab_block, hidden_block=config.hidden_block)
    rows = _round_up(max(n, 1), token_chunk) - n
    flat_h = jnp.pad(hidden.reshape(n, d), ((0, rows), (0, 0)))
    flat_t = jnp.pad(targets.reshape(n).astype(jnp.int32), (0, rows))
    flat_m = jnp.pad(mask.reshape(n), (0, rows))
    flat_a = None if allowed is None else _flat_allowed(allowed, lead, n, rows, plan.head_rows)
    return _logprobs(flat_h, head, flat_t, flat_m, flat_a, plan)[:n].reshape(lead)


def _flat_allowed(allowed: AllowedTokens, lead: tuple, n: int, rows: int, head_rows: int):
    """(classes (N, C), grammar (N,), token_class (G, head_rows)) of a mask for ``lead``-shaped
    targets, padded like the tokens (padding rows: everything allowed)."""
    classes = jnp.asarray(allowed.classes, bool)
    if classes.shape[:-1] != lead:
        raise ValueError(f"allowed.classes {classes.shape} must be the targets' shape {lead} plus classes")
    grammar = jnp.broadcast_to(jnp.asarray(allowed.grammar, jnp.int32), lead).reshape(n)
    token_class = jnp.asarray(allowed.token_class, jnp.int32)
    token_class = jnp.pad(token_class, ((0, 0), (0, head_rows - token_class.shape[1])))
    classes = jnp.pad(classes.reshape(n, -1), ((0, rows), (0, 0)), constant_values=True)
    return classes, jnp.pad(grammar, (0, rows)), token_class
