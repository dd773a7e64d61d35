"""Optional adapter: NAVSIM metric caches -> jax-drive scenes.

NAVSIM (``navsim``) and the nuPlan devkit (``nuplan``) are NOT dependencies: users install
them from their own sources (https://github.com/autonomousvision/navsim, v1.1 or v2.x).
With both importable, :func:`load_metric_cache` reads a metric cache folder (as written by
NAVSIM's ``run_metric_caching.py``) straight into a :class:`~jax_drive.scenes.io.SceneFile`.
Without them, export inside the NAVSIM environment with
``jax_drive/adapters/navsim_export.py`` (numpy + shapely + NAVSIM only) and load the
file with :func:`jax_drive.scenes.io.load_scenes`; both paths share the conversion in
``navsim_export.record_from_metric_cache``.
"""

from __future__ import annotations

from pathlib import Path

from jax_drive.adapters import navsim_export
from jax_drive.scenes.io import SceneFile, load_scenes

INSTALL_HINT = (
    "jax_drive.adapters.navsim needs NAVSIM and the nuPlan devkit, installed from their own "
    "sources (https://github.com/autonomousvision/navsim, v1.1 or v2.x, and its nuplan-devkit). "
    "Without them, run jax_drive/adapters/navsim_export.py inside a NAVSIM environment and load "
    "the written file with jax_drive.scenes.io.load_scenes."
)


def require_navsim() -> None:
    """Raises ImportError with :data:`INSTALL_HINT` unless navsim and nuplan are importable."""
    try:
        import navsim  # noqa: F401
        import nuplan  # noqa: F401
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from None


def load_metric_cache(cache_dir: str | Path, tokens=None, max_scenes: int | None = None,
                      progress: bool = True) -> SceneFile:
    """Scenes of a NAVSIM metric cache folder (all, or ``tokens``, at most ``max_scenes``)."""
    require_navsim()
    records = [r for _, r in navsim_export.metric_cache_records(cache_dir, tokens, max_scenes, progress)]
    return load_scenes(records)
