"""`jax-drive chat`: talk to a local Flax language model (default: SmolLM2-135M-Instruct)."""

from __future__ import annotations

import argparse
import sys
import time

from jax_drive.runinfo import InputError, add_output_args, finite_float, require_min, run_metadata, write_json


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "chat",
        help="chat with a local Flax language model",
        description="One-shot with --prompt (optionally written to --json), otherwise an interactive "
        "loop (empty line or /quit ends it, /reset clears the history).",
    )
    parser.add_argument("--model", default="smollm2-135m-instruct",
                        help="HF directory, .gguf file or 'smollm2-135m-instruct' (default)")
    parser.add_argument("--prompt", default=None, help="one user message; print the reply and exit")
    parser.add_argument("--system", default=None, help="optional system message")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=finite_float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=finite_float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--lora", default=None,
                        help="optional PEFT adapter directory (adapter_config.json + "
                        "adapter_model.safetensors) to apply")
    add_output_args(parser, progress=False)  # --json: the one-shot reply (needs --prompt)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    require_min(1, max_new_tokens=args.max_new_tokens)
    if args.json and args.prompt is None:
        raise InputError("--json writes a one-shot reply: it needs --prompt")
    import jax

    from jax_drive.cli.loading import load_model
    from jax_drive.sampling import JaxEngine, SamplingParams

    try:  # checked before the model loads
        params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                top_p=args.top_p, top_k=args.top_k)
    except ValueError as error:
        raise InputError(str(error)) from None
    model, _, tokenizer = load_model(args.model, args.dtype, args.lora)
    engine = JaxEngine(model, tokenizer)
    key = jax.random.key(args.seed)
    history: list[dict] = []
    if args.system:
        history.append({"role": "system", "content": args.system})

    def reply(text: str) -> dict:
        nonlocal key
        key, sub = jax.random.split(key)
        history.append({"role": "user", "content": text})
        start = time.perf_counter()
        completion = engine.generate_chat([history], params, sub)[0]
        elapsed = time.perf_counter() - start
        answer = completion.text.strip()
        history.append({"role": "assistant", "content": answer})
        print(f"[{completion.num_tokens} tokens, {elapsed:.1f} s]", file=sys.stderr)
        return {"reply": answer, "num_tokens": completion.num_tokens,
                "finish_reason": completion.finish_reason, "seconds": elapsed}

    if args.prompt is not None:
        answer = reply(args.prompt)
        print(answer["reply"])
        if args.json:
            write_json(args.json, {
                "meta": run_metadata(command="chat"),
                "model": args.model, "lora": args.lora, "dtype": args.dtype, "seed": args.seed,
                "sampling": {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                             "top_p": args.top_p, "top_k": args.top_k},
                "messages": history, **answer})
        return 0
    print("chat: empty line or /quit to exit, /reset to clear the history", file=sys.stderr)
    while True:
        try:
            line = input("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if not line or line == "/quit":
            return 0
        if line == "/reset":
            del history[1 if args.system else 0:]
            continue
        print(f"model> {reply(line)['reply']}")
