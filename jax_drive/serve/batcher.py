"""Batches concurrent generation requests into single engine calls.

Requests become ``GenerationJob``s (token-id rows, one per completion) on a queue. One
worker thread takes the first waiting job, keeps collecting for at most ``max_wait_s`` or
until ``max_batch_rows`` rows are gathered, groups the jobs by (model, sampling settings)
and runs one engine call per group, so concurrent RL rollout requests with the same
settings share one jitted sampler call. The worker is the only caller of the engines, so
nothing else touches the models while they sample.

An engine with a chunked decode (``JaxEngine.stream``) is run ``chunk_steps`` decode steps
at a time; between chunks the worker hands each streamed job (``on_chunk``) the new tokens
of its rows and drops the rows nobody waits for any more (below). The first chunk of a call
with a streamed job is one step, so its first tokens go out right after the prefill. The
completions are those of ``engine.generate`` (the chunked decode computes the same states).
An engine without it (``generate`` only) answers in one piece: a streamed job then gets all
of its tokens in one chunk.

Back pressure: with ``max_queued_rows`` set, a job that would raise the rows waiting for a
batch above it is refused at once (``QueueFull``, the server's 429), so a flood of requests
cannot queue more work than the worker will reach in reasonable time.

Cancellation: each job carries a ``cancelled`` event. ``GenerationJob.cancel()`` (a client
that went away, a request past its timeout) sets it and cancels the job's future; a job
cancelled before its batch starts is dropped from the batch, and one cancelled while its
call runs has its rows dropped from the chunked decode at the next chunk
(``DecodeStream.cancel``): they stop holding the call open, so the call ends as soon as the
other rows are done and the next batch starts. ``drop_rows`` drops single rows (a streamed
choice that reached a stop string). With an engine without a chunked decode the call runs
to its end.

Seeds: every row gets its own PRNG key (the engines take one key per row, as
``JaxEngine`` does): the rows of a request with seed s use ``request_keys(s, rows)``, those
of an unseeded request keys drawn from the batcher's generator. A row samples only from its
own key, so a seeded request gives the same completions alone or batched with any others
(up to float rounding that differs between batch shapes, which can flip a near-tie).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np

from jax_drive.configs import at_least
from jax_drive.sampling import Completion, Engine, RowDelta, SamplingParams

log = logging.getLogger("jax_drive.serve")


RECENT_CALLS = 1024  # engine calls whose row counts the batcher keeps (batch_sizes)


@dataclasses.dataclass
class GenerationJob:
    """One request's rows.

    Attributes:
      model: served model / adapter name.
      prompts: token-id rows (a prompt repeated n times for n samples).
      params: sampling settings with n == 1.
      seed: the request's seed or None.
      future: receives the completions (row order; None for a row dropped by ``drop_rows``)
        or the exception.
      cancelled: set when nobody waits for the answer any more (see ``cancel``).
      on_chunk: for a streamed request, called by the worker thread with each chunk's
        ``RowDelta``s of this job's rows (numbered from 0), before the future is set; every
        row not dropped ends with a delta that carries its ``finish_reason``.
    """

    model: str
    prompts: list[list[int]]
    params: SamplingParams
    seed: int | None = None
    future: concurrent.futures.Future = dataclasses.field(default_factory=concurrent.futures.Future)
    cancelled: threading.Event = dataclasses.field(default_factory=threading.Event)
    on_chunk: Callable[[tuple[RowDelta, ...]], None] | None = None
    _drops: set = dataclasses.field(default_factory=set, init=False, repr=False)
    _drops_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def rows(self) -> int:
        return len(self.prompts)

    def cancel(self) -> None:
        """Nobody waits for this job any more: flags it and cancels its future (which drops
        it from its batch unless the batch is already running, and its rows from a running
        chunked decode at the next chunk)."""
        self.cancelled.set()
        self.future.cancel()

    def drop_rows(self, rows: Sequence[int]) -> None:
        """Rows (of this job, from 0) nobody needs any more: dropped at the next chunk."""
        with self._drops_lock:
            self._drops.update(int(r) for r in rows)

    def rows_to_drop(self) -> set[int]:
        """Every row when cancelled, else the rows ``drop_rows`` named."""
        if self.cancelled.is_set():
            return set(range(self.rows))
        with self._drops_lock:
            return set(self._drops)


class QueueFull(RuntimeError):
    """The batcher's queue holds ``max_queued_rows`` rows already (retry later)."""


