"""`jax-drive convert SOURCE OUT`: GGUF / safetensors -> HF safetensors + config.json."""

from __future__ import annotations

import argparse
from pathlib import Path

from jax_drive.runinfo import InputError, output_dir


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="convert a GGUF file or HF safetensors directory to an HF safetensors checkpoint",
    )
    parser.add_argument("source", help="HF directory, .gguf file or 'smollm2-135m-instruct'")
    parser.add_argument("out", type=output_dir, help="output directory (created)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--lora", default=None,
                        help="optional PEFT adapter directory to merge into the weights")
    parser.add_argument("--force", action="store_true", help="write into a non-empty directory")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)  # a directory or nothing yet (checked while parsing)
    if out.exists() and any(out.iterdir()) and not args.force:
        raise InputError(f"{out} exists and is not empty (use --force)")
    from jax_drive.cli.loading import load_model
    from jax_drive.models.export import save_safetensors

    model, config, tokenizer = load_model(args.source, args.dtype, args.lora)
    save_safetensors(model, out, tokenizer=tokenizer)
    print(f"wrote {config.architecture} model ({config.num_layers} layers, {args.dtype}) to {out}")
    return 0
