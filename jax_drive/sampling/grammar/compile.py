"""Compile a :class:`Grammar` into a token-level automaton over one tokenizer.

outlines-core builds the automaton: a regex DFA walked along every token's bytes (its
``Index``). We then

1. renumber the states breadth-first from the start state (state 0);
2. compute, per state, whether it accepts and ``min_to_accept``: the fewest tokens that
   reach an accepting state (0 for accepting ones), by a breadth-first search backwards
   from the accepting states;
3. refuse the grammar (:class:`GrammarError`) when some reachable state cannot reach
   acceptance (a dead end: the answer could get stuck), when it has more states than the
   cap, or when even its shortest answer exceeds a given token budget;
4. compress the ``[states, V]`` next-state table: tokens whose columns are equal in every
   state share a class, giving ``next_state[states, classes]`` and ``token_class[V]``. The
   stop ids form one more class: allowed exactly in accepting states, where they keep the
   state.

The regex gets a sentinel byte appended (``(?:R)\\x00``) with a token of its own: a state
accepts iff the sentinel token leaves it. Without it, outlines-core 0.2.14 drops every token
that continues past a complete match ("ab" then "a" in ``(ab)+``): its ``Index`` discards
transitions into the regex engine's delayed match states. With the sentinel no real token
reaches a match state, so no transition is lost.
"""

from __future__ import annotations

import collections
import dataclasses
import time

import numpy as np

from jax_drive.sampling.grammar.canonical import canonical_edges, reachable
from jax_drive.sampling.grammar.regex import GrammarError
from jax_drive.sampling.grammar.spec import Grammar
from jax_drive.sampling.grammar.vocab import TokenVocabulary, outlines_vocabulary, token_vocabulary

UNREACHABLE = 1 << 30  # min_to_accept of padding states (never reached)
DEFAULT_MAX_STATES = 4096
_HASH_MULTIPLIERS = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F)


@dataclasses.dataclass(frozen=True, eq=False)
class CompiledGrammar:
    """A grammar's token automaton over one vocabulary (host arrays; state 0 is the start).

    Fields:
      grammar: the :class:`Grammar`.
      next_state: (S, C) int32, the state after a token of class c in state s; -1: not allowed.
      token_class: (V,) int32, each token id's class.
      accepting: (S,) bool, the answer may end in this state.
      min_to_accept: (S,) int32, fewest tokens from this state to an accepting one (0 when accepting).
      class_size: (C,) int32, tokens per class.
      class_token: (C,) int32, the smallest token id of each class (the token, for a class of one).
      max_tokens: most tokens of an accepted answer, or None when unbounded.
      fingerprint: the :class:`TokenVocabulary`'s fingerprint.
      compile_seconds: wall time of the compilation.
    """

    grammar: Grammar
    next_state: np.ndarray
    token_class: np.ndarray
    accepting: np.ndarray
    min_to_accept: np.ndarray
    class_size: np.ndarray
    class_token: np.ndarray
    max_tokens: int | None
    fingerprint: str
    compile_seconds: float = 0.0

    @property
    def num_states(self) -> int:
        return int(self.next_state.shape[0])

    @property
    def num_classes(self) -> int:
        return int(self.next_state.shape[1])

    @property
    def min_tokens(self) -> int:
        """Fewest tokens of an accepted answer (the stop token not counted)."""
        return int(self.min_to_accept[0])

    @property
    def nbytes(self) -> int:
        """Bytes of the per-state tables (next_state, accepting, min_to_accept)."""
        return int(self.next_state.nbytes + self.accepting.nbytes + self.min_to_accept.nbytes)


def check_budget(compiled: CompiledGrammar, budget: int) -> None:
    """Raises GrammarError when no answer of ``compiled`` fits in ``budget`` tokens."""
    if compiled.min_tokens > int(budget):
        raise GrammarError(f"the {compiled.grammar.kind} grammar needs at least {compiled.min_tokens} tokens, "
                           f"more than the budget of {int(budget)}")