@dataclasses.dataclass(frozen=True)
class BatcherConfig:
    """Request batching.

    Attributes:
      max_batch_rows: most completion rows per engine call (default 32); a single request
        with more rows runs alone.
      max_wait_s: how long the first request of a batch waits for companions (default
        0.01 s; 0 = take only what is already queued).
      max_queued_rows: most rows waiting for a batch (the running batch not counted); a job
        that would exceed it is refused with ``QueueFull``. None = unbounded (default).
      chunk_steps: decode steps between two looks at a running call (streamed tokens out,
        dropped rows out); default 16.
    """

    max_batch_rows: int = 32
    max_wait_s: float = 0.01
    max_queued_rows: int | None = None
    chunk_steps: int = 16

    def __post_init__(self):
        if self.max_batch_rows < 1 or not 0 <= self.max_wait_s < float("inf"):
            raise ValueError("max_batch_rows must be >= 1 and max_wait_s a finite number >= 0")
        at_least(self, 1, "chunk_steps")
        if self.max_queued_rows is not None and self.max_queued_rows < 1:
            raise ValueError("max_queued_rows must be >= 1 or None")


def group_jobs(jobs: Sequence[GenerationJob]) -> list[list[GenerationJob]]:
    """Jobs that can share one engine call: same model and same sampling settings
    (first-come order kept within and across groups)."""
    groups: dict[tuple, list[GenerationJob]] = {}
    for job in jobs:
        groups.setdefault((job.model, job.params), []).append(job)
    return list(groups.values())


def request_keys(seed: int, rows: int) -> jax.Array:
    """(rows,) PRNG keys of the rows of a request with ``seed`` (prompt-major, n per prompt):
    ``jax.random.split(jax.random.key(seed mod 2**32), rows)``."""
    return jax.random.split(jax.random.key(int(seed) % 2**32), rows)


def batch_keys(jobs: Sequence[GenerationJob], rng: np.random.Generator) -> jax.Array:
    """One PRNG key per row of the jobs of an engine call, in row order (see the module
    docstring); unseeded jobs draw a seed from ``rng``."""
    parts = [request_keys(int(rng.integers(0, 2**31 - 1)) if job.seed is None else job.seed, job.rows)
             for job in jobs]
    if len(parts) == 1:
        return parts[0]
    # joined on the host: a jitted concatenate would compile once per mix of request sizes
    data = np.concatenate([np.asarray(jax.random.key_data(p)) for p in parts])
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(parts[0]))


