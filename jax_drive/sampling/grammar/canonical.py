"""Canonical spellings of a grammar's fixed text (``Grammar.canonical_literals``).

Byte-level BPE can spell a literal in several ways (``Here`` or ``H`` + ``ere``), so inside a
literal the token automaton usually allows several tokens and jump-forward finds few forced
ones. A model was trained on the tokenizer's own (canonical) spellings, so the other spellings
carry almost no probability. With ``canonical_literals`` the compiler keeps, in each state where
every continuation starts with the same text F (the state's *forced text*), only the tokens
of F's canonical tokenization ``encode(F) = c1 c2 ... cm``:

* m >= 2: only c1 (it lies inside F; the next state continues with the rest of F);
* m = 1 (c1 = F): the tokens that start with F (F itself, or a token that merges F with what
  follows, as ``" (+"`` merges the literal ``" ("`` with a sign).

Every text of the language stays reachable (the kept tokens spell F's prefix or F itself,
after which nothing is restricted); only token paths the tokenizer would never produce for
that text are removed. F is tokenised on its own, without the text before it (as SGLang's
jump-forward re-tokenises forced text); the canonical spelling of a whole answer can differ
where a token merges across the start of F, which the free choice before F still allows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

Edges = list[tuple[np.ndarray, np.ndarray]]  # per state: (allowed token ids, next states)


def forced_texts(edges: Edges, accepting: np.ndarray, token_bytes: Sequence[bytes | None]) -> list[bytes]:
    """Per state, the bytes every continuation from it starts with (b"" where the answer may
    end, or where two continuations differ in their first byte).

    A state's first byte is forced when every allowed token starts with the same byte b; its
    forced text is then b followed by the forced text of the state after b's one-byte token.
    """
    first = np.full((len(token_bytes),), -1, np.int64)
    single: dict[int, int] = {}
    for idx, token in enumerate(token_bytes):
        if token:
            first[idx] = token[0]
            if len(token) == 1:
                single[token[0]] = idx
    step: list[tuple[int, int] | None] = [None] * len(edges)  # (forced byte, state after it)
    for state, (ids, nxt) in enumerate(edges):
        if accepting[state] or ids.size == 0:
            continue
        firsts = first[ids]
        byte = int(firsts[0])
        token = single.get(byte)
        if token is None or (firsts != byte).any():
            continue
        hit = np.flatnonzero(ids == token)
        if hit.size:
            step[state] = (byte, int(nxt[hit[0]]))
    texts: list[bytes | None] = [None] * len(edges)
    for state in range(len(edges)):
        chain = []
        node = state
        while texts[node] is None and step[node] is not None and node not in chain:
            chain.append(node)
            node = step[node][1]
        tail = texts[node] if texts[node] is not None else b""
        texts[node] = tail
        for member in reversed(chain):  # each state's text is its byte + its successor's text
            tail = bytes([step[member][0]]) + tail
            texts[member] = tail
    return [t or b"" for t in texts]


def canonical_edges(edges: Edges, accepting: np.ndarray, token_bytes: Sequence[bytes | None],
                    encode: Callable[[str], list[int]]) -> Edges:
    """``edges`` with each state inside fixed text restricted to its canonical tokens (see the
    module docstring). States whose forced text is not whole UTF-8, or whose canonical first
    token the state does not allow, keep all their tokens."""
    out = list(edges)
    for state, text in enumerate(forced_texts(edges, accepting, token_bytes)):
        if not text:
            continue
        try:
            pieces = encode(text.decode("utf-8"))
        except UnicodeDecodeError:
            continue
        if not pieces or b"".join(token_bytes[p] or b"\xff" for p in pieces) != text:
            continue
        ids, nxt = edges[state]
        if len(pieces) > 1:
            keep = ids == pieces[0]
        else:
            keep = np.fromiter(((token_bytes[i] or b"").startswith(text) for i in ids.tolist()), bool, ids.size)
        if keep.any():
            out[state] = (ids[keep], nxt[keep])
    return out


def reachable(edges: Edges, accepting: np.ndarray) -> tuple[Edges, np.ndarray]:
    """The states reachable from state 0, renumbered breadth-first (edges, accepting)."""
    order, number = [0], {0: 0}
    for state in order:
        for target in np.unique(edges[state][1]).tolist():
            if target not in number:
                number[target] = len(order)
                order.append(target)
    renumber = np.full((len(edges),), -1, np.int32)
    renumber[np.asarray(order)] = np.arange(len(order), dtype=np.int32)
    return [(edges[s][0], renumber[edges[s][1]]) for s in order], accepting[np.asarray(order)]