def anything_grammar(vocab_size: int, fingerprint: str = "") -> CompiledGrammar:
    """The unconstrained automaton: one accepting state in which every token keeps it."""
    one = np.ones((1,), np.int32)
    return CompiledGrammar(Grammar.anything(), np.zeros((1, 1), np.int32), np.zeros((vocab_size,), np.int32),
                           np.ones((1,), bool), np.zeros((1,), np.int32), one * vocab_size,
                           np.zeros((1,), np.int32), None, fingerprint)


def _outlines_index(pattern: str, outlines_vocab):
    from outlines_core import Index

    try:
        return Index(f"(?:{pattern})\\x00", outlines_vocab)
    except Exception as error:  # noqa: BLE001 - outlines-core raises ValueError / its own types
        if "incompatible" in str(error):  # a state no token of the vocabulary leaves
            raise GrammarError(f"dead end: some prefix of the grammar cannot be continued by any token of "
                               f"this vocabulary (pattern {pattern[:200]!r}; outlines-core: {error})") from None
        raise GrammarError(f"outlines-core cannot compile the grammar: {error}") from None


def _renumbered(transitions: dict, initial: int, vocab_size: int, max_states: int):
    """Breadth-first renumbering from the start state, along real tokens only (new targets of
    a state numbered in the order of their outlines-core ids, which are deterministic).

    Returns (edges: per state (token ids, next states), successors: per state its distinct
    next states, accepting (S,) bool).
    """
    if len(transitions) > max_states + 1:  # + 1: the state after the sentinel
        raise GrammarError(f"the grammar has {len(transitions) - 1} states, more than the cap of {max_states}; "
                           "bound its repetitions less tightly or raise max_states")
    sentinel = vocab_size + 1
    order, number, raw, accepting = [initial], {initial: 0}, [], []
    for state in order:  # grows while iterating
        row = transitions.get(state, {})
        ids = np.fromiter(row.keys(), np.int64, len(row))
        nxt = np.fromiter(row.values(), np.int64, len(row))
        accepting.append(sentinel in row)
        keep = ids < vocab_size
        ids, nxt = ids[keep], nxt[keep]
        targets = np.unique(nxt)
        raw.append((ids, nxt, targets))
        for target in targets.tolist():
            if target not in number:
                number[target] = len(order)
                order.append(target)
    renumber = np.full((max(order) + 1,), -1, np.int32)  # outlines ids are small integers
    renumber[np.asarray(order)] = np.arange(len(order), dtype=np.int32)
    edges = [(ids, renumber[nxt]) for ids, nxt, _ in raw]
    successors = [renumber[targets].tolist() for _, _, targets in raw]
    return edges, successors, np.asarray(accepting, bool)


def _min_to_accept(successors: list[list[int]], accepting: np.ndarray) -> np.ndarray:
    """(S,) fewest tokens to acceptance (UNREACHABLE where impossible): BFS on reversed edges."""
    preds: list[list[int]] = [[] for _ in accepting]
    for src, targets in enumerate(successors):
        for dst in targets:
            preds[dst].append(src)
    dist = np.full(accepting.shape, UNREACHABLE, np.int64)
    frontier = collections.deque(np.flatnonzero(accepting).tolist())
    dist[accepting] = 0
    while frontier:
        node = frontier.popleft()
        for src in preds[node]:
            if dist[src] == UNREACHABLE:
                dist[src] = dist[node] + 1
                frontier.append(src)
    return dist.astype(np.int32)


def _shortest_prefix(edges, target: int, vocabulary: TokenVocabulary) -> str:
    """The text of a shortest token path from the start to ``target`` (for error messages)."""
    parent = {0: None}
    queue = collections.deque([0])
    while queue and target not in parent:
        node = queue.popleft()
        for token, dst in zip(*edges[node]):
            if int(dst) not in parent:
                parent[int(dst)] = (node, int(token))
                queue.append(int(dst))
    pieces, node = [], target
    while parent.get(node):
        node, token = parent[node]
        pieces.append(vocabulary.token_bytes[token])
    return b"".join(reversed(pieces)).decode("utf-8", errors="replace")


