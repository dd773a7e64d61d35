"""Summary statistics the experiments share: mean and standard error, and the paired
difference of two policies with a percentile-bootstrap interval.

A paired comparison has a (training seeds, units) matrix of differences, one unit per
held-out item both policies saw (an episode, a scene). The bootstrap resamples units, and
optionally the training seeds first (hierarchical), so that an effect carried by one seed
shows as uncertain.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BOOTSTRAP_SAMPLES = 10_000


def mean_sem(values: Sequence[float]) -> dict:
    """{"mean", "sem"} (standard error with the n - 1 convention; 0 for a single value)."""
    v = np.asarray(values, np.float64)
    if v.size == 0:
        raise ValueError("mean_sem of no values")
    sem = float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0
    return {"mean": float(v.mean()), "sem": sem}


def paired_bootstrap(diffs, seed: int = 0, samples: int = BOOTSTRAP_SAMPLES, resample_seeds: bool = False) -> dict:
    """Mean of a (training seeds, units) difference matrix and its 95 % percentile bootstrap
    interval.

    ``resample_seeds`` False: units are resampled and every training seed kept in each
    resample (each unit's mean over seeds). True (hierarchical): training seeds are
    resampled too, then units, so an effect that one seed carries cannot look certain; use
    it when the seeds' policies differ (each seed trains its own).

    Returns {"mean", "ci95": [lo, hi], "units", "training_seeds", "interval"}.
    """
    diffs = np.asarray(diffs, np.float64)
    if diffs.ndim != 2 or diffs.shape[1] == 0:
        raise ValueError(f"diffs must be (seeds, units) with at least one unit, got shape {diffs.shape}")
    n_seeds, n_units = diffs.shape
    rng = np.random.default_rng(seed)
    if resample_seeds:
        seeds = rng.integers(0, n_seeds, size=(samples, n_seeds))
        units = rng.integers(0, n_units, size=(samples, n_units))
        # (samples, seeds, units) would be large: average the drawn seeds' rows first
        rows = diffs[seeds].mean(axis=1)  # (samples, units)
        boot = np.take_along_axis(rows, units, axis=1).mean(axis=1)
        how = "hierarchical percentile bootstrap (training seeds, then units)"
    else:
        per_unit = diffs.mean(axis=0)
        boot = per_unit[rng.integers(0, n_units, size=(samples, n_units))].mean(axis=1)
        how = "percentile bootstrap over units"
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"mean": float(diffs.mean()), "ci95": [float(lo), float(hi)], "units": int(n_units),
            "training_seeds": int(n_seeds), "interval": f"{how}, {samples} resamples"}
