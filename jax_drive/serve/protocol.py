"""Request models and answer builders of ``jax-drive serve`` (OpenAI completions API plus
vLLM's extra fields). Pure: no HTTP, no model.

Every field a request may carry is declared; unknown fields and values the policy cannot
honour (penalties, ``min_p``, ``logit_bias``, ``echo``, ``best_of`` != ``n``, ``logprobs`` > 1)
are rejected with a 400 rather than ignored. Log-probs cover the sampled token only:
``top_logprobs`` is always null. ``stream=true`` answers with server-sent events (``streaming``).

Structured answers, on both endpoints: OpenAI's ``response_format`` (``{"type":
"json_schema", "json_schema": {"name", "schema", ...}}``; ``{"type": "json_object"}`` only
with a ``schema``, llama.cpp's form, as an unbounded JSON value is refused) and vLLM's
``structured_outputs`` (exactly one of ``regex``, ``json``, ``choice``). JSON answers are
written with ``json.dumps``' separators (``", "``, ``": "``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from jax_drive.sampling.engine import Completion
from jax_drive.sampling.grammar.formats import JSON_SEPARATORS
from jax_drive.sampling.grammar.regex import GrammarError
from jax_drive.sampling.grammar.spec import Grammar
from jax_drive.sampling.params import SamplingParams
from jax_drive.serve.errors import InvalidRequest, error_body  # noqa: F401 - re-exported

TokenIds = list[int]


def validation_message(errors: Sequence[dict]) -> str:
    """One line from pydantic's (or FastAPI's) validation errors: 'field.path: message; ...'
    (the offending input values are left out)."""
    parts = []
    for e in errors:
        where = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        parts.append(f"{where}: {e.get('msg')}" if where else str(e.get("msg")))
    return "; ".join(parts) or "invalid request"


class JsonSchemaSpec(BaseModel):
    """OpenAI's ``response_format.json_schema``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = "answer"
    description: Optional[str] = None
    schema_: Optional[dict] = Field(default=None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format`` (and llama.cpp's ``json_object`` + ``schema``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaSpec] = None
    schema_: Optional[dict] = Field(default=None, alias="schema")

    def schema(self) -> dict | None:
        """The JSON schema the answer must follow, or None for free text."""
        if self.type == "text":
            return None
        if self.type == "json_schema":
            if self.json_schema is None or self.json_schema.schema_ is None:
                raise InvalidRequest("response_format json_schema needs json_schema.schema", "response_format")
            return self.json_schema.schema_
        if self.schema_ is None:
            raise InvalidRequest("response_format json_object without a schema is an unbounded JSON value, which "
                                 "this server does not constrain: give {\"type\": \"json_schema\", \"json_schema\": "
                                 "{\"name\": ..., \"schema\": ...}}", "response_format")
        return self.schema_


class StructuredOutputs(BaseModel):
    """vLLM's ``structured_outputs`` (one constraint)."""

    model_config = ConfigDict(extra="forbid")

    regex: Optional[str] = None
    json_: Optional[Union[dict, str]] = Field(default=None, alias="json")
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None

    def to_grammar(self) -> Grammar:
        given = [name for name in ("regex", "json_", "choice", "grammar", "json_object")
                 if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise InvalidRequest("structured_outputs needs exactly one of regex, json, choice", "structured_outputs")
        if self.grammar is not None:
            raise InvalidRequest("structured_outputs.grammar (EBNF / GBNF) is not supported: use regex, json or "
                                 "choice", "structured_outputs")
        if self.json_object:
            raise InvalidRequest("structured_outputs.json_object is an unbounded JSON value, which this server does "
                                 "not constrain: give a json schema", "structured_outputs")
        if self.regex is not None:
            return Grammar.regex(self.regex)
        if self.choice is not None:
            return Grammar.choice(self.choice)
        return Grammar.json_schema(self.json_, JSON_SEPARATORS)


class StreamOptions(BaseModel):
    """``stream_options`` (OpenAI's): ``include_usage`` adds a last chunk with the usage."""

    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False


class _Sampling(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(extra="forbid")

    model: str
    max_tokens: Optional[int] = Field(default=None, ge=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)
    min_p: float = 0.0
    n: int = Field(default=1, ge=1)  # the server's --max-request-rows bounds prompts x n
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Optional[dict[str, float]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None
    skip_special_tokens: bool = True
    logprobs_mode: Literal["raw", "processed"] = "raw"
    return_token_ids: bool = True
    return_tokens_as_token_ids: bool = False
    response_format: Optional[ResponseFormat] = None
    structured_outputs: Optional[StructuredOutputs] = None

    @model_validator(mode="after")
    def _neutral_only(self):
        if self.min_p != 0.0:
            raise ValueError("min_p is not supported (only 0)")
        if self.presence_penalty != 0.0 or self.frequency_penalty != 0.0:
            raise ValueError("presence_penalty / frequency_penalty are not supported (only 0)")
        if self.repetition_penalty != 1.0:
            raise ValueError("repetition_penalty is not supported (only 1)")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream=true")
        return self

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        if any(not s for s in stops):
            raise InvalidRequest("stop strings must be non-empty", "stop")
        return stops

    def stop_ids(self, eos_ids: Sequence[int]) -> tuple[int, ...] | None:
        """vLLM's meaning: ``stop_token_ids`` stop in addition to the model's EOS unless
        ``ignore_eos``; None = the EOS ids (the engine's default)."""
        if self.stop_token_ids is None and not self.ignore_eos:
            return None
        extra = tuple(int(i) for i in self.stop_token_ids or ())
        base = () if self.ignore_eos else tuple(int(i) for i in eos_ids)
        return tuple(dict.fromkeys(base + extra))

    def grammar(self) -> Grammar | None:
        """The grammar every answer must follow (None: free text). Raises InvalidRequest (400)
        naming what is wrong: both fields given, an invalid regex or schema, unsupported
        features, an unbounded JSON value."""
        fields = [name for name in ("response_format", "structured_outputs") if getattr(self, name) is not None]
        if len(fields) > 1:
            raise InvalidRequest("give response_format or structured_outputs, not both", fields[1])
        try:
            if self.structured_outputs is not None:
                return self.structured_outputs.to_grammar()
            schema = None if self.response_format is None else self.response_format.schema()
            return None if schema is None else Grammar.json_schema(schema, JSON_SEPARATORS)
        except GrammarError as error:
            raise InvalidRequest(f"{fields[0]}: {error}", fields[0], code="invalid_grammar") from None

    def sampling_params(self, default_max_tokens: int, eos_ids: Sequence[int]) -> SamplingParams:
        """The request as SamplingParams with n = 1 (rows are expanded by the caller)."""
        max_tokens = self.max_completion_tokens or self.max_tokens or default_max_tokens
        grammar = self.grammar()
        try:
            return SamplingParams(
                max_new_tokens=int(max_tokens),
                temperature=float(self.temperature),
                top_p=float(self.top_p),
                top_k=max(0, int(self.top_k)),
                stop_token_ids=self.stop_ids(eos_ids),
                min_new_tokens=int(self.min_tokens),
                n=1,
                logprobs_mode=self.logprobs_mode,
                skip_special_tokens=bool(self.skip_special_tokens),
                grammar=grammar,
            )
        except ValueError as error:
            raise InvalidRequest(str(error)) from None


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: Union[str, list[str], TokenIds, list[TokenIds]]
    logprobs: Optional[int] = Field(default=None, ge=0)
    echo: bool = False
    best_of: Optional[int] = None
    suffix: Optional[str] = None

    @model_validator(mode="after")
    def _supported(self):
        if self.logprobs is not None and self.logprobs > 1:
            raise ValueError("logprobs > 1 is not supported: only the sampled token's log-prob "
                             "is computed")
        if self.echo:
            raise ValueError("echo=true is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of other than n is not supported")
        if self.suffix:
            raise ValueError("suffix is not supported")
        return self

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, value):
        if isinstance(value, str) or (isinstance(value, list) and value and isinstance(value[0], int)):
            items = [value]
        else:
            items = list(value)
        if not items or any(len(p) == 0 for p in items):
            raise ValueError("prompt must hold at least one non-empty prompt")
        return value

    def prompt_list(self) -> list[Union[str, list[int]]]:
        """The prompts as a list (text or token ids each)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and isinstance(p[0], int):
            return [list(p)]
        return [x if isinstance(x, str) else list(x) for x in p]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str
    name: Optional[str] = None


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _supported(self):
        if self.top_logprobs:
            raise ValueError("top_logprobs > 0 is not supported: only the sampled token's "
                             "log-prob is computed")
        return self


class LoadLoRARequest(BaseModel):
    """POST /v1/load_lora_adapter (vLLM's body)."""

    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)
    load_inplace: bool = False


class UnloadLoRARequest(BaseModel):
    """POST /v1/unload_lora_adapter (vLLM's body)."""

    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(min_length=1)
    lora_int_id: Optional[int] = None


class UpdateWeightsRequest(BaseModel):
    """POST /update_weights_from_disk (SGLang's body): reload the base weights from an HF
    directory (config.json + safetensors) on the server's file system."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model_path: str = Field(min_length=1)


# ---------------------------------------------------------------------------- answers
def first_stop(text: str, stops: Sequence[str]) -> tuple[int, int] | None:
    """(start, end) of the stop string that ``text`` completes first (the smallest end, then
    the earliest start), or None: where generation would have stopped token by token, as
    OpenAI and vLLM stop, so a streamed answer cuts where the whole answer does."""
    hits = [(start + len(s), start) for s in stops if s and (start := text.find(s)) >= 0]
    if not hits:
        return None
    end, start = min(hits)
    return start, end


def tokens_through(ids: Sequence[int], end: int, text: str, decode) -> int:
    """The fewest leading ``ids`` whose text covers ``text[:end]`` (``text`` = decode(ids)).

    By bisection over prefix lengths (O(log n) decodes): a prefix's text is a prefix of the
    next one's, except for a trailing partial character, which the comparison rejects.
    """
    low, high = 1, len(ids)  # the answer lies in [low, high]: all the ids cover the text
    while low < high:
        mid = (low + high) // 2
        if decode(ids[:mid])[:end] == text[:end]:
            high = mid
        else:
            low = mid + 1
    return low


def truncate_at_stop(
    completion: Completion, stops: Sequence[str], decode
) -> tuple[tuple[int, ...], tuple[float, ...], str, str]:
    """Cuts a completion at its first stop string (OpenAI / vLLM semantics, ``first_stop``).

    Args:
      completion: the generated completion.
      stops: stop strings (may be empty).
      decode: ids -> text (special tokens skipped as requested).
    Returns:
      (ids, logprobs, text, finish_reason): ids up to the token that completes the stop
      string, the text before that string, finish 'stop'; unchanged without a match.
    """
    text = completion.text
    hit = first_stop(text, stops)
    if hit is None:
        return completion.token_ids, completion.logprobs, text, completion.finish_reason
    start, end = hit
    keep = tokens_through(completion.token_ids, end, text, decode)
    return completion.token_ids[:keep], completion.logprobs[:keep], text[:start], "stop"


def token_strings(ids: Sequence[int], decode_one, as_ids: bool) -> list[str]:
    """Per-token strings of a logprobs answer: 'token_id:N' or each token's own text."""
    if as_ids:
        return [f"token_id:{int(i)}" for i in ids]
    return [decode_one(int(i)) for i in ids]


def completion_logprobs(tokens: list[str], logprobs, offset: int = 0) -> dict:
    """A completions ``logprobs`` object; ``text_offset`` counts the token strings' lengths
    from ``offset`` (a streamed choice continues from its previous chunk)."""
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    return {"tokens": tokens, "token_logprobs": [float(x) for x in logprobs], "top_logprobs": None,
            "text_offset": offsets}


def chat_logprobs(tokens: list[str], logprobs) -> dict:
    """A chat ``logprobs`` object (``content``: one entry per token)."""
    return {"content": [
        {"token": t, "logprob": float(x), "bytes": list(t.encode("utf-8")), "top_logprobs": []}
        for t, x in zip(tokens, logprobs)
    ]}


def completion_choice(index: int, ids, logprobs, text: str, finish: str, prompt_ids,
                      tokens: list[str] | None) -> dict:
    """One choice of a /v1/completions answer (``tokens`` None: no log-probs asked)."""
    return {
        "index": index,
        "text": text,
        "logprobs": None if tokens is None else completion_logprobs(tokens, logprobs),
        "finish_reason": finish,
        "token_ids": [int(i) for i in ids],
        "prompt_token_ids": [int(i) for i in prompt_ids],
    }


def chat_choice(index: int, ids, logprobs, text: str, finish: str,
                tokens: list[str] | None) -> dict:
    """One choice of a /v1/chat/completions answer."""
    return {
        "index": index,
        "message": {"role": "assistant", "content": text},
        "logprobs": None if tokens is None else chat_logprobs(tokens, logprobs),
        "finish_reason": finish,
        "token_ids": [int(i) for i in ids],
    }


def response_id(kind: str) -> str:
    """A new answer id: 'cmpl-...' for completions, 'chatcmpl-...' for chat."""
    return f"{'cmpl' if kind == 'text_completion' else 'chatcmpl'}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": int(prompt_tokens), "completion_tokens": int(completion_tokens),
            "total_tokens": int(prompt_tokens + completion_tokens)}


def answer(kind: Literal["text_completion", "chat.completion"], model: str, choices: list[dict],
           prompt_tokens: int, completion_tokens: int, **extra) -> dict:
    """The full answer object with id, timestamps and usage."""
    body = {
        "id": response_id(kind),
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(prompt_tokens, completion_tokens),
    }
    body.update(extra)
    return body
