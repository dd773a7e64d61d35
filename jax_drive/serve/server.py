"""``PolicyServer``: what ``jax-drive serve`` does with a request, without the HTTP layer.

A generation request (``/v1/completions``, ``/v1/chat/completions``) runs in three steps:

1. ``prepare_*`` in a worker thread of the server's parse pool: JSON -> request model ->
   the limits (rows, ``max_tokens``, prompt tokens, context length) -> token ids. Off the
   event loop, so a large body never delays other requests (``/health`` included).
2. ``generate`` on the event loop: the rows become one ``GenerationJob`` on the batcher
   (429 when its queue is full). Cancelling the await (client gone, timeout) cancels the job,
   which drops its rows from the running batch.
3. ``finish_*`` in the parse pool again: stop strings, token strings, the answer body.

Structured answers (``response_format`` / ``structured_outputs``): step 1 turns the field
into a grammar and compiles it for the model's engine (cached there), so a grammar that is
invalid, too large, too slow to compile (``ServeConfig.grammar_compile_s``) or unable to
finish within ``max_tokens`` is a 400 naming the problem before anything is queued. The
returned log-probs are those of the masked policy the answer was sampled from (a token the
grammar forced has log-prob 0).

A request with ``stream=true`` takes the same step 1 (so every limit is a plain HTTP error
before the stream starts), then ``stream`` queues its job and returns a ``StreamedAnswer``
whose events the HTTP layer sends as the batcher hands over each chunk of tokens.

The admin endpoints (adapters, base weights) need the server's API key and load only from
the directories given at start (``ServeConfig.allowed_weights_dirs``). Their answers never
say whether a path exists: a path outside those directories gets one 403 whatever it names,
and a path inside that cannot be loaded one 400, whatever the reason (logged here).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Union

from pydantic import BaseModel, ValidationError

from jax_drive.configs import at_least
from jax_drive.sampling import Completion, SamplingParams
from jax_drive.sampling.grammar.regex import GrammarError, expanded_size, parse
from jax_drive.serve.batcher import BatcherConfig, GenerationJob, QueueFull, RequestBatcher
from jax_drive.serve.errors import FORBIDDEN, TOO_MANY_REQUESTS
from jax_drive.serve.limits import DEFAULT_MAX_QUEUED_ROWS, ServeLimits
from jax_drive.serve.policies import PolicyRegistry
from jax_drive.serve.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    InvalidRequest,
    LoadLoRARequest,
    UnloadLoRARequest,
    UpdateWeightsRequest,
    answer,
    chat_choice,
    completion_choice,
    token_strings,
    truncate_at_stop,
    validation_message,
)
from jax_drive.serve.security import AllowedDirs
from jax_drive.serve.streaming import StreamedAnswer

log = logging.getLogger("jax_drive.serve")



@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """Server settings.

    Attributes:
      batcher: request batching (rows per engine call, max wait, the queued-rows bound).
      limits: per-request limits (``ServeLimits``; ``ServeLimits.off()`` for none).
      default_max_tokens: ``max_tokens`` of a request that gives none (16, as OpenAI).
      seed: seeds the keys of requests without a seed.
      api_key: every request but ``GET /health`` must carry ``Authorization: Bearer KEY``;
        None = no check, and the admin endpoints are then refused (403).
      allowed_weights_dirs: the only directories the admin endpoints load from (none: every
        load is refused).
      parse_workers: threads that parse, tokenise and detokenise requests.
      grammar_compile_s: longest wait for a request's grammar to compile (a 400 beyond it;
        the compilation finishes in the background and is cached).
      max_grammar_size: the largest grammar compiled, in character positions of its regex
        with counted repetitions written out (a 400 beyond it, before any work).
    """

    batcher: BatcherConfig = BatcherConfig(max_queued_rows=DEFAULT_MAX_QUEUED_ROWS)
    limits: ServeLimits = ServeLimits()
    default_max_tokens: int = 16
    seed: int = 0
    api_key: str | None = dataclasses.field(default=None, repr=False)
    allowed_weights_dirs: tuple[str, ...] = ()
    parse_workers: int = 4
    grammar_compile_s: float = 10.0
    max_grammar_size: int = 20_000

    def __post_init__(self):
        at_least(self, 1, "default_max_tokens", "parse_workers")
        if not self.grammar_compile_s > 0 or self.max_grammar_size < 1:
            raise ValueError("grammar_compile_s must be > 0 and max_grammar_size >= 1")
        self.limits.check_settings(self.batcher.max_queued_rows, self.default_max_tokens)
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must be non-empty (None: no key)")


@dataclasses.dataclass
class PreparedRequest:
    """A generation request after step 1: parsed, checked and tokenised.

    Attributes:
      request: the parsed request.
      prompts: token ids per prompt (each becomes ``request.n`` rows).
      params: sampling settings with n == 1.
      stops: stop strings.
    """

    request: Union[CompletionRequest, ChatCompletionRequest]
    prompts: list[list[int]]
    params: SamplingParams
    stops: list[str]


def parse_body(model: type[BaseModel], body: bytes):
    """The request model from a JSON body; ``InvalidRequest`` (400) naming the fields."""
    try:
        return model.model_validate_json(body)
    except ValidationError as error:
        raise InvalidRequest(validation_message(error.errors())) from None


class PolicyServer:
    """The server's state: policies, the batcher, the parse pool; request -> answer.

    Args:
      registry: the served base model and adapters.
      config: ServeConfig.
    """

    def __init__(self, registry: PolicyRegistry, config: ServeConfig = ServeConfig()):
        self.registry = registry
        self.config = config
        self.limits = config.limits
        self.tokenizer = registry.tokenizer
        self.allowed_dirs = AllowedDirs(config.allowed_weights_dirs)
        self.batcher = RequestBatcher(registry.engine, config.batcher, config.seed)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        # one thread compiles grammars (the compiler is not thread-safe; a request waits at most
        # grammar_compile_s for it)
        self._grammar_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.status_counts: Counter = Counter()  # answers by HTTP status (the HTTP layer counts)
        self.stream_counts: Counter = Counter()  # streamed answers by how they ended

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Starts the batcher and the parse pool (the app's lifespan calls this)."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.config.parse_workers, thread_name_prefix="jax-drive-parse")
            self._grammar_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jax-drive-grammar")
        self.batcher.start()

    def stop(self) -> None:
        self.batcher.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self._grammar_pool is not None:
            self._grammar_pool.shutdown(wait=False, cancel_futures=True)
            self._grammar_pool = None

    async def in_pool(self, fn: Callable, *args):
        """``fn(*args)`` in the parse pool, awaited from the event loop."""
        if self._pool is None:
            raise RuntimeError("the server is not started")
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # ------------------------------------------------------------------ helpers
    def _eos_ids(self) -> tuple[int, ...]:
        return tuple(int(i) for i in getattr(self.tokenizer, "eos_token_ids", ()) or ())

    def _encode(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            ids = list(self.tokenizer.encode(prompt))
            if not ids:
                raise InvalidRequest("a prompt encodes to no tokens", "prompt")
            return ids
        vocab = int(self.registry.model.config.vocab_size)
        if any(not (0 <= int(t) < vocab) for t in prompt):
            raise InvalidRequest(f"prompt token ids must lie in [0, {vocab})", "prompt")
        return [int(t) for t in prompt]

    def _encode_all(self, prompts: list, n: int) -> list[list[int]]:
        """Token ids of every prompt, stopping at the first that takes the request past
        ``max_prompt_tokens`` (each prompt counted n times)."""
        out, total = [], 0
        for prompt in prompts:
            ids = self._encode(prompt)
            total += len(ids) * n
            self.limits.check_prompt_tokens(total)
            out.append(ids)
        return out

    def _params(self, request) -> SamplingParams:
        params = request.sampling_params(self.config.default_max_tokens, self._eos_ids())
        self.limits.check_max_tokens(params.max_new_tokens)
        self._check_grammar(request, params)
        return params

    def _check_grammar(self, request, params: SamplingParams) -> None:
        """Compiles the request's grammar for its model's engine (in the grammar thread, at most
        ``grammar_compile_s``), so every problem is a 400 before the request is queued."""
        grammar = params.grammar
        if grammar is None:
            return
        field = "structured_outputs" if request.structured_outputs is not None else "response_format"
        size = expanded_size(parse(grammar.pattern))
        if size > self.config.max_grammar_size:
            raise InvalidRequest(f"{field}: the grammar is too large ({size} character positions with its "
                                 f"repetitions written out; this server compiles at most "
                                 f"{self.config.max_grammar_size})", field, code="grammar_too_large")
        grammars = getattr(self.registry.engine(request.model), "grammars", None)
        if grammars is None or self._grammar_pool is None:
            return  # an engine without local grammars checks at generation
        stops = params.resolved_stop_ids(self._eos_ids())
        future = self._grammar_pool.submit(grammars.compile, grammar, stops, params.max_new_tokens)
        try:
            future.result(timeout=self.config.grammar_compile_s)
        except concurrent.futures.TimeoutError:
            raise InvalidRequest(f"{field}: compiling the grammar takes longer than this server's limit of "
                                 f"{self.config.grammar_compile_s:g} s; simplify it (fewer or smaller "
                                 "repetitions)", field, code="grammar_timeout") from None
        except GrammarError as error:
            raise InvalidRequest(f"{field}: {error}", field, code="invalid_grammar") from None

    def _check_length(self, prompts: list[list[int]], params: SamplingParams) -> None:
        limit = self.registry.max_model_len
        longest = max(len(p) for p in prompts)
        if longest + params.max_new_tokens > limit:
            raise InvalidRequest(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{longest + params.max_new_tokens} tokens ({longest} in the prompt, "
                f"{params.max_new_tokens} for the completion).", "max_tokens")

    def _decode(self, ids, skip_special_tokens: bool) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def _decode_one(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _finish(self, completion: Completion, stops: list[str], skip: bool):
        if not stops:
            return completion.token_ids, completion.logprobs, completion.text, completion.finish_reason
        return truncate_at_stop(completion, stops, lambda ids: self._decode(ids, skip))

    # ------------------------------------------------- generation (three steps)
    def prepare_completion(self, body: bytes) -> PreparedRequest:
        """Step 1 of POST /v1/completions (runs in the parse pool)."""
        request = parse_body(CompletionRequest, body)
        texts = request.prompt_list()
        self.limits.check_rows(len(texts), request.n)
        params = self._params(request)
        prompts = self._encode_all(texts, request.n)
        self._check_length(prompts, params)
        return PreparedRequest(request, prompts, params, request.stop_strings())

    def prepare_chat(self, body: bytes) -> PreparedRequest:
        """Step 1 of POST /v1/chat/completions (runs in the parse pool)."""
        request = parse_body(ChatCompletionRequest, body)
        self.limits.check_rows(1, request.n)
        params = self._params(request)
        messages = [m.model_dump(exclude_none=True) for m in request.messages]
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        prompts = self._encode_all([text], request.n)
        self._check_length(prompts, params)
        return PreparedRequest(request, prompts, params, request.stop_strings())

    def _job(self, prepared: PreparedRequest) -> GenerationJob:
        """The request's rows (prompt-major, n per prompt) as a job; 404 for an unknown model."""
        request = prepared.request
        self.registry.engine(request.model)  # 404 before queueing
        rows = [p for p in prepared.prompts for _ in range(request.n)]
        return GenerationJob(request.model, rows, prepared.params, request.seed)

    def _submit(self, job: GenerationJob) -> concurrent.futures.Future:
        try:
            return self.batcher.submit(job)
        except QueueFull as error:
            raise InvalidRequest(str(error), status=TOO_MANY_REQUESTS, code="queue_full") from None

    async def generate(self, prepared: PreparedRequest) -> list[Completion]:
        """Step 2: the request's rows through the batcher.

        Raises:
          InvalidRequest: 404 unknown model, 429 the batcher's queue is full, 400 values the
            engine refused.
          asyncio.CancelledError: the await was cancelled; the job is cancelled with it.
        """
        job = self._job(prepared)
        future = self._submit(job)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            job.cancel()
            raise
        except InvalidRequest:
            raise
        except ValueError as error:  # bad values the checks of step 1 did not catch
            raise InvalidRequest(str(error)) from None

    def stream(self, prepared: PreparedRequest) -> StreamedAnswer:
        """Step 2 of a streamed request (on the event loop): its job queued (404 / 429 as in
        ``generate``), its events to come from the returned answer."""
        job = self._job(prepared)
        answer = StreamedAnswer(job, prepared.request, prepared.prompts, prepared.stops, self.tokenizer,
                                self.in_pool, self.stream_counts)
        self._submit(job)
        return answer

    def finish_completion(self, prepared: PreparedRequest, completions: list[Completion]) -> dict:
        """Step 3 of POST /v1/completions (runs in the parse pool)."""
        request, params = prepared.request, prepared.params
        choices, generated = [], 0
        for i, c in enumerate(completions):
            ids, lps, text, finish = self._finish(c, prepared.stops, params.skip_special_tokens)
            tokens = None
            if request.logprobs is not None:
                tokens = token_strings(ids, self._decode_one, request.return_tokens_as_token_ids)
            choices.append(completion_choice(i, ids, lps, text, finish, c.prompt_token_ids, tokens))
            generated += len(ids)
        return answer("text_completion", request.model, choices,
                      sum(len(p) for p in prepared.prompts) * request.n, generated)

    def finish_chat(self, prepared: PreparedRequest, completions: list[Completion]) -> dict:
        """Step 3 of POST /v1/chat/completions (runs in the parse pool)."""
        request, params = prepared.request, prepared.params
        prompt = prepared.prompts[0]
        choices, generated = [], 0
        for i, c in enumerate(completions):
            ids, lps, content, finish = self._finish(c, prepared.stops, params.skip_special_tokens)
            tokens = None
            if request.logprobs:
                tokens = token_strings(ids, self._decode_one, request.return_tokens_as_token_ids)
            choices.append(chat_choice(i, ids, lps, content, finish, tokens))
            generated += len(ids)
        return answer("chat.completion", request.model, choices, len(prompt) * request.n,
                      generated, prompt_token_ids=prompt)

    async def completions(self, body: bytes) -> dict | StreamedAnswer:
        """POST /v1/completions: the three steps (or the stream)."""
        prepared = await self.in_pool(self.prepare_completion, body)
        if prepared.request.stream:
            return self.stream(prepared)
        return await self.in_pool(self.finish_completion, prepared, await self.generate(prepared))

    async def chat(self, body: bytes) -> dict | StreamedAnswer:
        """POST /v1/chat/completions: the three steps (or the stream)."""
        prepared = await self.in_pool(self.prepare_chat, body)
        if prepared.request.stream:
            return self.stream(prepared)
        return await self.in_pool(self.finish_chat, prepared, await self.generate(prepared))

    # ---------------------------------------------------------------- read only
    def models(self) -> dict:
        created = int(time.time())
        base = self.registry.base_name
        data = [{"id": base, "object": "model", "created": created, "owned_by": "jax-drive",
                 "root": base, "parent": None, "max_model_len": self.registry.max_model_len}]
        for name, path in self.registry.adapters().items():
            data.append({"id": name, "object": "model", "created": created,
                         "owned_by": "jax-drive", "root": path, "parent": base,
                         "max_model_len": self.registry.max_model_len})
        return {"object": "list", "data": data}

    def health(self, detailed: bool) -> dict:
        """GET /health: always ``status``; the counts and the weights' directory only for
        ``detailed`` (a caller with the key, or a server without one)."""
        if not detailed:
            return {"status": "ok"}
        batcher = self.batcher
        return {"status": "ok", "engine_calls": batcher.engine_calls, "rows": batcher.rows_generated,
                "decode_steps": batcher.decode_steps, "running_rows": batcher.running_rows,
                "queued_rows": batcher.queued_rows,
                "cancelled_rows": batcher.cancelled_rows, "dropped_rows": batcher.dropped_rows,
                "answers": {str(k): v for k, v in sorted(self.status_counts.items())},
                "streams": dict(sorted(self.stream_counts.items())),
                "weights_path": self.registry.weights_path}

    # ------------------------------------------------------------------- admin
    def _require_admin(self, loads: bool) -> None:
        if self.config.api_key is None:
            raise InvalidRequest("this endpoint needs the server to run with an API key "
                                 "(--api-key or JAX_DRIVE_API_KEY)", status=FORBIDDEN, code="admin_disabled")
        if loads and not self.allowed_dirs:
            raise InvalidRequest("this server loads nothing from disk: start it with "
                                 "--allowed-weights-dir DIR", status=FORBIDDEN, code="admin_disabled")

    def _confined(self, path: str, param: str) -> str:
        resolved = self.allowed_dirs.confine(path)
        if resolved is None:
            raise InvalidRequest(f"{param} is not inside a directory this server may load from "
                                 "(--allowed-weights-dir)", param, status=FORBIDDEN, code="path_not_allowed")
        return str(resolved)

    async def _load(self, param: str, what: str, fn: Callable, *args) -> None:
        """``fn(*args)`` (a registry load) off the loop; failures about the path become one
        answer that does not depend on the reason (the reason is logged)."""
        try:
            await asyncio.get_running_loop().run_in_executor(None, fn, *args)
        except InvalidRequest as error:
            if error.param != param:
                raise  # about names or counts, not the path
            log.warning("cannot load %s from %s: %s", what, param, error)
            raise InvalidRequest(f"cannot load {what} from {param}: no loadable {what} there "
                                 "(the server log has the reason)", param, code="load_failed") from None
        except Exception:  # noqa: BLE001 - unreadable files and the like: the same answer
            log.exception("loading %s from %s failed", what, param)
            raise InvalidRequest(f"cannot load {what} from {param}: no loadable {what} there "
                                 "(the server log has the reason)", param, code="load_failed") from None

    async def load_lora(self, body: bytes) -> dict:
        self._require_admin(loads=True)
        request = parse_body(LoadLoRARequest, body)
        path = self._confined(request.lora_path, "lora_path")
        await self._load("lora_path", "a LoRA adapter", self.registry.load_adapter,
                         request.lora_name, path, request.load_inplace)
        return {"status": "ok", "message": f"Success: LoRA adapter '{request.lora_name}' added successfully."}

    async def unload_lora(self, body: bytes) -> dict:
        self._require_admin(loads=False)
        request = parse_body(UnloadLoRARequest, body)
        await asyncio.get_running_loop().run_in_executor(None, self.registry.unload_adapter, request.lora_name)
        return {"status": "ok", "message": f"Success: LoRA adapter '{request.lora_name}' removed successfully."}

    async def update_weights(self, body: bytes) -> dict:
        """Reloads the base weights; requests answered after this returns use them (a batch
        already running finishes on the old ones)."""
        self._require_admin(loads=True)
        request = parse_body(UpdateWeightsRequest, body)
        path = self._confined(request.model_path, "model_path")
        await self._load("model_path", "model weights", self.registry.load_weights, path)
        return {"success": True, "message": "Succeeded to update model weights."}
