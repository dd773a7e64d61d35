"""The `jax-drive` console script.

Each sub-command lives in its own module of this package and exposes
``register(subparsers)``, which adds its parser and sets ``func`` on it. The modules are
imported by name so a broken optional dependency of one command never breaks the others;
they import only argparse-level things at module level (heavy imports happen when a command
runs), so building this parser stays cheap. Exit codes follow :mod:`jax_drive.runinfo`:
0 done, 2 bad usage or input, 1 a failure while running.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from jax_drive.runinfo import invoked, run_main

# sub-command name -> module under jax_drive.cli that registers it
COMMAND_MODULES = {
    "score": "score",  # PDM scoring of planners on generated scenes (foundation)
    "data": "data",  # dataset builders (language interface)
    "chat": "chat",  # talk to a local model (Flax policy)
    "convert": "convert",  # GGUF / safetensors -> safetensors
    "train": "train",  # SFT + mtGRPO (training stack)
    "sim": "sim",  # multi-agent cooperative simulator
    "serve": "serve",  # OpenAI-compatible HTTP server over a Flax policy
    "coop": "coop",  # talking language agents (TalkingVehicles / CoopReflect)
    "coop-rl": "coop_rl",  # talking language agents trained by RL
    "scale-out": "scale_out",  # Ray scenario workers, CARLA server pools
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jax-drive", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, module_name in COMMAND_MODULES.items():
        try:
            module = importlib.import_module(f"jax_drive.cli.{module_name}")
        except ModuleNotFoundError as error:
            if error.name != f"jax_drive.cli.{module_name}":
                raise
            continue  # command not built yet
        module.register(subparsers)
    return parser


def _dispatch(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    with invoked("jax-drive", argv):  # results files record the whole command line
        return int(args.func(args) or 0)


def main(argv: list[str] | None = None) -> int:
    """Runs one command; :class:`jax_drive.runinfo.InputError` becomes a message and exit code 2."""
    return run_main(_dispatch, argv)


if __name__ == "__main__":
    sys.exit(main())
