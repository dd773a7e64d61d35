"""The shared statistics: mean / standard error and the paired bootstrap interval."""

import numpy as np
import pytest

from jax_drive.stats import mean_sem, paired_bootstrap


def test_mean_sem():
    assert mean_sem([1.0, 2.0, 3.0]) == pytest.approx({"mean": 2.0, "sem": 1.0 / np.sqrt(3)})
    assert mean_sem([5.0]) == {"mean": 5.0, "sem": 0.0}
    with pytest.raises(ValueError, match="no values"):
        mean_sem([])


def test_paired_bootstrap_on_cases_with_known_intervals():
    constant = paired_bootstrap([[0.2, 0.2, 0.2], [0.2, 0.2, 0.2]])
    assert constant["mean"] == pytest.approx(0.2) and constant["ci95"] == pytest.approx([0.2, 0.2])
    assert (constant["units"], constant["training_seeds"]) == (3, 2)
    # units 0 and 1 (seed means): resampled means 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4
    two = paired_bootstrap([[0.0, 2.0], [0.0, 0.0]])
    assert two["mean"] == pytest.approx(0.5) and two["ci95"] == pytest.approx([0.0, 1.0])
    assert paired_bootstrap([[0.0, 2.0], [0.0, 0.0]]) == two  # seeded: the same draws


def test_the_hierarchical_bootstrap_resamples_seeds_too():
    # seeds (0.3, -0.1) and (0.1, 0.1): outcomes -0.1 and 0.3 each have probability 1/16
    diffs = [[0.3, -0.1], [0.1, 0.1]]
    both = paired_bootstrap(diffs, resample_seeds=True)
    assert both["mean"] == pytest.approx(0.1) and both["ci95"] == pytest.approx([-0.1, 0.3])
    assert both["interval"].startswith("hierarchical")
    assert paired_bootstrap(diffs)["ci95"] == pytest.approx([0.0, 0.2])  # seeds kept: per-scene means 0.2, 0.0
    one_seed = [[0.1, 0.3]]  # a single seed: only the units vary
    assert paired_bootstrap(one_seed, resample_seeds=True)["ci95"] == pytest.approx([0.1, 0.3])


def test_paired_bootstrap_refuses_shapes_without_units():
    for bad in ([1.0, 2.0], [[]]):
        with pytest.raises(ValueError, match="seeds, units"):
            paired_bootstrap(bad)
