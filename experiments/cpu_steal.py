"""Re-exports :mod:`jax_drive.cpu_steal` for ``experiments/bench_pdm.py``, which imports it as
a sibling script; delete this file once that import reads ``from jax_drive.cpu_steal``."""

from jax_drive.cpu_steal import cpu_times, screened, steal_share  # noqa: F401
