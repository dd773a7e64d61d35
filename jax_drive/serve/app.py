"""``jax-drive serve``: an OpenAI-compatible HTTP server over our Flax policy.

Endpoints (vLLM's paths and bodies):
  GET  /v1/models                  base model + loaded LoRA adapters (``owned_by: jax-drive``)
  POST /v1/completions             text or token-id prompts (one or many), n, seed, stop
                                   strings, stop_token_ids / ignore_eos, min_tokens, top_k,
                                   logprobs (0/1), logprobs_mode ('raw' | 'processed')
  POST /v1/chat/completions        chat template of the served tokenizer, same settings
  POST /v1/load_lora_adapter       {lora_name, lora_path, load_inplace} (PEFT directory)
  POST /v1/unload_lora_adapter     {lora_name}
  POST /update_weights_from_disk   {model_path}: reload the base weights from an HF directory
                                   (SGLang's endpoint; for full fine-tuning trainers)
  GET  /health                     200 when up, with the batcher's counts (engine calls, rows)
                                   and where the base weights were last reloaded from

Every answer choice carries ``token_ids`` (and completions ``prompt_token_ids``), as vLLM's
``return_token_ids`` does. Concurrent requests are batched into one sampler call
(``RequestBatcher``). Errors use OpenAI's layout: 400 for requests the server cannot honour
(validation included), 404 for unknown models / adapters, 500 for internal failures.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from jax_drive.sampling import Completion, SamplingParams
from jax_drive.serve.batcher import BatcherConfig, GenerationJob, RequestBatcher
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
    error_body,
    token_strings,
    truncate_at_stop,
)


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """Server settings.

    Attributes:
      batcher: request batching (rows per engine call, max wait).
      default_max_tokens: ``max_tokens`` of a request that gives none (16, as OpenAI).
      seed: seeds the keys of requests without a seed.
    """

    batcher: BatcherConfig = BatcherConfig()
    default_max_tokens: int = 16
    seed: int = 0


class PolicyServer:
    """The server's state: policies, the batcher, request -> jobs -> answers.

    Args:
      registry: the served base model and adapters.
      config: ServeConfig.
    """

    def __init__(self, registry: PolicyRegistry, config: ServeConfig = ServeConfig()):
        self.registry = registry
        self.config = config
        self.tokenizer = registry.tokenizer
        self.batcher = RequestBatcher(registry.engine, config.batcher, config.seed)

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

    async def _generate(self, model: str, prompts: list[list[int]], params: SamplingParams,
                        n: int, seed: int | None) -> list[Completion]:
        self.registry.engine(model)  # 404 before queueing
        rows = [p for p in prompts for _ in range(n)]
        job = GenerationJob(model, rows, params, seed)
        future = self.batcher.submit(job)
        try:
            return await asyncio.wrap_future(future)
        except InvalidRequest:
            raise
        except ValueError as error:  # bad values the checks above did not catch
            raise InvalidRequest(str(error)) from None

    def _finish(self, completion: Completion, stops: list[str], skip: bool):
        if not stops:
            return completion.token_ids, completion.logprobs, completion.text, completion.finish_reason
        return truncate_at_stop(completion, stops, lambda ids: self._decode(ids, skip))

    # ---------------------------------------------------------------- endpoints
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

    async def completions(self, request: CompletionRequest) -> dict:
        params = request.sampling_params(self.config.default_max_tokens, self._eos_ids())
        stops = request.stop_strings()
        prompts = [self._encode(p) for p in request.prompt_list()]
        self._check_length(prompts, params)
        completions = await self._generate(request.model, prompts, params, request.n, request.seed)
        choices, generated = [], 0
        for i, c in enumerate(completions):
            ids, lps, text, finish = self._finish(c, stops, params.skip_special_tokens)
            tokens = None
            if request.logprobs is not None:
                tokens = token_strings(ids, self._decode_one, request.return_tokens_as_token_ids)
            choices.append(completion_choice(i, ids, lps, text, finish, c.prompt_token_ids, tokens))
            generated += len(ids)
        return answer("text_completion", request.model, choices,
                      sum(len(p) for p in prompts) * request.n, generated)

    async def chat(self, request: ChatCompletionRequest) -> dict:
        params = request.sampling_params(self.config.default_max_tokens, self._eos_ids())
        stops = request.stop_strings()
        messages = [m.model_dump(exclude_none=True) for m in request.messages]
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        prompt = self._encode(text)
        self._check_length([prompt], params)
        completions = await self._generate(request.model, [prompt], params, request.n, request.seed)
        choices, generated = [], 0
        for i, c in enumerate(completions):
            ids, lps, content, finish = self._finish(c, stops, params.skip_special_tokens)
            tokens = None
            if request.logprobs:
                tokens = token_strings(ids, self._decode_one, request.return_tokens_as_token_ids)
            choices.append(chat_choice(i, ids, lps, content, finish, tokens))
            generated += len(ids)
        return answer("chat.completion", request.model, choices, len(prompt) * request.n,
                      generated, prompt_token_ids=prompt)

    async def load_lora(self, request: LoadLoRARequest) -> dict:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.registry.load_adapter, request.lora_name,
                                   request.lora_path, request.load_inplace)
        return {"status": "ok", "message": f"Success: LoRA adapter '{request.lora_name}' added successfully."}

    async def unload_lora(self, request: UnloadLoRARequest) -> dict:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.registry.unload_adapter, request.lora_name)
        return {"status": "ok", "message": f"Success: LoRA adapter '{request.lora_name}' removed successfully."}

    async def update_weights(self, request: UpdateWeightsRequest) -> dict:
        """Reloads the base weights; requests answered after this returns use them (a batch
        already running finishes on the old ones)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.registry.load_weights, request.model_path)
        return {"success": True, "message": f"Succeeded to update model weights from {request.model_path}."}


