"""Who may call ``jax-drive serve`` and what its admin endpoints may read. Pure: no HTTP
framework, no model.

- The API key (vLLM's and llama.cpp's ``--api-key``): every request but ``GET /health``
  carries ``Authorization: Bearer KEY``; compared in constant time.
- ``--host``: whether an address is loopback (reachable from this machine only).
- Load paths of the admin endpoints are confined to the directories given at start
  (``--allowed-weights-dir``). Whether a path is allowed is decided first from the path
  text alone (``..`` folded, made absolute), so a path outside every allowed directory is
  refused with the same answer whether or not it exists; only inside an allowed directory
  are symlinks resolved (a link that leads out is refused too).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

API_KEY_ENV = "JAX_DRIVE_API_KEY"  # read by `jax-drive serve` and by the trainer's client
PUBLIC_PATHS = frozenset({"/health"})  # answered without the API key (load balancers, probes)


def bearer_matches(header: str | None, key: str) -> bool:
    """True when an ``Authorization`` header value is ``Bearer <key>``.

    The token is compared with ``hmac.compare_digest`` (time independent of where it
    differs); the scheme is case-insensitive as in RFC 7235.
    """
    if not header or not key:
        return False
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.strip().encode("utf-8"), key.encode("utf-8"))


def is_loopback(host: str) -> bool:
    """True for 'localhost' and loopback IP addresses (127.0.0.0/8, ::1); False for any other
    name or address, 0.0.0.0 and :: included (those listen on every interface)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


class AllowedDirs:
    """The directories the admin endpoints may load from.

    Args:
      dirs: existing directories (checked here; the CLI reports a bad one as a usage error).
    Raises:
      ValueError: a directory that does not exist or is not a directory.
    """

    def __init__(self, dirs: Iterable[str | os.PathLike] = ()):
        lexical, real = [], []
        for d in dirs:
            if not Path(d).is_dir():
                raise ValueError(f"{str(d)!r} is not a directory")
            lexical.append(Path(os.path.normpath(os.path.abspath(d))))
            real.append(Path(os.path.realpath(d)))
        self.lexical: tuple[Path, ...] = tuple(lexical)
        self.real: tuple[Path, ...] = tuple(real)

    def __bool__(self) -> bool:
        return bool(self.real)

    def confine(self, path: str) -> Path | None:
        """``path`` resolved when it lies inside an allowed directory, else None.

        Args:
          path: the client's path (absolute, or relative to the server's working directory).
        Returns:
          the resolved path, or None when it is outside every allowed directory, textually
          (decided without touching the file system) or after resolving symlinks.
        """
        if not path or "\x00" in path:
            return None
        lexical = Path(os.path.normpath(os.path.abspath(path)))
        if not _inside(lexical, self.lexical + self.real):
            return None
        resolved = Path(os.path.realpath(lexical))
        return resolved if _inside(resolved, self.real) else None


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)
