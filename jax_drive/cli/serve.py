"""`jax-drive serve`: serve a Flax policy over an OpenAI-compatible HTTP API.

Deployment checks happen before the model loads: a non-loopback ``--host`` is refused
without an API key unless ``--allow-unauthenticated`` (and always warned about), the
admin directories must exist and need a key, and the port is bound first, so a port in use
exits 1 with the reason before anything is loaded or a URL is printed.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from jax_drive.runinfo import InputError, require_min
from jax_drive.serve.limits import DEFAULT_MAX_QUEUED_ROWS, ServeLimits  # standard library only
from jax_drive.serve.security import API_KEY_ENV, is_loopback

_DEFAULTS = ServeLimits()


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server over a local Flax policy",
        description="Serves /v1/models, /v1/completions, /v1/chat/completions (stream=true: "
        "server-sent events) and vLLM's /v1/load_lora_adapter, /v1/unload_lora_adapter (plus "
        "/update_weights_from_disk). Concurrent requests are batched into one sampler call. Limits: 0 turns one off. "
        "See docs/serving.md.",
    )
    parser.add_argument("--model", default="smollm2-135m-instruct",
                        help="HF directory, .gguf file or 'smollm2-135m-instruct' (default)")
    parser.add_argument("--served-model-name", default=None,
                        help="name clients pass as `model` (default: --model)")
    parser.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                        help="PEFT adapter to serve as NAME from the start (repeatable)")
    parser.add_argument("--max-loras", type=int, default=4, help="adapters held at once")
    parser.add_argument("--host", default="127.0.0.1",
                        help="listen address (default loopback; any other needs --api-key or "
                        "--allow-unauthenticated)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--max-batch-rows", type=int, default=32,
                        help="completion rows per sampler call (default 32)")
    parser.add_argument("--max-wait-ms", type=float, default=10.0,
                        help="how long a request waits for companions to batch with (default 10)")
    parser.add_argument("--decode-chunk-steps", type=int, default=16,
                        help="decode steps between two looks at a running batch: streamed tokens go "
                        "out and disconnected clients' rows are dropped at these points (default 16; "
                        "a batch with a streamed request runs its first step alone)")
    parser.add_argument("--default-max-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0, help="seeds requests that carry none")
    parser.add_argument("--log-level", default="warning",
                        choices=("critical", "error", "warning", "info", "debug", "trace"))
    access = parser.add_argument_group("access (docs/serving.md)")
    access.add_argument("--api-key", default=None,
                        help=f"every request but GET /health must send 'Authorization: Bearer KEY' "
                        f"(default: ${API_KEY_ENV}, else none; the environment keeps it out of `ps`)")
    access.add_argument("--allowed-weights-dir", action="append", default=[], metavar="DIR",
                        help="the admin endpoints (load_lora_adapter, update_weights_from_disk) "
                        "load only from inside these directories (repeatable; needs --api-key; "
                        "default: none, loads refused)")
    access.add_argument("--allow-unauthenticated", action="store_true",
                        help="serve on a non-loopback --host without an API key")
    limits = parser.add_argument_group("limits per request (0 = off)")
    limits.add_argument("--max-body-bytes", type=int, default=_DEFAULTS.max_body_bytes,
                        help=f"request body size, else 413 (default {_DEFAULTS.max_body_bytes})")
    limits.add_argument("--max-request-rows", type=int, default=_DEFAULTS.max_request_rows,
                        help=f"prompts x n, else 400 (default {_DEFAULTS.max_request_rows})")
    limits.add_argument("--max-prompt-tokens", type=int, default=_DEFAULTS.max_prompt_tokens,
                        help="prompt tokens x n (usage.prompt_tokens), else 400 "
                        f"(default {_DEFAULTS.max_prompt_tokens})")
    limits.add_argument("--max-tokens-limit", type=int, default=_DEFAULTS.max_tokens,
                        help=f"largest max_tokens a request may ask, else 400 (default {_DEFAULTS.max_tokens})")
    limits.add_argument("--request-timeout", type=float, default=_DEFAULTS.request_timeout_s,
                        help="seconds from arrival to answer, else 408 and the request's queued rows "
                        f"are dropped (default {_DEFAULTS.request_timeout_s:g})")
    limits.add_argument("--max-queued-rows", type=int, default=DEFAULT_MAX_QUEUED_ROWS,
                        help="rows waiting for a batch; a request that would exceed it gets 429 "
                        f"(default {DEFAULT_MAX_QUEUED_ROWS})")
    parser.set_defaults(func=run)


def _parse_loras(specs: list[str]) -> list[tuple[str, str]]:
    out = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--lora takes NAME=PATH, got {spec!r}")
        out.append((name, path))
    return out


def _off_if_zero(value):
    return None if value == 0 else value


def _api_key(args: argparse.Namespace) -> str | None:
    if args.api_key is not None:
        if not args.api_key.strip():
            raise InputError("--api-key must be non-empty")
        return args.api_key
    return os.environ.get(API_KEY_ENV) or None


def check_deployment(args: argparse.Namespace, api_key: str | None) -> list[str]:
    """Refuses unsafe combinations (``InputError`` naming the flag); returns the warnings."""
    if args.allowed_weights_dir and api_key is None:
        raise InputError(f"--allowed-weights-dir enables loading from disk, which needs an API key: "
                         f"give --api-key (or set {API_KEY_ENV})")
    for d in args.allowed_weights_dir:
        if not os.path.isdir(d):
            raise InputError(f"--allowed-weights-dir {d!r} is not a directory")
    if is_loopback(args.host):
        return []
    if api_key is None and not args.allow_unauthenticated:
        raise InputError(f"--host {args.host} accepts connections from other machines: give --api-key "
                         f"(or set {API_KEY_ENV}), or --allow-unauthenticated to serve without one")
    warnings = [f"--host {args.host} accepts connections from other machines; traffic is plain HTTP "
                "(put a TLS proxy in front)"]
    if api_key is None:
        warnings.append("no API key (--allow-unauthenticated): anyone who reaches this port can generate")
    return warnings


def run(args: argparse.Namespace) -> int:
    for flag in ("max_wait_ms", "request_timeout"):
        if not math.isfinite(getattr(args, flag)):
            raise InputError(f"--{flag.replace('_', '-')} must be a finite number, got {getattr(args, flag)}")
    require_min(1, port=args.port, max_batch_rows=args.max_batch_rows, default_max_tokens=args.default_max_tokens,
                decode_chunk_steps=args.decode_chunk_steps)
    require_min(0, max_loras=args.max_loras, max_wait_ms=args.max_wait_ms, max_body_bytes=args.max_body_bytes,
                max_request_rows=args.max_request_rows, max_prompt_tokens=args.max_prompt_tokens,
                max_tokens_limit=args.max_tokens_limit, request_timeout=args.request_timeout,
                max_queued_rows=args.max_queued_rows)
    limits = ServeLimits(max_body_bytes=_off_if_zero(args.max_body_bytes),
                         max_request_rows=_off_if_zero(args.max_request_rows),
                         max_prompt_tokens=_off_if_zero(args.max_prompt_tokens),
                         max_tokens=_off_if_zero(args.max_tokens_limit),
                         request_timeout_s=_off_if_zero(args.request_timeout))
    try:
        limits.check_settings(_off_if_zero(args.max_queued_rows), args.default_max_tokens)
    except ValueError as error:
        raise InputError(str(error)) from None
    if args.port > 65535:
        raise InputError(f"--port must be <= 65535, got {args.port}")
    loras = _parse_loras(args.lora)
    if args.served_model_name is not None and not args.served_model_name.strip():
        raise InputError("--served-model-name must be non-empty")
    if len(loras) > args.max_loras:
        raise InputError(f"{len(loras)} --lora adapters exceed --max-loras {args.max_loras}")
    api_key = _api_key(args)
    warnings = check_deployment(args, api_key)
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ModuleNotFoundError as error:
        raise InputError(f"jax-drive serve needs {error.name} (pip install -r requirements.txt)") from None
    from jax_drive.serve import BatcherConfig, PolicyRegistry, PolicyServer, ServeConfig, bind_socket
    from jax_drive.serve import run as serve_forever
    from jax_drive.serve.errors import InvalidRequest

    batcher = BatcherConfig(args.max_batch_rows, args.max_wait_ms / 1000.0, _off_if_zero(args.max_queued_rows),
                            chunk_steps=args.decode_chunk_steps)
    config = ServeConfig(batcher=batcher, limits=limits, default_max_tokens=args.default_max_tokens,
                         seed=args.seed, api_key=api_key, allowed_weights_dirs=tuple(args.allowed_weights_dir))
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as error:
        print(f"error: cannot listen on {args.host}:{args.port}: {error.strerror or error}", file=sys.stderr)
        return 1
    try:
        from jax_drive.models import load_pretrained

        try:
            model, _, tokenizer = load_pretrained(args.model, dtype=args.dtype)
        except (FileNotFoundError, ValueError) as error:
            raise InputError(f"--model {args.model}: {error}") from None
        registry = PolicyRegistry(model, tokenizer, args.served_model_name or args.model, max_loras=args.max_loras)
        for name, path in loras:
            try:
                registry.load_adapter(name, path)
            except InvalidRequest as error:
                raise InputError(f"--lora {name}={path}: {error}") from None
        import logging

        logging.basicConfig(level=args.log_level.upper() if args.log_level != "trace" else "DEBUG",
                            format="%(levelname)s %(name)s: %(message)s")
        names = ", ".join(registry.names())
        print(f"jax-drive serve: {names} on http://{args.host}:{args.port}/v1", file=sys.stderr)
        serve_forever(PolicyServer(registry, config), args.host, args.port, args.log_level, sock=sock)
    finally:
        sock.close()
    return 0