def create_app(server: PolicyServer):
    """The FastAPI application over ``server``; the batcher runs while the app is up."""
    import contextlib

    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    @contextlib.asynccontextmanager
    async def lifespan(app):
        server.batcher.start()
        try:
            yield
        finally:
            server.batcher.stop()

    app = FastAPI(title="jax-drive serve", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, error: RequestValidationError):
        parts = []
        for e in error.errors():
            where = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
            parts.append(f"{where}: {e.get('msg')}" if where else str(e.get("msg")))
        return JSONResponse(error_body("; ".join(parts) or "invalid request"), status_code=400)

    @app.exception_handler(InvalidRequest)
    async def _invalid(request: Request, error: InvalidRequest):
        kind = "NotFoundError" if error.status == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(error), kind, error.param, error.code),
                            status_code=error.status)

    @app.exception_handler(Exception)
    async def _internal(request: Request, error: Exception):
        return JSONResponse(error_body(f"{type(error).__name__}: {error}", "internal_server_error"),
                            status_code=500)

    @app.get("/health")
    async def health():
        sizes = list(server.batcher.batch_sizes)
        return {"status": "ok", "engine_calls": len(sizes), "rows": int(sum(sizes)),
                "weights_path": server.registry.weights_path}

    @app.get("/v1/models")
    async def models():
        return server.models()

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest):
        return await server.completions(request)

    @app.post("/v1/chat/completions")
    async def chat(request: ChatCompletionRequest):
        return await server.chat(request)

    @app.post("/v1/load_lora_adapter")
    async def load_lora(request: LoadLoRARequest):
        return await server.load_lora(request)

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(request: UnloadLoRARequest):
        return await server.unload_lora(request)

    @app.post("/update_weights_from_disk")
    async def update_weights(request: UpdateWeightsRequest):
        return await server.update_weights(request)

    return app


def run(server: PolicyServer, host: str = "127.0.0.1", port: int = 8000,
        log_level: str = "warning") -> None:
    """Serves until interrupted (SIGINT / SIGTERM)."""
    import uvicorn

    uvicorn.run(create_app(server), host=host, port=port, log_level=log_level)