def _longest_answer(succ: list[list[int]], accepting: np.ndarray) -> int | None:
    """Most tokens on a path from the start to an accepting state; None when the graph has a cycle."""
    indegree = np.zeros(len(succ), np.int64)
    for targets in succ:
        indegree[targets] += 1
    longest = np.full(len(succ), -1, np.int64)
    longest[0] = 0
    ready, seen = [i for i in range(len(succ)) if indegree[i] == 0], 0
    while ready:
        node = ready.pop()
        seen += 1
        for dst in succ[node]:
            if longest[node] >= 0:
                longest[dst] = max(longest[dst], longest[node] + 1)
            indegree[dst] -= 1
            if indegree[dst] == 0:
                ready.append(dst)
    return None if seen < len(succ) else int(longest[accepting].max())


def _token_classes(edges, accepting: np.ndarray, stop_ids: tuple[int, ...], vocab_size: int, multiplier: int):
    """(token_class (V,), next_state (S, C), class_size (C,), class_token (C,)), or None on a
    hash collision. A token's hash mixes (state, next state) over the states that allow it."""
    num_states = len(edges)
    hashes = np.zeros((vocab_size,), np.uint64)
    mult = np.uint64(multiplier)
    with np.errstate(over="ignore"):
        for state, (ids, nxt) in enumerate(edges):
            code = (np.uint64(state + 1) * np.uint64(num_states + 2) + nxt.astype(np.uint64) + np.uint64(1))
            hashes[ids] = hashes[ids] * mult + code
    stops = np.asarray(stop_ids, np.int64)
    hashes[stops] = np.uint64(1)  # one class of their own (a real column hashing to 1 is caught below)
    _, first, token_class = np.unique(hashes, return_index=True, return_inverse=True)
    order = np.argsort(first)  # classes numbered by their smallest token id
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    token_class = rank[token_class.reshape(-1)].astype(np.int32)
    class_token = first[order].astype(np.int32)
    class_size = np.bincount(token_class, minlength=order.size).astype(np.int32)
    next_state = np.full((num_states, order.size), -1, np.int32)
    for state, (ids, nxt) in enumerate(edges):
        next_state[state, token_class[ids]] = nxt
    if stops.size:
        stop_class = token_class[stops[0]]
        next_state[accepting, stop_class] = np.flatnonzero(accepting)
        if class_size[stop_class] != np.unique(stops).size:
            return None
    for state, (ids, nxt) in enumerate(edges):  # exact check: every column reproduced
        allowed = class_size[next_state[state] >= 0].sum() - (np.unique(stops).size if accepting[state] else 0)
        if allowed != ids.size or not np.array_equal(next_state[state, token_class[ids]], nxt):
            return None
    return token_class, next_state, class_size, class_token


