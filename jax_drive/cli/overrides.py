"""``--set PATH=VALUE`` and ``--preset-file F.json``: change any field of a preset from the
command line (:mod:`jax_drive.configs`), the same way in every entry point."""

from __future__ import annotations

import argparse
import math

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
      preset's own checks refuse, a number that is NaN or infinite, an unreadable file).
    """
    from jax_drive.configs import OverrideError, load_overrides, override, parse_assignments

    if args.preset_file is not None:
        try:
            changes = load_overrides(args.preset_file)
        except (OSError, ValueError) as error:
            raise InputError(f"--preset-file {args.preset_file}: {error}") from None
        try:
            preset = _finite(override(preset, changes), changes)
        except OverrideError as error:
            raise InputError(f"--preset-file {args.preset_file}: {error}") from None
    try:
        changes = parse_assignments(args.overrides)
        return _finite(override(preset, changes), changes)
    except OverrideError as error:
        raise InputError(f"--set {error}") from None


def _finite(config, changes: dict):
    """``config``, after checking that no changed field holds a NaN or an infinite number
    (``float`` reads "nan" and "inf", JSON preset files may hold NaN / Infinity)."""
    from jax_drive.configs import OverrideError

    for path, text in changes.items():
        value = config
        for name in path.split("."):
            value = getattr(value, name)
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, float) and not math.isfinite(item):
                raise OverrideError(f"{path}={text}: must be a finite number")
    return config
