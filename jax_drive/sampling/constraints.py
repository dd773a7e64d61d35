"""The decode loop's hook for constrained generation: a per-row logits mask with its own state.

A :class:`LogitsMask` is a pytree: its arrays (e.g. a grammar's transition tables from
``grammar.stack_grammars`` and each row's grammar id) are traced inputs of the decode program,
so a new mask of the same shapes does not recompile; its class and static fields are part of
the compiled program. The loop carries the mask's per-row state in ``DecodeState.constraint``
(created by ``init_state`` before the first step, so each decode call, and each
``Session.extend`` turn, starts its own) and calls:

- ``mask_logits`` on the model's logits before anything else reads them: the raw log-probs,
  the min-token / never-sample masks, temperature, top-k and top-p all see the masked
  logits, so the reported log-probs are those of the masked policy. It gets each position's
  remaining budget (a grammar refuses tokens after which it could not finish in time);
- ``advance`` with the tokens each row emitted in the step;
- ``propose`` in the speculative step, on the prompt-lookup drafts: a mask that forces a run
  of tokens (``grammar.forced_run``) proposes it as drafts (masked to one allowed token, a
  draft has probability 1 and the verification accepts it: jump-forward), and cuts lookup
  drafts that the mask would refuse. A mask's ``max_forced`` (static; 0 for none) is the
  longest run it proposes: with it > 0 the loop runs speculative steps even without prompt
  lookup (``Request.draft_len``).

A row whose masked logits leave no token (a grammar complete without stop ids, or stop ids
held back by ``min_new_tokens`` in a state where only they are allowed) ends there: it emits
nothing more and counts as stopped.

Rows: B, the loop's rows (dummy rows included); a mask's per-row arrays have B rows.
:class:`NoMask`, the default, has no leaves and returns its inputs, so it compiles to nothing.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax


@runtime_checkable
class LogitsMask(Protocol):
    """Per-row constraint on the tokens the decode loop may emit (B rows, V vocabulary)."""

    max_forced: int  # longest run of forced tokens ``propose`` offers (static; 0: none)

    def init_state(self, rows: int) -> Any:
        """The state before the first generated token: a pytree whose leaves lead with
        ``rows``, or None for a stateless mask."""

    def mask_logits(self, state: Any, logits: jax.Array, drafts: jax.Array, remaining: jax.Array) -> jax.Array:
        """Logits (B, L, V) float32 at L consecutive positions, position i following
        ``drafts[:, :i]`` ((B, L - 1) int32) after ``state``, with ``remaining[:, i]`` ((B, L)
        int32) tokens left in the row's budget, position i's included; returns them with the
        tokens the mask refuses set to ``selection.NEG_INF``."""

    def advance(self, state: Any, tokens: jax.Array, count: jax.Array) -> Any:
        """The state after row b emitted ``tokens[b, :count[b]]`` (tokens (B, L) int32,
        count (B,) int32; 0 for a row that is done)."""

    def propose(self, state: Any, drafts: jax.Array, num_valid: jax.Array,
                remaining: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The drafts the speculative step verifies: drafts (B, K) int32 with num_valid (B,)
        usable per row, from prompt lookup; remaining (B,) int32: the budget left at the
        first drafted position; returns the pair to verify."""


@jax.tree_util.register_pytree_node_class
class NoMask:
    """The identity :class:`LogitsMask`: no state, no leaves, no work in the compiled loop."""

    max_forced = 0

    def init_state(self, rows: int) -> None:
        return None

    def mask_logits(self, state, logits, drafts, remaining):
        return logits

    def advance(self, state, tokens, count):
        return state

    def propose(self, state, drafts, num_valid, remaining):
        return drafts, num_valid

    def tree_flatten(self):
        return (), None

    @classmethod
    def tree_unflatten(cls, aux, children) -> "NoMask":
        return cls()

    def __eq__(self, other) -> bool:
        return type(other) is NoMask

    def __hash__(self) -> int:
        return hash(NoMask)

    def __repr__(self) -> str:
        return "NoMask()"


NO_MASK = NoMask()