class RequestBatcher:
    """A worker thread that runs queued ``GenerationJob``s in batches.

    Args:
      engine_for: model name -> Engine taking one key per row, like ``JaxEngine`` (raises
        for an unknown name; the job then fails).
      config: BatcherConfig.
      seed: seeds the keys of unseeded requests.
    """

    def __init__(self, engine_for: Callable[[str], Engine], config: BatcherConfig = BatcherConfig(),
                 seed: int = 0):
        self.engine_for = engine_for
        self.config = config
        self._rng = np.random.default_rng(seed)
        self._queue: queue.Queue[GenerationJob | None] = queue.Queue()
        self._carry: GenerationJob | None = None
        self._thread: threading.Thread | None = None
        self._queued_rows = 0  # rows submitted and not yet taken into a batch
        self._count_lock = threading.Lock()
        # rows and decode steps of the latest engine calls (bounded: a server runs for weeks;
        # steps are 0 for an engine without a chunked decode), and running totals
        self.batch_sizes: collections.deque[int] = collections.deque(maxlen=RECENT_CALLS)
        self.call_steps: collections.deque[int] = collections.deque(maxlen=RECENT_CALLS)
        self.engine_calls = 0
        self.rows_generated = 0
        self.decode_steps = 0
        self.cancelled_rows = 0  # rows of jobs dropped because they were cancelled while queued
        self.dropped_rows = 0  # rows dropped from a running call (cancelled, or drop_rows)
        self.running_rows = 0  # rows of the engine call in progress (0: none)

    @property
    def queued_rows(self) -> int:
        """Rows waiting for a batch (not counting the running one)."""
        with self._count_lock:
            return self._queued_rows

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> "RequestBatcher":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="jax-drive-batcher", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Finishes the running batch, fails the queued jobs, ends the worker."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout_s)
        self._thread = None
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None and job.future.set_running_or_notify_cancel():
                job.future.set_exception(RuntimeError("the server is shutting down"))

    def submit(self, job: GenerationJob) -> concurrent.futures.Future:
        """Queues ``job``; its future gets the completions.

        Raises:
          QueueFull: ``max_queued_rows`` would be exceeded (nothing is queued).
        """
        if self._thread is None:
            raise RuntimeError("the batcher is not running")
        if job.rows < 1 or job.params.n != 1:
            raise ValueError("a job needs >= 1 rows and params.n == 1")
        limit = self.config.max_queued_rows
        with self._count_lock:
            if limit is not None and self._queued_rows + job.rows > limit:
                raise QueueFull(f"{self._queued_rows} rows are waiting already; this request's "
                                f"{job.rows} would exceed the queue bound of {limit} (--max-queued-rows)")
            self._queued_rows += job.rows
        self._queue.put(job)
        return job.future

    def _taken(self, jobs: Sequence[GenerationJob]) -> None:
        with self._count_lock:
            self._queued_rows -= sum(job.rows for job in jobs)

    # ------------------------------------------------------------------- worker
    def _collect(self, first: GenerationJob) -> tuple[list[GenerationJob], bool]:
        """The first job plus companions; (jobs, stop requested)."""
        jobs, rows = [first], first.rows
        deadline = time.monotonic() + self.config.max_wait_s
        while rows < self.config.max_batch_rows:
            remaining = deadline - time.monotonic()
            try:
                job = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                return jobs, True
            if rows + job.rows > self.config.max_batch_rows:
                self._carry = job
                break
            jobs.append(job)
            rows += job.rows
        return jobs, False

    def _run_group(self, jobs: list[GenerationJob]) -> None:
        live = []
        for job in jobs:
            if job.cancelled.is_set():
                job.future.cancel()
            if job.future.set_running_or_notify_cancel():
                live.append(job)
        self.cancelled_rows += sum(job.rows for job in jobs) - sum(job.rows for job in live)
        if not live:
            return
        try:
            engine = self.engine_for(live[0].model)
            prompts = [row for job in live for row in job.prompts]
            key = batch_keys(live, self._rng)
            self.batch_sizes.append(len(prompts))
            self.engine_calls += 1
            self.rows_generated += len(prompts)
            self.running_rows = len(prompts)
            if callable(getattr(engine, "stream", None)):
                completions, steps = self._decode_in_chunks(engine, live, prompts, key)
            else:
                completions, steps = engine.generate(prompts, live[0].params, key), 0
                if len(completions) == len(prompts):
                    self._hand_out_whole(live, completions)
            self.call_steps.append(steps)
            self.decode_steps += steps
            if len(completions) != len(prompts):
                raise RuntimeError(f"engine returned {len(completions)} completions for {len(prompts)} rows")
        except BaseException as error:  # noqa: BLE001 - handed to every waiting request
            for job in live:
                job.future.set_exception(error)
            return
        finally:
            self.running_rows = 0
        start = 0
        for job in live:
            job.future.set_result(completions[start : start + job.rows])
            start += job.rows

    def _decode_in_chunks(self, engine, jobs: list[GenerationJob], prompts: list[list[int]],
                          key: jax.Array) -> tuple[list[Completion | None], int]:
        """One call through ``engine.stream``: chunks out to the streamed jobs, dropped rows
        out of the decode; (completions, decode steps)."""
        streamed = any(job.on_chunk is not None for job in jobs)
        stream = engine.stream(prompts, jobs[0].params, key,
                               chunk_steps=1 if streamed else self.config.chunk_steps)
        starts = np.cumsum([0] + [job.rows for job in jobs]).tolist()
        dropped = [set() for _ in jobs]
        steps = 0
        while True:
            self._drop_rows(stream, jobs, starts, dropped)
            chunk = next(stream, None)
            if chunk is None:
                break
            stream.chunk_steps = self.config.chunk_steps  # read at every chunk; the first may be 1
            steps = chunk.steps
            for j, job in enumerate(jobs):
                if job.on_chunk is not None and not job.cancelled.is_set():
                    mine = tuple(dataclasses.replace(d, row=d.row - starts[j]) for d in chunk.rows
                                 if starts[j] <= d.row < starts[j + 1])
                    if mine:
                        self._hand_out(job, mine)
        return stream.completions(), steps

    def _drop_rows(self, stream, jobs, starts, dropped: list[set]) -> None:
        """Cancels in ``stream`` the rows its jobs no longer want (``dropped``: per job, the
        rows dropped already)."""
        rows = []
        for j, job in enumerate(jobs):
            new = job.rows_to_drop() - dropped[j]
            dropped[j] |= new
            rows += [starts[j] + r for r in sorted(new)]
        if rows:
            stream.cancel(rows)
            self.dropped_rows += len(rows)

    def _hand_out(self, job: GenerationJob, deltas: tuple[RowDelta, ...]) -> None:
        try:
            job.on_chunk(deltas)
        except Exception:  # noqa: BLE001 - a listener that cannot take chunks is gone
            log.exception("a streamed request could not take its chunk; dropping it")
            job.cancel()

    def _hand_out_whole(self, jobs: list[GenerationJob], completions: list[Completion]) -> None:
        """Each streamed job's completions as one chunk (an engine without a chunked decode)."""
        start = 0
        for job in jobs:
            if job.on_chunk is not None and not job.cancelled.is_set():
                self._hand_out(job, tuple(RowDelta(i, c.token_ids, c.logprobs, c.finish_reason)
                                          for i, c in enumerate(completions[start : start + job.rows])))
            start += job.rows

    def _loop(self) -> None:
        stopping = False
        while not stopping:
            first = self._carry if self._carry is not None else self._queue.get()
            self._carry = None
            if first is None:
                break
            jobs, stopping = self._collect(first)
            self._taken(jobs)
            for group in group_jobs(jobs):
                self._run_group(group)
