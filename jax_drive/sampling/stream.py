"""Resumable, chunked decoding: run the decode loop a few steps at a time from the host.

:class:`DecodeRun` holds one sampler call's loop state on the device. ``advance(k)`` runs
the compiled loop (the one-call program: the chunk bound ``until`` is a traced setting, so
chunking compiles nothing new) for at most k more iterations and returns the outputs so far;
``drop(rows)`` marks rows done (a cancelled client): they emit nothing more, and the loop
ends as soon as the other rows are done, so a dropped row no longer holds the call open.
The other rows' results are unchanged by chunking and by drops (the loop computes the same
states; a row's draws never depend on whether other rows are done).

:class:`DecodeStream` is the engine-level iterator (``JaxEngine.stream``): each item is a
:class:`StreamChunk` with every row's tokens and log-probs new since the previous chunk, and
``completions()`` gives ``JaxEngine.generate``'s completions (None for dropped rows).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.sampling.decode import decode
from jax_drive.sampling.engine import Completion, FinishReason
from jax_drive.sampling.outputs import SamplerOutput
from jax_drive.sampling.request import Request
from jax_drive.sampling.shapes import SamplerConfig
from jax_drive.sampling.state import DecodeState


class DecodeRun:
    """The decode loop of one sampler call (R real rows), advanced in chunks.

    Args:
      model, weights, graph_and_state: as for ``decode.decode``.
      loop: the loop state before its first step (``sampler.start_decode``); owned (donated)
        from here on.
      rows: R; request, config: the call's.
    """

    def __init__(self, model, weights, loop: DecodeState, rows: int, request: Request,
                 config: SamplerConfig, graph_and_state=None):
        self.model, self.weights, self.graph_and_state = model, weights, graph_and_state
        self.request, self.config, self.rows = request, config, rows
        self._loop = loop
        self._done = np.array(jax.device_get(loop.done))
        self.output = SamplerOutput.from_state(loop, rows, request)
        self.dropped = np.zeros((rows,), bool)

    @property
    def step(self) -> int:
        """Loop iterations run so far."""
        return self.output.steps

    @property
    def finished(self) -> bool:
        """No further step would change anything: every row done, or the budget's steps run."""
        return bool(self._done.all()) or self.step >= self.request.max_new_tokens

    @property
    def state(self) -> DecodeState:
        """The loop state on the device (valid until the next ``advance``)."""
        return self._loop

    def advance(self, steps: int) -> SamplerOutput:
        """Runs at most ``steps`` more loop iterations; returns the outputs so far (R rows)."""
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        if not self.finished:
            self._loop = decode(self.model, self.weights, self._loop, self.request, self.config,
                                self.graph_and_state, until=self.step + steps)
            self._done = np.array(jax.device_get(self._loop.done))
            self.output = SamplerOutput.from_state(self._loop, self.rows, self.request)
        return self.output

    def drop(self, rows: Iterable[int]) -> None:
        """Rows (indices < R) emit nothing from the next step on; their outputs so far stay."""
        rows = sorted({int(r) for r in rows})
        if any(not 0 <= r < self.rows for r in rows):
            raise ValueError(f"rows must lie in [0, {self.rows}), got {rows}")
        if rows:
            self._loop = self._loop.replace(done=self._loop.done.at[jnp.asarray(rows)].set(True))
            self._done[rows] = True
            self.dropped[rows] = True

    def row_finish(self, i: int) -> FinishReason | None:
        """Why row ``i`` ended ("stop" / "length"), or None while it runs or once dropped."""
        if self.dropped[i]:
            return None
        if self.output.stopped[i]:
            return "stop"
        if self.output.lengths[i] >= self.request.max_new_tokens or self.finished:
            return "length"
        return None


@dataclasses.dataclass(frozen=True)
class RowDelta:
    """One row's news in a chunk: the tokens (and their log-probs) generated since the
    previous chunk, and ``finish_reason`` ("stop" / "length") in the chunk where it ended."""

    row: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason | None = None


@dataclasses.dataclass(frozen=True)
class StreamChunk:
    """What a stream's step produced: a delta per row with news, and the decode-loop
    iterations (forward passes) run so far, summed over the stream's device batches."""

    rows: tuple[RowDelta, ...]
    steps: int


class DecodeStream:
    """Iterator over the chunks of a ``JaxEngine.stream`` generation.

    Rows are numbered like ``generate``'s completions (prompt-major, ``params.n`` per prompt);
    the engine splits them into device batches (``max_batch_size``), each a :class:`DecodeRun`,
    and every chunk advances each unfinished batch by ``chunk_steps`` loop iterations.
    """

    def __init__(self, engine, runs: Sequence[tuple[int, DecodeRun, Sequence[Sequence[int]]]],
                 request: Request, chunk_steps: int, skip_special_tokens: bool = True):
        if chunk_steps < 1:
            raise ValueError(f"chunk_steps must be >= 1, got {chunk_steps}")
        self._engine = engine
        self._runs = list(runs)  # (first row, run, prompt ids of its rows)
        self.request = request
        self.chunk_steps = int(chunk_steps)
        self._skip = skip_special_tokens
        self.num_rows = sum(run.rows for _, run, _ in self._runs)
        self._sent = np.zeros((self.num_rows,), np.int64)  # tokens already reported per row
        self._ended = np.zeros((self.num_rows,), bool)  # finish already reported (or dropped)

    @property
    def finished(self) -> bool:
        return all(run.finished for _, run, _ in self._runs)

    def _locate(self, row: int) -> tuple[DecodeRun, int]:
        for first, run, _ in self._runs:
            if first <= row < first + run.rows:
                return run, row - first
        raise ValueError(f"row {row} is not in [0, {self.num_rows})")

    def cancel(self, rows: Iterable[int]) -> None:
        """Drops rows (a cancelled client): they get no further tokens, and no completion."""
        for row in {int(r) for r in rows}:
            run, i = self._locate(row)
            run.drop([i])
            self._ended[row] = True

    def __iter__(self) -> "DecodeStream":
        return self

    def __next__(self) -> StreamChunk:
        if self._ended.all():  # every row finished (and said so) or dropped
            raise StopIteration
        deltas = []
        for first, run, _ in self._runs:
            out = run.advance(self.chunk_steps)
            for i in range(run.rows):
                row = first + i
                if self._ended[row]:
                    continue
                n = int(out.lengths[i])
                reason = run.row_finish(i)
                if n > self._sent[row] or reason is not None:
                    ids = out.tokens[i, self._sent[row]:n].tolist()
                    lps = out.logprobs[i, self._sent[row]:n].tolist()
                    deltas.append(RowDelta(row, tuple(ids), tuple(lps), reason))
                    self._sent[row] = n
                    self._ended[row] = reason is not None
        return StreamChunk(rows=tuple(deltas), steps=sum(run.step for _, run, _ in self._runs))

    def completions(self) -> list[Completion | None]:
        """Runs the rest of the generation; per row its ``Completion`` (equal to
        ``JaxEngine.generate``'s), None for a dropped row."""
        for _ in self:
            pass
        out: list[Completion | None] = []
        for _, run, prompts in self._runs:
            for i, prompt in enumerate(prompts):
                out.append(None if run.dropped[i] else
                           self._engine.completion(prompt, run.output, i, self.request, self._skip))
        return out
