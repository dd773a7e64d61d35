"""``OpenAIEngine``: the ``Engine`` interface over an OpenAI-compatible HTTP server.

Servers differ in what they accept and return, so the engine first learns which *dialect*
it talks to (``remote.dialects``, from ``GET /v1/models``) and then:

- sends token-id prompts where the server accepts them (vLLM, jax-drive), otherwise text
  (token-id prompts are decoded with the local tokenizer, special tokens kept);
- sends one request per completion row (prompt x sample), each with its own seed from the
  caller's key (``remote.requests.row_seeds``): a server that ignores ``n`` (llama.cpp) still
  yields ``n`` samples, and the G rollouts of a group never share a seed (vLLM seeds every
  prompt of a request alike, which would make identical prompts sample identical completions);
- always sends neutral values for the sampling knobs ``SamplingParams`` has no field for
  (``remote.requests``);
- refuses, with ``UnsupportedParameterError``, what the server cannot honour
  (``remote.dialects.check_sampling_params``): ``top_k`` / ``min_new_tokens`` on a plain
  OpenAI server, ``stop_token_ids`` other than the model's EOS on llama.cpp, and a
  ``logprobs_mode`` that differs from the server's (vLLM fixes it per server with
  ``--logprobs-mode``: declare it with ``server_logprobs_mode``; llama.cpp reports raw
  log-probs; jax-drive serve takes it per request). ``processed`` on a raw-only server is
  accepted only where the two coincide (temperature 1, no top-k/top-p, no minimum length).
  ``skip_special_tokens`` is honoured by vLLM and jax-drive; llama.cpp's text never has
  special tokens;
- reads each answer with ``remote.responses`` (generated ids recovered from token texts
  where the server reports only those; where ids and log-probs came from is in
  ``Completion.metadata``). With ``require_token_logprobs=True`` (RL training) any completion
  whose ids or log-probs are not exact raises instead.

Failures (``remote.transport``): connection errors and HTTP 429 / 502 / 503 / 504 are
retried with exponential backoff, everything else fails at once with the server's message.
An unknown model name is an error (llama.cpp would silently serve its default model).

Grammars (``SamplingParams.grammar``) go in each dialect's form (``remote.requests.
grammar_fields``): vLLM and jax-drive serve ``structured_outputs`` (``regex``), llama.cpp a
GBNF ``grammar`` (completions and chat). With ``grammar_mode="exact"`` (default) the server's
language is the local automaton's, so a trainer recomputes the answers' log-probs locally
under the same masks; ``"native"`` sends JSON schemas / choices in the dialect's own form
(vLLM ``structured_outputs`` ``json`` / ``choice``; llama.cpp chat ``response_format``
``json_object`` + schema; a plain OpenAI server ``response_format`` ``json_schema``), where
the server picks the JSON whitespace. What a dialect cannot express is refused before
anything is sent (``UnsupportedParameterError``).
"""

from __future__ import annotations

import concurrent.futures
import warnings
from collections.abc import Sequence
from typing import Any

import jax

from jax_drive.sampling.engine import (
    Completion,
    Message,
    Prompt,
    validate_conversations,
    validate_prompts,
)
from jax_drive.sampling.params import SamplingParams
from jax_drive.sampling.remote.dialects import (
    DIALECTS,
    ServerDialect,
    check_sampling_params,
    dialect_from_models,
    logprobs_equivalent,
)
from jax_drive.sampling.remote.errors import OpenAIEngineError, UnsupportedParameterError
from jax_drive.sampling.remote.requests import (
    build_chat_request,
    build_completion_request,
    build_prompt_logprobs_request,
    grammar_fields,
    normalize_base_url,
    row_seeds,
)
from jax_drive.sampling.remote.responses import (
    RemoteMetadata,
    TokenPieces,
    parse_completion_choice,
    parse_prompt_logprobs,
)
from jax_drive.sampling.remote.transport import RetryPolicy, Transport, send, urllib_transport

__all__ = [  # the engine, and the names its callers catch or inspect
    "OpenAIEngine", "OpenAIEngineError", "RemoteMetadata", "ServerDialect", "UnsupportedParameterError",
]


