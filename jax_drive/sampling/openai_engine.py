"""``OpenAIEngine``: the ``Engine`` interface over an OpenAI-compatible HTTP server (vLLM).

Requests go to ``{base_url}/v1/completions`` (prompts as text or token ids, many per
request) with per-token log-probs. With ``vllm_extensions=True`` (default) the request also
carries vLLM's extra fields: ``top_k``, ``min_tokens``, ``stop_token_ids`` + ``ignore_eos``,
``skip_special_tokens``, ``return_tokens_as_token_ids`` and ``return_token_ids`` (vLLM >=
0.10.2), so that completions come back with exact token ids. A LoRA adapter served by vLLM
(``--lora-modules name=path`` or ``load_lora_adapter``) is selected by passing its name as
``model``.

Log-probs are whatever the server reports for the sampled token: vLLM's default
(``--logprobs-mode raw_logprobs``) is the raw model distribution, matching our ``"raw"`` mode;
``SamplingParams.logprobs_mode`` cannot be changed per request.

The pure functions ``build_completion_request`` / ``parse_completion_response`` (and the chat
twins) hold all the protocol logic; ``OpenAIEngine`` adds HTTP, timeouts and retries.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
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

# (method, url, body or None, headers, timeout_s) -> (HTTP status, response body bytes)
Transport = Callable[[str, str, "bytes | None", dict, float], "tuple[int, bytes]"]

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
_TOKEN_ID_RE = re.compile(r"^token_id:(\d+)$")


class OpenAIEngineError(RuntimeError):
    """A request to the OpenAI-compatible server failed or its answer was malformed."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


# ------------------------------------------------------------------------ protocol (pure)
def normalize_base_url(base_url: str) -> str:
    """'http://host:8000', 'http://host:8000/' or 'http://host:8000/v1' -> 'http://host:8000/v1'."""
    if not isinstance(base_url, str) or not re.match(r"^https?://[^/]+", base_url):
        raise ValueError(f"base_url must look like http://host:port, got {base_url!r}")
    url = base_url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def seed_from_key(key: jax.Array) -> int:
    """A non-negative 31-bit integer seed derived from a JAX PRNG key."""
    return int(jax.random.randint(key, (), 0, 2**31 - 1))


def _sampling_fields(params: SamplingParams, seed: int | None, vllm_extensions: bool) -> dict:
    body: dict[str, Any] = {
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "n": params.n,
    }
    if seed is not None:
        body["seed"] = int(seed)
    if vllm_extensions:
        if params.top_k > 0:
            body["top_k"] = params.top_k
        if params.min_new_tokens > 0:
            body["min_tokens"] = params.min_new_tokens
        if params.stop_token_ids is not None:
            # exactly these ids stop generation (the model's own EOS only if listed)
            body["stop_token_ids"] = list(params.stop_token_ids)
            body["ignore_eos"] = True
        body["skip_special_tokens"] = params.skip_special_tokens
        body["return_tokens_as_token_ids"] = True
        body["return_token_ids"] = True
    return body


def build_completion_request(
    prompts: Sequence[Prompt],
    params: SamplingParams,
    model: str,
    seed: int | None = None,
    vllm_extensions: bool = True,
) -> dict:
    """JSON body of a POST /v1/completions for a batch of prompts (text or token ids)."""
    prompts = validate_prompts(prompts)
    prompt_field: Any = (
        list(prompts) if isinstance(prompts[0], str) else [[int(t) for t in p] for p in prompts]
    )
    body = {"model": model, "prompt": prompt_field, "logprobs": 1}
    body.update(_sampling_fields(params, seed, vllm_extensions))
    return body


def build_chat_request(
    messages: Sequence[Message],
    params: SamplingParams,
    model: str,
    seed: int | None = None,
    vllm_extensions: bool = True,
) -> dict:
    """JSON body of a POST /v1/chat/completions for one conversation."""
    body = {
        "model": model,
        "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
        "logprobs": True,
    }
    body.update(_sampling_fields(params, seed, vllm_extensions))
    return body


def _token_id(token: Any) -> int | None:
    if isinstance(token, str):
        m = _TOKEN_ID_RE.match(token)
        if m:
            return int(m.group(1))
    return None


def _finish_reason(value: Any, where: str) -> str:
    if value in ("stop", "length"):
        return value
    raise OpenAIEngineError(f"{where}: unexpected finish_reason {value!r}")


def _choices(response: Any, expected: int, where: str) -> list[dict]:
    if not isinstance(response, dict):
        raise OpenAIEngineError(f"{where}: response is not a JSON object")
    if "error" in response and "choices" not in response:
        raise OpenAIEngineError(f"{where}: server error: {response['error']}")
    choices = response.get("choices")
    if not isinstance(choices, list) or len(choices) != expected:
        got = len(choices) if isinstance(choices, list) else type(choices).__name__
        raise OpenAIEngineError(f"{where}: expected {expected} choices, got {got}")
    try:
        return sorted(choices, key=lambda c: int(c.get("index", 0)))
    except (TypeError, ValueError, AttributeError):
        raise OpenAIEngineError(f"{where}: malformed choices") from None


