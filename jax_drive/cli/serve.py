"""`jax-drive serve`: serve a Flax policy over an OpenAI-compatible HTTP API."""

from __future__ import annotations

import argparse
import sys

from jax_drive.runinfo import InputError, require_min


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server over a local Flax policy",
        description="Serves /v1/models, /v1/completions, /v1/chat/completions and vLLM's "
        "/v1/load_lora_adapter, /v1/unload_lora_adapter. Concurrent requests are batched "
        "into one sampler call.",
    )
    parser.add_argument("--model", default="smollm2-135m-instruct",
                        help="HF directory, .gguf file or 'smollm2-135m-instruct' (default)")
    parser.add_argument("--served-model-name", default=None,
                        help="name clients pass as `model` (default: --model)")
    parser.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                        help="PEFT adapter to serve as NAME from the start (repeatable)")
    parser.add_argument("--max-loras", type=int, default=4, help="adapters held at once")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default loopback)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--max-batch-rows", type=int, default=32,
                        help="completion rows per sampler call (default 32)")
    parser.add_argument("--max-wait-ms", type=float, default=10.0,
                        help="how long a request waits for companions to batch with (default 10)")
    parser.add_argument("--default-max-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0, help="seeds requests that carry none")
    parser.add_argument("--log-level", default="warning")
    parser.set_defaults(func=run)


def _parse_loras(specs: list[str]) -> list[tuple[str, str]]:
    out = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--lora takes NAME=PATH, got {spec!r}")
        out.append((name, path))
    return out


def run(args: argparse.Namespace) -> int:
    require_min(1, port=args.port, max_batch_rows=args.max_batch_rows, default_max_tokens=args.default_max_tokens)
    require_min(0, max_loras=args.max_loras, max_wait_ms=args.max_wait_ms)
    if args.port > 65535:
        raise InputError(f"--port must be <= 65535, got {args.port}")
    loras = _parse_loras(args.lora)
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ModuleNotFoundError as error:
        raise InputError(f"jax-drive serve needs {error.name} (pip install -r requirements.txt)") from None
    from jax_drive.models import load_pretrained
    from jax_drive.serve import BatcherConfig, PolicyRegistry, PolicyServer, ServeConfig
    from jax_drive.serve import run as serve_forever
    from jax_drive.serve.protocol import InvalidRequest

    config = ServeConfig(batcher=BatcherConfig(args.max_batch_rows, args.max_wait_ms / 1000.0),
                         default_max_tokens=args.default_max_tokens, seed=args.seed)
    try:
        model, _, tokenizer = load_pretrained(args.model, dtype=args.dtype)
        registry = PolicyRegistry(model, tokenizer, args.served_model_name or args.model,
                                  max_loras=args.max_loras)
        for name, path in loras:
            registry.load_adapter(name, path)
    except (FileNotFoundError, ValueError, InvalidRequest) as error:
        raise InputError(str(error)) from None
    names = ", ".join(registry.names())
    print(f"jax-drive serve: {names} on http://{args.host}:{args.port}/v1", file=sys.stderr)
    serve_forever(PolicyServer(registry, config), args.host, args.port, args.log_level)
    return 0
