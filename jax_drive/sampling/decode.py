"""The decode steps and the jitted ``lax.while_loop`` around them.

Step ``t`` feeds one token per row (the last prompt token at ``t = 0``, then the previous
sample) at the row's cache slot, samples the next token and records its log-prob
(``outputs``). The loop stops at ``max_new_tokens`` (dynamic, <= the bucket N), when every
row is done (a stop token, its budget, a dummy row, or a row the caller dropped), or at the
traced step bound ``until``: a call may run the loop in chunks, returning to the host in
between with the state, and the chunks give exactly the one-call results (same program,
same states). Rows that are done keep running but their outputs are replaced by ``pad_id``
/ 0.

Two step functions, both the model's own forward: the default runs it on the unrolled
weight layout (``jax_drive.models.unroll_params``) with a per-layer ``LayerCache``, which
avoids XLA:CPU copying every layer's weights out of the stacked arrays on each step; the
generic one calls the model's ``__call__`` (any ``DecoderLM``). With a ``PromptLookup`` each
step instead verifies K drafted tokens per row in one forward pass (``speculative``); rows
then advance by different numbers of tokens, each at its own cache slot.

Randomness: the loop's key (one for the call, or one per row, ``request.row_keys``) is split
at every step; a row with its own key draws only from it, so its sample does not depend on
the other rows of the call. Constrained generation hooks in through the settings' logits
mask (``constraints``), whose per-row state is ``DecodeState.constraint``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jax_drive.models.protocol import DecoderLM
from jax_drive.models.transformer import forward_hidden, lm_logits
from jax_drive.parallel import make_mesh, replicate
from jax_drive.sampling.constraints import NoMask
from jax_drive.sampling.outputs import reported_logprobs
from jax_drive.sampling.request import DecodeMode, DecodeSettings, Request, split_keys
from jax_drive.sampling.selection import NEG_INF, select_tokens
from jax_drive.sampling.shapes import SamplerConfig
from jax_drive.sampling.speculative import accept_drafts, lookup_drafts
from jax_drive.sampling.state import DecodeState


def _id_table(ids: jax.Array, vocab: int) -> jax.Array:
    """(V,) bool: True at the (-1 padded) ``ids``."""
    return jnp.zeros((vocab,), bool).at[jnp.where(ids >= 0, ids, vocab)].set(True, mode="drop")


def _empty_rows(constraint, masked: jax.Array) -> jax.Array | None:
    """(...) bool: positions whose masked logits (..., V) leave no token (None without a mask:
    only a logits mask can empty a row, and the plain program then has no such check)."""
    if isinstance(constraint, NoMask):
        return None
    return jnp.max(masked, axis=-1) <= NEG_INF / 2


def _plain_step(step_fn, vocab, settings: DecodeSettings, mode: DecodeMode):
    """Loop body generating one token per row."""
    is_stop_vocab = _id_table(settings.stop_ids, vocab)
    is_never_vocab = _id_table(settings.never_ids, vocab)
    constraint = settings.logits_mask

    def body(s: DecodeState) -> DecodeState:
        logits, cache = step_fn(s.cache, s.token[:, None], s.position[:, None], s.index)
        no_drafts = jnp.zeros((s.token.shape[0], 0), jnp.int32)
        remaining = (settings.max_new_tokens - s.lengths)[:, None]  # (B, 1), this token included
        logits = constraint.mask_logits(s.constraint, logits.astype(jnp.float32), no_drafts, remaining)[:, 0]
        key, sub = split_keys(s.key)
        masked = jnp.where(((s.step < settings.min_new_tokens) & is_stop_vocab[None, :]) | is_never_vocab[None, :],
                           NEG_INF, logits)
        token, processed = select_tokens(masked, sub, settings.temperature, settings.top_k,
                                         settings.top_p, greedy=mode.greedy, use_filter=mode.use_filter)
        logprob = reported_logprobs(mode, logits, token, processed)
        empty = _empty_rows(constraint, masked)
        ended = jnp.zeros_like(s.done) if empty is None else ~s.done & empty  # ends without a token
        emits = ~s.done & ~ended
        token = jnp.where(emits, token, settings.pad_id)
        logprob = jnp.where(emits, logprob, 0.0)
        hit_stop = emits & jnp.any(token[:, None] == settings.stop_ids[None, :], axis=-1)
        return s.replace(
            cache=cache,
            token=jnp.where(ended, s.token, token),
            position=s.position + 1,
            index=s.index + 1,
            step=s.step + 1,
            done=s.done | hit_stop | ended,
            tokens=jax.lax.dynamic_update_slice(s.tokens, token[:, None], (0, s.step)),
            logprobs=jax.lax.dynamic_update_slice(s.logprobs, logprob[:, None], (0, s.step)),
            lengths=s.lengths + emits.astype(jnp.int32),
            stopped=s.stopped | hit_stop | ended,
            key=key,
            constraint=constraint.advance(s.constraint, token[:, None], emits.astype(jnp.int32)),
        )

    return body


def _write_rows(buffer: jax.Array, values: jax.Array, start: jax.Array) -> jax.Array:
    """buffer (B, W) with values (B, L) written at columns [start[b], start[b] + L)."""
    return jax.vmap(lambda buf, val, i: jax.lax.dynamic_update_slice(buf, val, (i,)))(buffer, values, start)


def draft_widths(k: int) -> tuple[int, ...]:
    """The forward widths a speculative step with K drafts chooses from: 1, 2, 4, ... and K + 1."""
    widths = [1]
    while widths[-1] * 2 < k + 1:
        widths.append(widths[-1] * 2)
    return tuple(widths) + ((k + 1,) if widths[-1] < k + 1 else ())


def _adaptive_forward(step_fn, k: int):
    """step_fn on the first w of K + 1 positions, w the smallest of :func:`draft_widths` that
    holds ``need`` (every row's drafts in use plus one): a step whose rows draft little (or
    nothing) pays for a narrow pass. Logits (B, K + 1, V) float32, zero past w (never read:
    rows accept at most need - 1 drafts)."""
    widths = draft_widths(k)

    def forward(cache, feed, positions, index, need):
        def branch(w):
            def run(cache):
                logits, cache = step_fn(cache, feed[:, :w], positions[:, :w], index)
                return jnp.pad(logits.astype(jnp.float32), ((0, 0), (0, k + 1 - w), (0, 0))), cache
            return run

        if len(widths) == 1:
            return branch(widths[0])(cache)
        which = jnp.searchsorted(jnp.asarray(widths, jnp.int32), need).astype(jnp.int32)
        return jax.lax.switch(which, [branch(w) for w in widths], cache)

    return forward


def _speculative_step(step_fn, vocab, settings: DecodeSettings, mode: DecodeMode):
    """Loop body verifying K drafts per row (prompt lookup's, or forced runs of the logits mask:
    jump-forward): each row emits 1 to K + 1 tokens."""
    is_stop_vocab = _id_table(settings.stop_ids, vocab)
    is_never_vocab = _id_table(settings.never_ids, vocab)
    constraint = settings.logits_mask
    lookup = mode.lookup
    k = mode.draft_len
    forward = _adaptive_forward(step_fn, k)

    def body(s: DecodeState) -> DecodeState:
        remaining = settings.max_new_tokens - s.lengths  # (B,) at the first new position, it included
        if lookup is not None:
            drafts, num_valid = lookup_drafts(s.history, s.history_len, lookup)
            drafts = jnp.pad(drafts, ((0, 0), (0, k - drafts.shape[1])))
        else:
            drafts, num_valid = jnp.zeros((s.token.shape[0], k), jnp.int32), jnp.zeros_like(s.lengths)
        drafts, num_valid = constraint.propose(s.constraint, drafts, num_valid, remaining)
        feed = jnp.concatenate([s.token[:, None], drafts], axis=1)  # (B, K + 1)
        offsets = jnp.arange(k + 1)
        need = jnp.max(jnp.where(s.done, 1, num_valid + 1))
        logits, cache = forward(s.cache, feed, s.position[:, None] + offsets, s.index, need)
        logits = constraint.mask_logits(s.constraint, logits, drafts, remaining[:, None] - offsets)  # (B, K + 1, V)
        key, sub = split_keys(s.key)
        generated = s.lengths[:, None] + offsets  # index of the token each position predicts
        masked = jnp.where(((generated < settings.min_new_tokens)[..., None] & is_stop_vocab) | is_never_vocab,
                           NEG_INF, logits)
        accept = functools.partial(accept_drafts, temperature=settings.temperature, top_k=settings.top_k,
                                   top_p=settings.top_p, greedy=mode.greedy, use_filter=mode.use_filter)
        if sub.ndim == 0:
            tokens, accepted, processed = accept(masked, drafts, num_valid, sub)
        else:  # one key per row: verify each row on its own
            tokens, accepted, processed = jax.vmap(
                lambda lg, d, n, kk: jax.tree.map(lambda x: x[0], accept(lg[None], d[None], n[None], kk))
            )(masked, drafts, num_valid, sub)
        logprobs = reported_logprobs(mode, logits, tokens, processed)
        # emitted: tokens[:, :count], cut after the first stop token and at max_new_tokens; a
        # row whose mask leaves nothing after its accepted drafts emits only them, and ends
        is_stop = jnp.any(tokens[..., None] == settings.stop_ids, axis=-1) & (offsets <= accepted[:, None])
        first_stop = jnp.where(jnp.any(is_stop, axis=1), jnp.argmax(is_stop, axis=1), k + 1)
        empty = _empty_rows(constraint, masked)
        empty_last = (jnp.zeros_like(s.done) if empty is None
                      else jnp.take_along_axis(empty, accepted[:, None], axis=1)[:, 0] & (first_stop > accepted))
        count = jnp.minimum(jnp.minimum(accepted, first_stop) + 1 - empty_last, remaining)
        count = jnp.where(s.done, 0, count)
        hit_stop = first_stop < count
        ended = ~s.done & empty_last & (count == accepted)
        lengths = s.lengths + count
        last = jnp.take_along_axis(tokens, jnp.maximum(count - 1, 0)[:, None], axis=1)[:, 0]
        return s.replace(
            cache=cache,
            token=jnp.where(count > 0, last, s.token),
            position=s.position + count,
            index=s.index + count,
            step=s.step + 1,
            done=s.done | hit_stop | ended | (lengths >= settings.max_new_tokens),
            tokens=_write_rows(s.tokens, tokens, s.lengths),
            logprobs=_write_rows(s.logprobs, logprobs, s.lengths),
            lengths=lengths,
            stopped=s.stopped | hit_stop | ended,
            key=key,
            history=_write_rows(s.history, tokens, s.history_len),
            history_len=s.history_len + count,
            constraint=constraint.advance(s.constraint, tokens, count),
        )

    return body


def _decode_loop(step_fn, vocab: int, loop: DecodeState, settings: DecodeSettings,
                 mode: DecodeMode) -> DecodeState:
    """The ``lax.while_loop`` shared by both decode paths.

    step_fn(cache, tokens (B, L), positions (B, L), index) -> (logits (B, L, V), cache).
    """
    if not mode.draft_len:
        body = _plain_step(step_fn, vocab, settings, mode)

        def cond(s: DecodeState):
            return (s.step < settings.max_new_tokens) & (s.step < settings.until) & ~jnp.all(s.done)
    else:  # every step emits >= 1 token per live row, and a row is done at its budget
        body = _speculative_step(step_fn, vocab, settings, mode)

        def cond(s: DecodeState):
            return (s.step < settings.until) & ~jnp.all(s.done)

    return jax.lax.while_loop(cond, body, loop)


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("mode",), donate_argnums=(2,))
def sampler_decode_generic(graphdef, state, loop: DecodeState, settings: DecodeSettings, *,
                           mode: DecodeMode) -> DecodeState:
    """Decode loop calling the model's ``__call__`` (stacked KVCache)."""
    model = nnx.merge(graphdef, state)

    def step_fn(cache, tokens, positions, index):
        return model(tokens, positions, jnp.ones(tokens.shape, bool), cache=cache, cache_index=index)

    return _decode_loop(step_fn, model.config.vocab_size, loop, settings, mode)


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("mode",), donate_argnums=(2,))
def sampler_decode_unrolled(config, weights: dict, loop: DecodeState, settings: DecodeSettings, *,
                            mode: DecodeMode) -> DecodeState:
    """Decode loop over the unrolled weights (``unroll_params``) and a ``LayerCache``."""

    def step_fn(cache, tokens, positions, index):
        hidden, cache = forward_hidden(weights, config, tokens, positions,
                                       jnp.ones(tokens.shape, bool), cache, index)
        return lm_logits(weights, hidden), cache

    return _decode_loop(step_fn, config.vocab_size, loop, settings, mode)


def decode(model: DecoderLM, weights: dict | None, loop: DecodeState, request: Request,
           config: SamplerConfig, graph_and_state=None, *, until: int | None = None) -> DecodeState:
    """Runs the decode loop from ``loop`` (donated, but for its key, which may be the
    caller's) on the unrolled ``weights`` (or through ``model.__call__`` when None).

    until: stop before loop iteration ``until`` (counted from the call's first step, so a
    chunk of k steps from a state at step t is ``until=t + k``); None runs to the end. The
    compiled program is the same either way.
    """
    settings = request.settings(config, model.config.placeholder_token_ids, until)
    mode = request.mode()
    loop = loop.replace(key=jnp.array(loop.key, copy=True))
    if loop.constraint is None:  # a new call (or turn): the mask's state before the first token
        loop = loop.replace(constraint=request.logits_mask.init_state(loop.token.shape[0]))
    mesh = make_mesh(config.mesh)
    if weights is not None:
        return sampler_decode_unrolled(model.config, replicate(weights, mesh), loop, settings, mode=mode)
    graphdef, state = graph_and_state if graph_and_state is not None else nnx.split(model)
    return sampler_decode_generic(graphdef, replicate(state, mesh), loop, settings, mode=mode)