def _ids_and_logprobs(
    choice: dict, tokens: Sequence[Any], token_logprobs: Sequence[Any], where: str
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Token ids (from ``token_ids`` or 'token_id:N' strings) and their log-probs."""
    logprobs = tuple(float("nan") if x is None else float(x) for x in token_logprobs)
    ids = choice.get("token_ids")
    if ids is None:
        parsed = [_token_id(t) for t in tokens]
        ids = parsed if tokens and all(i is not None for i in parsed) else None
    if ids is None:
        return (), ()  # the server reported no token ids: nothing to align the log-probs with
    ids = tuple(int(i) for i in ids)
    if logprobs and len(logprobs) != len(ids):
        raise OpenAIEngineError(
            f"{where}: {len(ids)} token ids but {len(logprobs)} log-probs"
        )
    if not logprobs:
        logprobs = tuple(float("nan") for _ in ids)
    return ids, logprobs


def parse_completion_response(
    response: dict,
    num_prompts: int,
    n: int,
    prompt_token_ids: Sequence[Sequence[int]] | None = None,
) -> list[Completion]:
    """Completions from a /v1/completions JSON answer, ordered prompt-major.

    Args:
      response: the decoded JSON body.
      num_prompts, n: the request's prompt count and samples per prompt.
      prompt_token_ids: the prompts' ids when known locally (else taken from the answer's
        ``prompt_token_ids`` if present, else empty).
    Raises:
      OpenAIEngineError: wrong number of choices, malformed fields, unknown finish reason.
    """
    where = "completions"
    choices = _choices(response, num_prompts * n, where)
    out = []
    for i, choice in enumerate(choices):
        if not isinstance(choice, dict):
            raise OpenAIEngineError(f"{where}: choice {i} is not an object")
        lp = choice.get("logprobs") or {}
        ids, logprobs = _ids_and_logprobs(
            choice, lp.get("tokens") or [], lp.get("token_logprobs") or [], where
        )
        if prompt_token_ids is not None:
            pids = tuple(int(t) for t in prompt_token_ids[i // n])
        else:
            pids = tuple(int(t) for t in (choice.get("prompt_token_ids") or ()))
        out.append(
            Completion(
                prompt_token_ids=pids,
                token_ids=ids,
                text=str(choice.get("text") or ""),
                logprobs=logprobs,
                finish_reason=_finish_reason(choice.get("finish_reason"), where),
            )
        )
    return out


def parse_chat_response(response: dict, n: int) -> list[Completion]:
    """Completions from a /v1/chat/completions JSON answer for one conversation."""
    where = "chat/completions"
    choices = _choices(response, n, where)
    out = []
    for choice in choices:
        message = choice.get("message") or {}
        content = (choice.get("logprobs") or {}).get("content") or []
        ids, logprobs = _ids_and_logprobs(
            choice, [c.get("token") for c in content], [c.get("logprob") for c in content], where
        )
        out.append(
            Completion(
                prompt_token_ids=tuple(int(t) for t in (choice.get("prompt_token_ids") or response.get("prompt_token_ids") or ())),
                token_ids=ids,
                text=str(message.get("content") or ""),
                logprobs=logprobs,
                finish_reason=_finish_reason(choice.get("finish_reason"), where),
            )
        )
    return out


# ---------------------------------------------------------------------------- transport
def urllib_transport(
    method: str, url: str, body: bytes | None, headers: dict, timeout_s: float
) -> tuple[int, bytes]:
    """Sends one HTTP request with the standard library; returns (status, body).

    HTTP error statuses are returned, not raised; network failures raise OSError.
    """
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read() or b""


def _error_message(body: bytes) -> str:
    try:
        data = json.loads(body)
        err = data.get("error", data) if isinstance(data, dict) else data
        if isinstance(err, dict):
            return str(err.get("message") or err)
        return str(err)
    except (ValueError, UnicodeDecodeError):
        return body[:500].decode("utf-8", "replace")


# ------------------------------------------------------------------------------ engine
class OpenAIEngine:
    """Generates with an OpenAI-compatible server (vLLM or others).

    Args:
      base_url: server root, e.g. 'http://localhost:8000' ('/v1' is appended if missing).
      model: served model name, or a LoRA adapter name registered with vLLM.
      api_key: sent as 'Authorization: Bearer ...' when given.
      tokenizer: optional local tokenizer; when given, string prompts' ids are computed
        locally (if the server does not return them) and ``generate_chat`` applies the chat
        template locally and uses /v1/completions (exact same prompt tokens as JaxEngine).
        Without it, ``generate_chat`` uses /v1/chat/completions.
      timeout_s: per-request timeout (default 120 s).
      max_retries: retries after the first attempt for network errors and HTTP
        408/409/429/5xx (default 3), with exponential backoff ``backoff_s * 2**attempt``.
      max_prompts_per_request: prompts per /v1/completions request (default 64).
      max_concurrency: requests in flight at once (default 4); vLLM batches them.
      vllm_extensions: send vLLM's extra request fields (default True); switch off for
        servers that reject unknown fields (top_k/min_tokens/stop ids are then not sent).
      transport: the HTTP function (default ``urllib_transport``).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        tokenizer=None,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_prompts_per_request: int = 64,
        max_concurrency: int = 4,
        vllm_extensions: bool = True,
        transport: Transport | None = None,
    ):
        if not model or not isinstance(model, str):
            raise ValueError("model must be a non-empty string (served model or LoRA name)")
        if timeout_s <= 0 or max_retries < 0 or backoff_s < 0:
            raise ValueError("timeout_s must be > 0, max_retries and backoff_s >= 0")
        if max_prompts_per_request < 1 or max_concurrency < 1:
            raise ValueError("max_prompts_per_request and max_concurrency must be >= 1")
        self.base_url = normalize_base_url(base_url)
        self.model = model
        self.api_key = api_key
        self.tokenizer = tokenizer
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_prompts_per_request = int(max_prompts_per_request)
        self.max_concurrency = int(max_concurrency)
        self.vllm_extensions = bool(vllm_extensions)
        self.transport = transport or urllib_transport

    # --------------------------------------------------------------------- HTTP
    def _headers(self) -> dict:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def request(self, method: str, path: str, payload: dict | None = None) -> Any:
        """Sends one JSON request with retries; returns the decoded JSON answer.

        Raises:
          OpenAIEngineError: non-retryable HTTP status, retries exhausted, or a non-JSON body.
        """
        url = f"{self.base_url}/{path.lstrip('/')}"
        body = None if payload is None else json.dumps(payload).encode("utf-8")
        last = ""
        status: int | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                status, raw = self.transport(method, url, body, self._headers(), self.timeout_s)
            except (OSError, TimeoutError) as error:  # URLError, ConnectionError, socket timeout
                status, last = None, f"{type(error).__name__}: {error}"
                continue
            if 200 <= status < 300:
                try:
                    return json.loads(raw) if raw else {}
                except ValueError:
                    raise OpenAIEngineError(
                        f"{method} {url}: answer is not JSON: {raw[:200]!r}", status
                    ) from None
            last = f"HTTP {status}: {_error_message(raw)}"
            if status not in RETRY_STATUSES:
                raise OpenAIEngineError(f"{method} {url} failed: {last}", status)
        raise OpenAIEngineError(
            f"{method} {url} failed after {self.max_retries + 1} attempts: {last}", status
        )

    # ---------------------------------------------------------------- utilities
    def list_models(self) -> list[str]:
        """Names the server serves (base models and loaded LoRA adapters)."""
        data = self.request("GET", "models")
        try:
            return [str(m["id"]) for m in data["data"]]
        except (KeyError, TypeError):
            raise OpenAIEngineError(f"GET models: malformed answer {str(data)[:200]}") from None

    def load_lora_adapter(self, name: str, path: str) -> None:
        """Loads (or replaces) a LoRA adapter on a vLLM server started with
        VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; ``path`` is a PEFT dir visible to the server."""
        self.request("POST", "load_lora_adapter", {"lora_name": name, "lora_path": path})

    def unload_lora_adapter(self, name: str) -> None:
        self.request("POST", "unload_lora_adapter", {"lora_name": name})

    def with_model(self, model: str) -> "OpenAIEngine":
        """The same server and settings, another model / adapter name."""
        clone = object.__new__(OpenAIEngine)
        clone.__dict__.update(self.__dict__)
        clone.model = model
        return clone

    # --------------------------------------------------------------- interface
    def generate(
        self, prompts: Sequence[Prompt], params: SamplingParams, key: jax.Array
    ) -> list[Completion]:
        """Completes each prompt ``params.n`` times via /v1/completions; see ``Engine``."""
        prompts = validate_prompts(prompts)
        local_ids: list[list[int]] | None
        if isinstance(prompts[0], str):
            local_ids = (
                [list(self.tokenizer.encode(p)) for p in prompts] if self.tokenizer else None
            )
        else:
            local_ids = [[int(t) for t in p] for p in prompts]
        step = self.max_prompts_per_request
        chunks = [(s, prompts[s : s + step]) for s in range(0, len(prompts), step)]

        def run(index_chunk):
            c, (start, part) = index_chunk
            seed = seed_from_key(jax.random.fold_in(key, c))
            body = build_completion_request(part, params, self.model, seed, self.vllm_extensions)
            answer = self.request("POST", "completions", body)
            ids = None if local_ids is None else local_ids[start : start + len(part)]
            return parse_completion_response(answer, len(part), params.n, ids)

        return self._run_all(run, list(enumerate(chunks)))

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

        def run(index_conv):
            c, conv = index_conv
            seed = seed_from_key(jax.random.fold_in(key, c))
            body = build_chat_request(conv, params, self.model, seed, self.vllm_extensions)
            return parse_chat_response(self.request("POST", "chat/completions", body), params.n)

        return self._run_all(run, list(enumerate(conversations)))

    def _run_all(self, fn, items: list) -> list[Completion]:
        if len(items) == 1 or self.max_concurrency == 1:
            results = [fn(item) for item in items]
        else:
            with concurrent.futures.ThreadPoolExecutor(self.max_concurrency) as pool:
                results = list(pool.map(fn, items))
        return [c for part in results for c in part]