class OpenAIEngine:
    """Generates with an OpenAI-compatible server (vLLM, llama.cpp, jax-drive serve, ...).

    Args:
      base_url: server root, e.g. 'http://localhost:8000' ('/v1' is appended if missing).
      model: served model name, or a LoRA adapter name; must be listed by /v1/models.
      api_key: sent as 'Authorization: Bearer ...' when given.
      tokenizer: local tokenizer of the served model. Needed for token-id prompts on
        text-only servers, to recover generated ids from text, for prompt ids of text
        prompts, and for ``generate_chat`` to template locally (then /v1/completions: the
        same prompt tokens as ``JaxEngine``). Without it ``generate_chat`` uses
        /v1/chat/completions.
      server: 'auto' (default: from /v1/models), 'vllm', 'llama.cpp', 'jax-drive', 'openai'.
      server_logprobs_mode: log-prob mode of a server that fixes it per process: vLLM's
        default ``--logprobs-mode raw_logprobs`` is 'raw' (default), ``processed_logprobs``
        is 'processed'. Requests asking another mode are refused.
      require_token_logprobs: every completion must carry the exact sampled ids and their
        log-probs (training): otherwise ``OpenAIEngineError``. Default False (metadata
        says what each completion has).
      timeout_s: per-request timeout (default 120 s).
      max_retries: retries after the first attempt for connection errors and HTTP
        429/502/503/504 (default 3), with exponential backoff ``backoff_s * 2**attempt``.
      max_concurrency: requests in flight at once (default 8); vLLM batches them,
        llama.cpp serves them one at a time.
      check_model: raise when ``model`` is not listed by the server (default True).
      transport: the HTTP function (default ``urllib_transport``).
      grammar_mode: how grammars are sent: 'exact' (default: the local automaton's language)
        or 'native' (the dialect's JSON / choice forms; see the module docstring).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        tokenizer=None,
        server: str = "auto",
        server_logprobs_mode: str = "raw",
        require_token_logprobs: bool = False,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_concurrency: int = 8,
        check_model: bool = True,
        transport: Transport | None = None,
        grammar_mode: str = "exact",
    ):
        if not model or not isinstance(model, str):
            raise ValueError("model must be a non-empty string (served model or LoRA name)")
        RetryPolicy(timeout_s, max_retries, backoff_s)  # validates them
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        if server != "auto" and server not in DIALECTS:
            raise ValueError(f"server must be 'auto' or one of {sorted(DIALECTS)}, got {server!r}")
        if grammar_mode not in ("exact", "native"):
            raise ValueError(f"grammar_mode must be 'exact' or 'native', got {grammar_mode!r}")
        if server_logprobs_mode not in ("raw", "processed"):
            raise ValueError(f"server_logprobs_mode must be 'raw' or 'processed', got {server_logprobs_mode!r}")
        self.base_url = normalize_base_url(base_url)
        self.model = model
        self.api_key = api_key
        self.tokenizer = tokenizer
        self.server = server
        self.server_logprobs_mode = server_logprobs_mode
        self.require_token_logprobs = bool(require_token_logprobs)
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_concurrency = int(max_concurrency)
        self.check_model = bool(check_model)
        self.transport = transport or urllib_transport
        self.grammar_mode = grammar_mode
        self._dialect: ServerDialect | None = None if server == "auto" else DIALECTS[server]
        self._models: list[str] | None = None
        self._pieces: TokenPieces | None = None

    # --------------------------------------------------------------------- HTTP
    def _headers(self) -> dict:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def request(self, method: str, path: str, payload: dict | None = None,
                expect_json: bool = True, root: bool = False) -> Any:
        """Sends one JSON request with retries (``remote.transport.send``); returns the decoded
        JSON answer (the text of a 2xx answer when ``expect_json`` is False: vLLM's LoRA
        endpoints answer text). ``path`` is under ``/v1``, or under the server root with
        ``root=True``.

        Raises:
          OpenAIEngineError: a non-retryable status (with the server's message), a read
            timeout, retries exhausted, or a non-JSON body.
        """
        base = self.base_url[: -len("/v1")] if root else self.base_url
        policy = RetryPolicy(self.timeout_s, self.max_retries, self.backoff_s)
        return send(self.transport, method, f"{base}/{path.lstrip('/')}", payload, self._headers(), policy,
                    expect_json)

    # ------------------------------------------------------------ capabilities
    def _fetch_models(self) -> Any:
        return self.request("GET", "models")

    def list_models(self) -> list[str]:
        """Names the server serves (base models and loaded LoRA adapters)."""
        data = self._fetch_models()
        try:
            names = [str(m["id"]) for m in data["data"]]
        except (KeyError, TypeError):
            raise OpenAIEngineError(f"GET models: malformed answer {str(data)[:200]}") from None
        if self._dialect is None:
            self._dialect = dialect_from_models(data)
        self._models = names
        return names

    @property
    def dialect(self) -> ServerDialect:
        """The server's dialect (probed with GET /v1/models on first use when 'auto')."""
        if self._dialect is None:
            self.list_models()
        assert self._dialect is not None
        return self._dialect

    def _require_model(self) -> None:
        if not self.check_model:
            return
        if self._models is None or self.model not in self._models:
            self.list_models()  # refresh once: an adapter may have been loaded since
        if self.model not in (self._models or []):
            raise OpenAIEngineError(
                f"model {self.model!r} is not served at {self.base_url} (served: {self._models})"
            )

    def _require_feature(self, available: bool, feature: str) -> None:
        if not available:
            raise UnsupportedParameterError(
                f"{feature} needs a vLLM (or jax-drive serve) server; this is {self.dialect.name}"
            )

    def _token_pieces(self) -> TokenPieces | None:
        if self.tokenizer is None:
            return None
        if self._pieces is None:
            self._pieces = TokenPieces(self.tokenizer)
        return self._pieces

    def _eos_ids(self) -> tuple[int, ...] | None:
        if self.tokenizer is None:
            return None
        return tuple(int(i) for i in getattr(self.tokenizer, "eos_token_ids", ()) or ())

    # ---------------------------------------------------------------- utilities
    def load_lora_adapter(self, name: str, path: str, replace: bool = False) -> None:
        """Loads a PEFT LoRA adapter directory (visible to the server) under ``name``.

        ``replace=True`` swaps the weights of an adapter already loaded under that name
        (vLLM's ``load_inplace``; servers without it: unload, then load). vLLM needs
        ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``.
        """
        self._require_feature(self.dialect.lora_endpoints, "runtime LoRA loading")
        body = {"lora_name": name, "lora_path": str(path)}
        if replace:
            body["load_inplace"] = True
        try:
            self.request("POST", "load_lora_adapter", body, expect_json=False)
        except OpenAIEngineError as error:
            if error.status == 404:
                raise UnsupportedParameterError(
                    f"{self.base_url} has no /load_lora_adapter (vLLM: set "
                    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora)", 404
                ) from None
            if not (replace and error.status == 400 and "already" in str(error).lower()):
                raise
            self.unload_lora_adapter(name)  # a server without load_inplace
            self.request("POST", "load_lora_adapter", {"lora_name": name, "lora_path": str(path)},
                         expect_json=False)
        self._models = None

    def unload_lora_adapter(self, name: str) -> None:
        self._require_feature(self.dialect.lora_endpoints, "runtime LoRA loading")
        self.request("POST", "unload_lora_adapter", {"lora_name": name}, expect_json=False)
        self._models = None

    def update_weights_from_disk(self, path: str) -> None:
        """Has the server reload its base model's weights from an HF directory it can read
        (config.json + safetensors, e.g. ``jax_drive.models.export.save_safetensors``):
        ``POST /update_weights_from_disk`` (SGLang's endpoint; ``jax-drive serve`` only here:
        vLLM updates full weights over NCCL, not from disk over HTTP)."""
        if self.dialect.name != "jax-drive":
            raise UnsupportedParameterError(
                f"reloading full weights needs jax-drive serve (POST /update_weights_from_disk); "
                f"this is {self.dialect.name}")
        self.request("POST", "update_weights_from_disk", {"model_path": str(path)}, root=True)

    def with_model(self, model: str) -> "OpenAIEngine":
        """The same server and settings, another model / adapter name."""
        clone = object.__new__(OpenAIEngine)
        clone.__dict__.update(self.__dict__)
        clone.model = model
        return clone

    def prompt_logprobs(self, prompts: Sequence[Sequence[int]]) -> list[list[float]]:
        """log pi(token_i | tokens_<i) for i >= 1 of each token-id prompt (vLLM only)."""
        self._require_feature(self.dialect.prompt_logprobs, "prompt_logprobs")
        self._require_model()
        prompts = [[int(t) for t in p] for p in validate_prompts(prompts)]

        def run(prompt):
            body = build_prompt_logprobs_request(prompt, self.model)
            return parse_prompt_logprobs(self.request("POST", "completions", body), prompt)

        return self._map(run, prompts)

    # --------------------------------------------------------------- interface
    def _prepare(self, params: SamplingParams, endpoint: str = "completions") -> ServerDialect:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        dialect = self.dialect
        check_sampling_params(params, dialect, self.server_logprobs_mode, self._eos_ids())
        grammars = params.grammar if isinstance(params.grammar, tuple) else (params.grammar,)
        for grammar in {g for g in grammars if g is not None}:
            grammar_fields(grammar, dialect, endpoint, self.exact_grammars)  # refused before sending
        if self.require_token_logprobs and not dialect.returns_token_ids and self.tokenizer is None:
            raise UnsupportedParameterError(
                f"require_token_logprobs on a {dialect.name} server needs the local tokenizer "
                "to map the returned token texts to ids"
            )
        self._require_model()
        return dialect

    @property
    def exact_grammars(self) -> bool:
        return self.grammar_mode == "exact"

    def _logprobs_mode(self, params: SamplingParams, dialect: ServerDialect) -> str:
        if dialect.logprobs_per_request or logprobs_equivalent(params):
            return params.logprobs_mode
        return self.server_logprobs_mode

    def _checked(self, completions: list[Completion]) -> list[Completion]:
        mismatched = [c for c in completions if c.metadata.prompt_tokens_match is False]
        if self.require_token_logprobs:
            bad = [c.metadata for c in completions if not c.metadata.exact]
            if bad:
                m = bad[0]
                raise OpenAIEngineError(
                    f"{len(bad)} of {len(completions)} completions lack exact token ids / "
                    f"log-probs (e.g. ids from {m.token_ids_source!r}, log-probs from "
                    f"{m.logprobs_source!r}, prompt tokens match: {m.prompt_tokens_match}); "
                    "training needs them (require_token_logprobs=True)"
                )
        elif mismatched:
            warnings.warn(
                f"{len(mismatched)} prompts were tokenized differently by the server than by "
                "the local tokenizer (Completion.metadata.prompt_tokens_match is False)",
                RuntimeWarning, stacklevel=3,
            )
        return completions

    def generate(
        self, prompts: Sequence[Prompt], params: SamplingParams, key: jax.Array
    ) -> list[Completion]:
        """Completes each prompt ``params.n`` times via /v1/completions; see ``Engine``.

        One request per completion row, each with its own seed (``row_seeds``).
        """
        prompts = validate_prompts(prompts)
        dialect = self._prepare(params)
        tokens_in = not isinstance(prompts[0], str)
        local_ids: list[list[int] | None]
        if tokens_in:
            local_ids = [[int(t) for t in p] for p in prompts]
        elif self.tokenizer is not None:
            local_ids = [list(self.tokenizer.encode(p)) for p in prompts]
        else:
            local_ids = [None] * len(prompts)
        send_ids = tokens_in and dialect.token_id_prompts
        if tokens_in and not send_ids:
            if self.tokenizer is None:
                raise UnsupportedParameterError(
                    f"the {dialect.name} server takes text prompts only: pass a tokenizer to "
                    "decode token-id prompts"
                )
            wire: list[Prompt] = [
                self.tokenizer.decode(ids, skip_special_tokens=False) for ids in local_ids
            ]
        else:
            wire = list(prompts)
        pieces = None if dialect.returns_token_ids else self._token_pieces()
        rows = [p for p in range(len(prompts)) for _ in range(params.n)]
        seeds = row_seeds(key, len(rows))
        mode = self._logprobs_mode(params, dialect)
        grammars = params.row_grammars(len(prompts))

        def run(i: int) -> Completion:
            p = rows[i]
            body = build_completion_request(wire[p], params, self.model, seeds[i], dialect, grammars[p],
                                            self.exact_grammars)
            answer = self.request("POST", "completions", body)
            return parse_completion_choice(
                answer, chat=False, dialect=dialect, logprobs_mode=mode,
                prompt_ids=local_ids[p], sent_token_ids=send_ids, tokenizer=self.tokenizer,
                pieces=pieces, seed=seeds[i],
            )

        return self._checked(self._map(run, range(len(rows))))

    def generate_chat(
        self, conversations: Sequence[Sequence[Message]], params: SamplingParams, key: jax.Array
    ) -> list[Completion]:
        """Chat completions; see the class docstring for local vs server-side templating."""
        conversations = validate_conversations(conversations)
        if self.tokenizer is not None:
            prompts = [
                self.tokenizer.apply_chat_template(c, add_generation_prompt=True)
                for c in conversations
            ]
            return self.generate(prompts, params, key)
        dialect = self._prepare(params, "chat")
        rows = [c for c in range(len(conversations)) for _ in range(params.n)]
        seeds = row_seeds(key, len(rows))
        mode = self._logprobs_mode(params, dialect)
        grammars = params.row_grammars(len(conversations))

        def run(i: int) -> Completion:
            body = build_chat_request(conversations[rows[i]], params, self.model, seeds[i], dialect,
                                      grammars[rows[i]], self.exact_grammars)
            return parse_completion_choice(
                self.request("POST", "chat/completions", body), chat=True, dialect=dialect,
                logprobs_mode=mode, prompt_ids=None, sent_token_ids=False, seed=seeds[i],
            )

        return self._checked(self._map(run, range(len(rows))))

    def _map(self, fn, items) -> list:
        items = list(items)
        if len(items) == 1 or self.max_concurrency == 1:
            return [fn(item) for item in items]
        with concurrent.futures.ThreadPoolExecutor(min(self.max_concurrency, len(items))) as pool:
            return list(pool.map(fn, items))
