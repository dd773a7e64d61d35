"""``--set PATH=VALUE`` and ``--preset-file F.json``: change any field of a preset from the
command line (:mod:`jax_drive.configs`), the same way in every entry point."""

from __future__ import annotations

import argparse

from jax_drive.runinfo import InputError


def add_override_args(parser: argparse.ArgumentParser) -> None:
    """Adds ``--set`` (repeatable) and ``--preset-file``."""
    parser.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", dest="overrides",
                        help="change a preset field by its dotted path, e.g. --set rl.optim.learning_rate=5e-5 "
                             "(repeatable; applied after --preset-file)")
    parser.add_argument("--preset-file", default=None, metavar="F.json",
                        help="a JSON object of preset field paths (or nested objects) and values")


def preset_with_overrides(preset, args: argparse.Namespace):
    """``preset`` with ``--preset-file`` then every ``--set`` applied.

    Raises:
      InputError naming the flag and the field (unknown field, bad value, a value the
      preset's own checks refuse, an unreadable file).
    """
    from jax_drive.configs import OverrideError, load_overrides, override, parse_assignments

    if args.preset_file is not None:
        try:
            changes = load_overrides(args.preset_file)
        except (OSError, ValueError) as error:
            raise InputError(f"--preset-file {args.preset_file}: {error}") from None
        try:
            preset = override(preset, changes)
        except OverrideError as error:
            raise InputError(f"--preset-file {args.preset_file}: {error}") from None
    try:
        changes = parse_assignments(args.overrides)
        return override(preset, changes)
    except OverrideError as error:
        raise InputError(f"--set {error}") from None