def compile_grammar(grammar: Grammar, vocabulary: TokenVocabulary, *, max_states: int = DEFAULT_MAX_STATES,
                    budget: int | None = None, outlines_vocab=None, encode=None) -> CompiledGrammar:
    """Compiles ``grammar`` over ``vocabulary`` (see the module docstring).

    Args:
      grammar: the :class:`Grammar`.
      vocabulary: the tokenizer's :class:`TokenVocabulary` (``token_vocabulary(tokenizer)``).
      max_states: refuse grammars with more states.
      budget: when given, refuse grammars whose shortest answer needs more tokens.
      outlines_vocab: ``outlines_vocabulary(vocabulary)``, when the caller keeps one.
      encode: text -> token ids of the vocabulary's tokenizer (no special tokens); needed by a
        grammar with ``canonical_literals`` (:mod:`.canonical`).
    Raises GrammarError (dead end, state cap, budget, or what outlines-core refuses).
    """
    start = time.perf_counter()
    if grammar.kind == "anything":
        return anything_grammar(vocabulary.vocab_size, vocabulary.fingerprint)
    outlines_vocab = outlines_vocabulary(vocabulary) if outlines_vocab is None else outlines_vocab
    index = _outlines_index(grammar.pattern, outlines_vocab)
    edges, successors, accepting = _renumbered(index.get_transitions(), index.get_initial_state(),
                                               vocabulary.vocab_size, max_states)
    if grammar.canonical_literals:
        if encode is None:
            raise GrammarError("a grammar with canonical_literals needs the tokenizer's encoder (encode=...)")
        edges, accepting = reachable(canonical_edges(edges, accepting, vocabulary.token_bytes, encode), accepting)
        successors = [np.unique(nxt).tolist() for _, nxt in edges]
    min_to_accept = _min_to_accept(successors, accepting)
    stuck = np.flatnonzero(min_to_accept == UNREACHABLE)
    if stuck.size:
        where = "from the start" if stuck[0] == 0 else f"after {_shortest_prefix(edges, int(stuck[0]), vocabulary)!r}"
        raise GrammarError(f"dead end: no token sequence over this vocabulary completes the grammar {where} "
                           f"(pattern {grammar.pattern[:200]!r})")
    for multiplier in _HASH_MULTIPLIERS:
        classes = _token_classes(edges, accepting, vocabulary.stop_ids, vocabulary.vocab_size, multiplier)
        if classes is not None:
            break
    else:
        raise RuntimeError("token-class hashing collided twice; please report this grammar")
    token_class, next_state, class_size, class_token = classes
    compiled = CompiledGrammar(grammar, next_state, token_class, accepting, min_to_accept, class_size, class_token,
                               _longest_answer(successors, accepting), vocabulary.fingerprint,
                               time.perf_counter() - start)
    if budget is not None:
        check_budget(compiled, budget)
    return compiled


class GrammarCompiler:
    """Compiles grammars over one tokenizer and keeps the results (least recently used out).

    Args:
      tokenizer: a byte-level BPE ``jax_drive.models.Tokenizer``.
      vocab_size: the model's logit width V (default: the tokenizer's size).
      stop_ids: ids that end an answer (default: the tokenizer's EOS ids).
      max_states: the state cap (:func:`compile_grammar`).
      cache_size: compiled grammars kept.
    """

    def __init__(self, tokenizer, vocab_size: int | None = None, stop_ids=None, *,
                 max_states: int = DEFAULT_MAX_STATES, cache_size: int = 64):
        self.vocabulary = token_vocabulary(tokenizer, vocab_size, stop_ids)
        self._encode = getattr(tokenizer, "encode", None)
        self.max_states = int(max_states)
        self.cache_size = int(cache_size)
        self._outlines_vocab = None
        self._cache: collections.OrderedDict[tuple, CompiledGrammar] = collections.OrderedDict()

    @property
    def vocab_size(self) -> int:
        return self.vocabulary.vocab_size

    @property
    def outlines_vocabulary(self):
        """outlines-core's ``Vocabulary`` of the tokenizer (built on first use, then kept)."""
        if self._outlines_vocab is None:
            self._outlines_vocab = outlines_vocabulary(self.vocabulary)
        return self._outlines_vocab

    def compile(self, grammar: Grammar, budget: int | None = None) -> CompiledGrammar:
        """The compiled ``grammar`` (cached by its language and the tokenizer); refuses it when
        its shortest answer exceeds ``budget`` tokens."""
        key = (grammar.key, self.vocabulary.fingerprint, self.max_states)
        compiled = self._cache.get(key)
        if compiled is None:
            outlines_vocab = self.outlines_vocabulary if grammar.kind != "anything" else None
            compiled = compile_grammar(grammar, self.vocabulary, max_states=self.max_states,
                                       outlines_vocab=outlines_vocab, encode=self._encode)
            self._cache[key] = compiled
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        if budget is not None:
            check_budget(compiled, budget)
        return compiled
