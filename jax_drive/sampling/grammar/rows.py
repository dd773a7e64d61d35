"""An engine's grammars: compiled once per (grammar, stop ids), stacked per call, one id per row.

:class:`RowGrammars` belongs to a ``JaxEngine`` (its tokenizer and logit width): it compiles
each :class:`Grammar` once per set of stop ids (the stop ids are part of the automaton: they
are allowed exactly in accepting states, so they must be the request's resolved
``stop_token_ids``), keeps the results, and turns a call's per-row grammars into a
:class:`GrammarMask` (one stacked table set, the "anything" grammar for unconstrained and
dummy rows). Compiling is guarded by a lock: outlines-core's compiler state is not shared
between threads (``jax-drive serve`` compiles while its batcher generates).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence

import numpy as np

from jax_drive.sampling.grammar.compile import DEFAULT_MAX_STATES, CompiledGrammar, GrammarCompiler, check_budget
from jax_drive.sampling.grammar.mask import GrammarMask
from jax_drive.sampling.grammar.spec import Grammar
from jax_drive.sampling.grammar.tables import GrammarTables, stack_grammars

_ANYTHING = Grammar.anything()


class RowGrammars:
    """Compiled grammars of one tokenizer and the per-call masks (thread-safe).

    Args:
      tokenizer: the engine's byte-level BPE ``Tokenizer``.
      vocab_size: the model's logit width V.
      max_states: the compiler's state cap.
      cache_size: compiled grammars kept per set of stop ids; stacked table sets kept.
    """

    def __init__(self, tokenizer, vocab_size: int, *, max_states: int = DEFAULT_MAX_STATES, cache_size: int = 64):
        if tokenizer is None:
            raise ValueError("grammars need the engine's tokenizer (JaxEngine(model, tokenizer))")
        self.tokenizer = tokenizer
        self.vocab_size = int(vocab_size)
        self.max_states = int(max_states)
        self.cache_size = int(cache_size)
        self._compilers: dict[tuple[int, ...], GrammarCompiler] = {}
        self._stacks: collections.OrderedDict[tuple, GrammarTables] = collections.OrderedDict()
        self._lock = threading.Lock()

    def compile(self, grammar: Grammar, stop_ids: Sequence[int], budget: int | None = None) -> CompiledGrammar:
        """``grammar`` compiled for these stop ids (cached). Raises GrammarError, also when its
        shortest answer needs more than ``budget`` tokens."""
        stops = tuple(int(i) for i in stop_ids)
        with self._lock:
            compiler = self._compilers.get(stops)
            if compiler is None:
                compiler = GrammarCompiler(self.tokenizer, self.vocab_size, stops, max_states=self.max_states,
                                           cache_size=self.cache_size)
                self._compilers[stops] = compiler
            compiled = compiler.compile(grammar)
        if budget is not None:
            check_budget(compiled, budget)
        return compiled

    def tables(self, grammars: Sequence[Grammar | None], stop_ids: Sequence[int],
               budget: int | None = None) -> tuple[GrammarTables, np.ndarray, int]:
        """(stacked tables, (len(grammars),) int32 index of each entry's grammar in them, the
        index of the anything grammar, which None entries get)."""
        distinct = list(dict.fromkeys(g for g in grammars if g is not None and g.kind != "anything"))
        compiled = [self.compile(g, stop_ids, budget) for g in distinct] + [self.compile(_ANYTHING, stop_ids)]
        key = (tuple(int(i) for i in stop_ids),) + tuple(g.key for g in distinct)
        with self._lock:
            stacked = self._stacks.get(key)
            if stacked is None:
                stacked = stack_grammars(compiled, min_grammars=2)
                self._stacks[key] = stacked
                while len(self._stacks) > self.cache_size:
                    self._stacks.popitem(last=False)
            else:
                self._stacks.move_to_end(key)
        index = {g: i for i, g in enumerate(distinct)}
        anything = len(distinct)
        ids = np.asarray([anything if g is None or g.kind == "anything" else index[g] for g in grammars], np.int32)
        return stacked, ids, anything

    def mask(self, grammars: Sequence[Grammar | None], stop_ids: Sequence[int], budget: int, batch: int,
             max_forced: int = 0) -> GrammarMask | None:
        """The decode loop's mask for rows with ``grammars`` (padded to ``batch`` loop rows with
        unconstrained dummies), or None when no row is constrained."""
        if all(g is None or g.kind == "anything" for g in grammars):
            return None
        if batch < len(grammars):
            raise ValueError(f"{len(grammars)} rows do not fit a loop of {batch} rows")
        tables, ids, anything = self.tables(grammars, stop_ids, budget)
        padded = np.full((batch,), anything, np.int32)
        padded[:len(ids)] = ids
        return GrammarMask(tables, padded, max_forced)


def engine_grammar(engine, grammar: Grammar, stop_ids: Sequence[int] | None = None) -> CompiledGrammar | None:
    """``grammar`` compiled over ``engine``'s tokenizer (its ``grammars`` cache when it has one,
    e.g. ``JaxEngine``; else a compiler over ``engine.tokenizer``), or None for an engine
    without a local tokenizer. Answer budgets are set from its ``min_tokens`` / ``max_tokens``.
    stop_ids: default the tokenizer's EOS ids (``SamplingParams``' default)."""
    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is None:
        return None
    stops = tuple(int(i) for i in (tokenizer.eos_token_ids if stop_ids is None else stop_ids))
    grammars = getattr(engine, "grammars", None)
    if not isinstance(grammars, RowGrammars):
        model = getattr(engine, "model", None)
        vocab = model.config.vocab_size if hasattr(model, "config") else tokenizer.backend.get_vocab_size()
        grammars = RowGrammars(tokenizer, vocab)
    return grammars.compile(grammar, stops)
