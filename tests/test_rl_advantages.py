"""Advantages: GRPO (sequence reward), mtGRPO intra-group and cross-turn, vs numpy loops."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jax_drive.rl.advantages import AdvantageConfig, compute_advantages_jit, token_advantages
from jax_drive.rollout import RolloutConfig
from jax_drive.rollout.reward import turn_rewards


def _np_norm(values, ddof=1, eps=1e-6):
    values = np.asarray(values, np.float64)
    if len(values) < 2 or values.max() == values.min():
        return np.zeros_like(values)
    return (values - values.mean()) / (values.std(ddof=ddof) + eps)


def _np_reference(rewards, mask, mode, ddof=1, eps=1e-6):
    """Direct loops over prompts / rollouts / turns."""
    p_, g_, n_ = rewards.shape
    out = np.zeros_like(rewards, np.float64)
    for p in range(p_):
        if mode == "grpo":
            seqs, idx = [], []
            for i in range(g_):
                turns = [rewards[p, i, j] for j in range(n_) if mask[p, i, j]]
                if turns:
                    seqs.append(np.mean(turns))
                    idx.append(i)
            adv = _np_norm(seqs, ddof, eps)
            for a, i in zip(adv, idx):
                out[p, i, mask[p, i]] = a
        elif mode == "mtgrpo_intra":
            for j in range(n_):
                idx = [i for i in range(g_) if mask[p, i, j]]
                adv = _np_norm([rewards[p, i, j] for i in idx], ddof, eps)
                for a, i in zip(adv, idx):
                    out[p, i, j] = a
        else:
            idx = [(i, j) for i in range(g_) for j in range(n_) if mask[p, i, j]]
            adv = _np_norm([rewards[p, i, j] for i, j in idx], ddof, eps)
            for a, (i, j) in zip(adv, idx):
                out[p, i, j] = a
    return out


def _ragged_mask(rng, p, g, n):
    lengths = rng.integers(0, n + 1, size=(p, g))
    return np.arange(n)[None, None, :] < lengths[..., None]


@pytest.mark.parametrize("mode", ["grpo", "mtgrpo_intra", "mtgrpo_cross"])
@pytest.mark.parametrize("unbiased", [True, False])
def test_matches_numpy_loops(mode, unbiased):
    rng = np.random.default_rng(0)
    rewards = rng.uniform(0, 1, size=(3, 8, 6)).astype(np.float32)
    mask = _ragged_mask(rng, 3, 8, 6)
    cfg = AdvantageConfig(mode=mode, unbiased_std=unbiased)
    got = np.asarray(compute_advantages_jit(rewards, mask, cfg))
    want = _np_reference(rewards, mask, mode, ddof=1 if unbiased else 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert got.shape == (3, 8, 6)
    assert np.all(got[~mask] == 0.0)


@settings(max_examples=25)
@given(
    st.integers(1, 2), st.integers(1, 5), st.integers(1, 3),
    st.sampled_from(["grpo", "mtgrpo_intra", "mtgrpo_cross"]), st.integers(0, 10_000),
)
def test_property_matches_reference(p, g, n, mode, seed):
    rng = np.random.default_rng(seed)
    # coarse rewards so ties (zero-variance groups) happen often
    rewards = rng.integers(0, 3, size=(p, g, n)).astype(np.float32) / 2.0
    mask = _ragged_mask(rng, p, g, n)
    got = np.asarray(compute_advantages_jit(rewards, mask, AdvantageConfig(mode=mode)))
    want = _np_reference(rewards, mask, mode)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_zero_variance_group_gives_zero():
    rewards = np.full((1, 4, 3), 0.7, np.float32)
    rewards[0, :, 2] = 0.1  # cross-turn group now has variance; intra turn 0 and 1 do not
    mask = np.ones((1, 4, 3), bool)
    intra = np.asarray(compute_advantages_jit(rewards, mask, AdvantageConfig(mode="mtgrpo_intra")))
    assert np.all(intra == 0.0)
    cross = np.asarray(compute_advantages_jit(rewards, mask, AdvantageConfig(mode="mtgrpo_cross")))
    assert np.all(cross[..., :2] > 0) and np.all(cross[..., 2] < 0)
    seq = np.asarray(compute_advantages_jit(rewards, mask, AdvantageConfig(mode="grpo")))
    assert np.all(seq == 0.0)  # every rollout has the same sequence reward


def test_early_stop_turns_are_masked_and_singletons():
    # rollout 0 stops after turn 1 (score 1.0); rollouts 1..3 go on to turn 2; only rollout 3 reaches turn 3.
    rewards = np.array([[[1.0, 0, 0], [0.2, 0.6, 0], [0.2, 0.8, 0], [0.2, 0.4, 0.9]]], np.float32)
    mask = np.array([[[1, 0, 0], [1, 1, 0], [1, 1, 0], [1, 1, 1]]], bool)
    intra = np.asarray(compute_advantages_jit(rewards, mask, AdvantageConfig(mode="mtgrpo_intra")))
    # turn 2 (index 1) normalised only over rollouts 1..3: mean 0.6, std 0.2
    np.testing.assert_allclose(intra[0, 1:, 1], [0.0, 1.0, -1.0], atol=1e-4)
    # turn 3 reached by one rollout: no peers -> 0 (default) ...
    assert intra[0, 3, 2] == 0.0
    # ... or the raw reward under veRL's size-1 convention (mean 0, std 1)
    raw = np.asarray(compute_advantages_jit(rewards, mask, AdvantageConfig(mode="mtgrpo_intra", singleton="raw")))
    np.testing.assert_allclose(raw[0, 3, 2], 0.9, atol=1e-5)
    # missing turns stay 0 even with a nonzero reward written there
    rewards2 = rewards.copy()
    rewards2[~mask] = 123.0
    for mode in ("grpo", "mtgrpo_intra", "mtgrpo_cross"):
        a = np.asarray(compute_advantages_jit(rewards, mask, AdvantageConfig(mode=mode)))
        b = np.asarray(compute_advantages_jit(rewards2, mask, AdvantageConfig(mode=mode)))
        np.testing.assert_array_equal(a, b)
        assert np.all(a[~mask] == 0)


def test_grpo_broadcasts_sequence_advantage_to_all_turns():
    rewards = np.array([[[1.0, 0.0], [0.5, 0.5], [0.0, 0.0]]], np.float32)
    mask = np.array([[[1, 1], [1, 1], [1, 0]]], bool)
    adv = np.asarray(compute_advantages_jit(rewards, mask, AdvantageConfig(mode="grpo")))
    # sequence rewards 0.5, 0.5, 0.0
    assert adv[0, 0, 0] == adv[0, 0, 1] == adv[0, 1, 0] == adv[0, 1, 1] > 0
    assert adv[0, 2, 0] < 0 and adv[0, 2, 1] == 0


def test_mean_only_and_epsilon():
    rewards = np.array([[[0.0], [1.0]]], np.float32)
    mask = np.ones_like(rewards, bool)
    centred = np.asarray(compute_advantages_jit(rewards, mask, AdvantageConfig(mode="mtgrpo_intra", scale_by_std=False)))
    np.testing.assert_allclose(centred[0, :, 0], [-0.5, 0.5], atol=1e-6)
    big_eps = np.asarray(compute_advantages_jit(rewards, mask, AdvantageConfig(mode="mtgrpo_intra", epsilon=1.0)))
    std = np.std([0.0, 1.0], ddof=1)
    np.testing.assert_allclose(big_eps[0, :, 0], np.array([-0.5, 0.5]) / (std + 1.0), atol=1e-6)


def test_turn_rewards_and_token_broadcast():
    pdms = np.array([[0.5, 1.0, 0.3]], np.float32)
    fmt = np.array([[1.0, 0.0, 1.0]], np.float32)
    mask = np.array([[True, True, False]])
    r = np.asarray(turn_rewards(pdms, fmt, mask))
    np.testing.assert_allclose(r, [[0.6, 0.8, 0.0]], atol=1e-6)
    adv = np.array([[1.0, -2.0, 3.0], [0.5, 0.0, 0.0]], np.float32)
    ids = np.array([[-1, 0, 0, -1, 1, 1, 2], [-1, -1, 0, -1, -1, -1, -1]], np.int32)
    tok = np.asarray(token_advantages(adv, ids))
    np.testing.assert_array_equal(tok, [[0, 1, 1, 0, -2, -2, 3], [0, 0, 0.5, 0, 0, 0, 0]])


def test_improvement_bonus_pays_for_the_gain_over_the_previous_turn():
    """SCoRe's shaping: turn j > 1 gets alpha * (r_j - r_{j-1}) on top of Eq. 2; turn 1,
    missing turns and alpha = 0 are unchanged."""
    pdms = np.array([[0.5, 0.5, 0.9], [0.2, 0.7, 0.1], [0.4, 0.1, 0.0]], np.float32)
    fmt = np.array([[1.0, 1.0, 1.0], [0.0, 1.0, 1.0], [1.0, 1.0, 1.0]], np.float32)
    mask = np.array([[True, True, True], [True, True, True], [True, True, False]])
    base = np.where(mask, 0.8 * pdms + 0.2 * fmt, 0.0)
    np.testing.assert_allclose(np.asarray(turn_rewards(pdms, fmt, mask, improvement_weight=0.0)), base, atol=1e-6)
    shaped = np.asarray(turn_rewards(pdms, fmt, mask, improvement_weight=2.0))
    expected = base.copy()
    for i in range(3):
        for j in range(1, 3):
            if mask[i, j]:
                expected[i, j] += 2.0 * (base[i, j] - base[i, j - 1])
    np.testing.assert_allclose(shaped, expected, atol=1e-6)
    assert shaped[0, 1] == base[0, 1]  # a repeated answer earns nothing extra
    assert shaped[2, 2] == 0.0  # a missing turn stays 0
    with pytest.raises(ValueError, match="improvement_weight"):
        RolloutConfig(improvement_weight=float("nan"))


def test_bad_config_raises():
    with pytest.raises(ValueError):
        AdvantageConfig(mode="ppo")
    with pytest.raises(ValueError):
        AdvantageConfig(singleton="one")
