"""kernels/: the Pallas kernels (interpret mode on CPU) equal their pure-JAX twins, and the
twins equal independent references (dense log-softmax; the corner-based box test)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_drive.geometry import box_corners
from jax_drive.geometry import boxes_overlap as corner_boxes_overlap
from jax_drive.models import CausalLM, ModelConfig, positions_from_mask
from kernels import BoxOverlapConfig, LogprobConfig, boxes_overlap, resolve_impl, token_logprobs

ON_ACCELERATOR = jax.default_backend() in ("gpu", "tpu")
NEEDS_ACCELERATOR = pytest.mark.skipif(
    not ON_ACCELERATOR,
    reason=f"compiled Pallas kernels need a GPU or TPU; JAX's backend here is {jax.default_backend()!r} "
           "(the kernels are checked in interpret mode instead)")
# Small tiles so that a few dozen tokens and columns already span several tiles and chunks.
SMALL = LogprobConfig(token_chunk=16, vocab_chunk=32, token_block=8, vocab_block=8, hidden_block=8)


# ----------------------------------------------------------------------------- log-probs
def _dense_logprobs(hidden, head_vd, targets, mask, temperature):
    logits = jnp.einsum("...d,vd->...v", hidden, head_vd) / temperature
    picked = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
    return jnp.where(mask, picked, 0.0)


def _problem(seed, lead, d, v, dtype=jnp.float32):
    """Random hidden (lead + (d,)), head (v, d), targets, and a ragged mask (left padding per
    row plus random holes; row 0 keeps every position)."""
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.standard_normal(lead + (d,)), dtype)
    head = jnp.asarray(rng.standard_normal((v, d)) / np.sqrt(d) * 3, dtype)
    targets = jnp.asarray(rng.integers(0, v, lead), jnp.int32)
    length = lead[-1]
    starts = rng.integers(0, length, lead[:-1] + (1,))
    mask = (np.arange(length) >= starts) & (rng.random(lead) > 0.15)
    mask.reshape(-1, length)[0] = True
    return hidden, head, targets, jnp.asarray(mask)


def _weights(shape):
    """Per-token loss weights, so that every cotangent differs."""
    return np.linspace(0.5, 1.5, int(np.prod(shape))).reshape(shape)


def _loss(fn):
    """sum_n w_n sin(logp_n): a scalar whose cotangent differs per token."""
    def loss(hidden, head):
        lp = fn(hidden, head)
        return jnp.sum(jnp.sin(lp) * _weights(lp.shape))
    return loss


def _values_and_grads(fn, hidden, head):
    return fn(hidden, head), jax.grad(_loss(fn), argnums=(0, 1))(hidden, head)


def _float64_reference(hidden, head_vd, targets, mask, temperature):
    """Log-probs and the gradients of :func:`_loss` in float64 numpy, from the formulas:
    dz = g / T (onehot - softmax), d hidden = dz W, d head = dz^T hidden."""
    h = np.asarray(hidden, np.float64)
    w = np.asarray(head_vd, np.float64)
    t, m = np.asarray(targets), np.asarray(mask)
    z = h @ w.T / temperature
    top = z.max(-1, keepdims=True)
    lse = np.log(np.exp(z - top).sum(-1)) + top[..., 0]
    logp = np.where(m, np.take_along_axis(z, t[..., None], -1)[..., 0] - lse, 0.0)
    g = np.where(m, np.cos(logp) * _weights(logp.shape), 0.0)
    dz = g[..., None] / temperature * (np.eye(w.shape[0])[t] - np.exp(z - lse[..., None]))
    return logp, (dz @ w, dz.reshape(-1, w.shape[0]).T @ h.reshape(-1, w.shape[1]))


def _close(got, want, tol=1e-5):
    """|got - want| <= tol * max(1, max |want|): float32 rounding of sums over V and tokens."""
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=0, atol=tol * scale)


# Shapes: (lead dims, D, V, temperature, head layout). V is never a multiple of the vocab chunk
# (32) except 64; 20 < 32 pads the head; 9 tokens, 37 and 150 leave partial token chunks.
CASES = [
    ((2, 9), 16, 37, 1.0, "vd"),
    ((3, 12), 24, 150, 0.7, "dv"),
    ((1, 5), 8, 20, 1.3, "vd"),
    ((4, 4), 16, 64, 1.0, "dv"),
    ((2, 3, 7), 12, 41, 0.5, "vd"),
]


@pytest.mark.parametrize("lead,d,v,temperature,layout", CASES)
def test_logprob_twin_matches_float64_log_softmax(lead, d, v, temperature, layout):
    hidden, head, targets, mask = _problem(sum(lead) + d + v, lead, d, v)

    def twin(h, w):
        w_in = w if layout == "vd" else w.T
        return token_logprobs(h, w_in, targets, mask, temperature=temperature,
                              head_layout=layout, config=SMALL, impl="jax")

    out, grads = _values_and_grads(twin, hidden, head)
    ref, ref_grads = _float64_reference(hidden, head, targets, mask, temperature)
    assert out.shape == lead and out.dtype == jnp.float32
    _close(out, ref)
    assert np.all(np.asarray(out)[~np.asarray(mask)] == 0.0)
    for got, want in zip(grads, ref_grads):
        assert got.shape == want.shape and got.dtype == jnp.float32
        _close(got, want)
    # masked tokens get no gradient
    assert np.all(np.asarray(grads[0])[~np.asarray(mask)] == 0.0)


@pytest.mark.parametrize("lead,d,v,temperature,layout", CASES)
def test_logprob_kernel_interpret_matches_twin(lead, d, v, temperature, layout):
    hidden, head, targets, mask = _problem(7 * sum(lead) + v, lead, d, v)
    head_in = head if layout == "vd" else head.T

    def run(impl):
        return lambda h, w: token_logprobs(h, w, targets, mask, temperature=temperature,
                                           head_layout=layout, config=SMALL, impl=impl)

    out, grads = _values_and_grads(run("interpret"), hidden, head_in)
    ref, ref_grads = _values_and_grads(run("jax"), hidden, head_in)
    np.testing.assert_allclose(out, ref, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, ref_grads):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_logprob_kernel_with_default_tiles_and_odd_hidden_size():
    """Default config (chunks shrink to the problem); D = 20 does not divide hidden_block 64,
    so the kernel takes D in one slice."""
    hidden, head, targets, mask = _problem(3, (2, 33), 20, 300)
    out, grads = _values_and_grads(
        lambda h, w: token_logprobs(h, w, targets, mask, impl="interpret"), hidden, head)
    ref, ref_grads = _float64_reference(hidden, head, targets, mask, 1.0)
    for got, want in zip((out,) + grads, (ref,) + ref_grads):
        _close(got, want)


def test_logprob_chunks_off_the_tile_grid_are_rounded_up():
    """token_chunk 10 and vocab_chunk 20 with 8-wide tiles run as 16 and 24."""
    hidden, head, targets, mask = _problem(9, (3, 7), 16, 45)
    config = LogprobConfig(token_chunk=10, vocab_chunk=20, token_block=8, vocab_block=8, hidden_block=8)
    run = lambda impl: (lambda h, w: token_logprobs(h, w, targets, mask, config=config, impl=impl))
    out, grads = _values_and_grads(run("interpret"), hidden, head)
    ref, ref_grads = _float64_reference(hidden, head, targets, mask, 1.0)
    twin, twin_grads = _values_and_grads(run("jax"), hidden, head)
    for got, want, tw in zip((out,) + grads, (ref,) + ref_grads, (twin,) + twin_grads):
        _close(got, want)
        np.testing.assert_allclose(got, tw, atol=1e-5, rtol=1e-5)


def test_logprob_bfloat16_head_close_to_float32():
    hidden, head, targets, mask = _problem(5, (2, 16), 32, 100)
    ref = token_logprobs(hidden, head, targets, mask, config=SMALL, impl="jax")
    for impl in ("jax", "interpret"):
        out = token_logprobs(hidden, head.astype(jnp.bfloat16), targets, mask, config=SMALL, impl=impl)
        assert out.dtype == jnp.float32
        np.testing.assert_allclose(out, ref, atol=0.15)
        g = jax.grad(lambda h: token_logprobs(h, head.astype(jnp.bfloat16), targets, mask,
                                              config=SMALL, impl=impl).sum())(hidden)
        assert g.dtype == hidden.dtype and bool(jnp.all(jnp.isfinite(g)))


def test_logprob_matches_the_model_path():
    """The twin on the model's final hidden states and head = CausalLM.token_logprobs, values
    and gradients (the call the trainer can switch to)."""
    config = ModelConfig.tiny("qwen2", vocab_size=300)  # untied head (H, V): layout "dv"
    model = CausalLM(config, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, 300, (2, 11)), jnp.int32)
    mask = jnp.asarray(np.arange(11)[None] >= np.array([[0], [4]]))
    pos = positions_from_mask(mask)
    targets = jnp.roll(ids, -1, axis=1)

    def ours(m):
        hidden = m.hidden_states(ids, pos, mask)
        return token_logprobs(hidden, m.head_matrix(), targets, mask, temperature=0.8,
                              head_layout="dv", config=SMALL, impl="jax")

    def theirs(m):
        return jnp.where(mask, m.token_logprobs(ids, pos, mask, targets, chunk_size=5, temperature=0.8), 0.0)

    np.testing.assert_allclose(ours(model), theirs(model), atol=1e-5)
    g_ours = nnx.grad(lambda m: ours(m).sum())(model)
    g_theirs = nnx.grad(lambda m: theirs(m).sum())(model)
    for a, b in zip(jax.tree.leaves(g_ours), jax.tree.leaves(g_theirs)):
        np.testing.assert_allclose(a, b, atol=1e-5)


def _largest_float32(fn, *args) -> int:
    """Elements of the largest float32 array named anywhere in fn's jaxpr (nested ones too)."""
    shapes = re.findall(r"f32\[([\d,]*)\]", str(jax.make_jaxpr(fn)(*args)))
    return max(int(np.prod([int(x) for x in shape.split(",") if x])) for shape in shapes)


@pytest.mark.parametrize("impl", ["jax", "interpret"])
def test_logprob_never_materialises_token_by_vocab(impl):
    """Forward and backward: no float32 array of tokens x V elements; the float32 head
    gradient (V x D; the head itself is bfloat16 here) exists only when the head is
    differentiated."""
    n, d, v = 64, 8, 1000
    hidden, head, targets, mask = _problem(0, (2, n // 2), d, v)
    head = head.astype(jnp.bfloat16)
    fn = lambda h, w: token_logprobs(h, w, targets, mask, config=SMALL, impl=impl)
    full = n * v
    for f in (fn, jax.grad(_loss(fn), argnums=(0, 1))):
        largest = _largest_float32(f, hidden, head)
        assert SMALL.token_chunk * SMALL.vocab_chunk <= largest < full, (largest, full)
    assert _largest_float32(jax.grad(_loss(fn)), hidden, head) < v * d
    assert _largest_float32(jax.grad(_loss(fn), argnums=1), hidden, head) >= v * d
    # the dense reference does materialise it (the check can fail)
    assert _largest_float32(lambda h, w: _dense_logprobs(h, w, targets, mask, 1.0), hidden, head) >= full


def test_logprob_bad_input_raises():
    hidden, head, targets, mask = _problem(1, (2, 4), 8, 20)
    with pytest.raises(ValueError, match="hidden"):
        token_logprobs(hidden[..., :7], head, targets)
    with pytest.raises(ValueError, match="targets"):
        token_logprobs(hidden, head, targets[:, :3])
    with pytest.raises(ValueError, match="integer"):
        token_logprobs(hidden, head, targets.astype(jnp.float32))
    with pytest.raises(ValueError, match="mask"):
        token_logprobs(hidden, head, targets, mask[:1])
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(hidden, head, targets, temperature=0.0)
    with pytest.raises(ValueError, match="head_layout"):
        token_logprobs(hidden, head, targets, head_layout="hv")
    with pytest.raises(ValueError, match="powers of two"):
        LogprobConfig(token_block=48)
    with pytest.raises(ValueError, match="positive"):
        LogprobConfig(vocab_chunk=0)


# ----------------------------------------------------------------------------- boxes
def _boxes(rng, shape, spread=6.0):
    """Random (x, y, heading, length, width) boxes, crowded enough that about a tenth overlap."""
    return jnp.asarray(np.concatenate([
        rng.uniform(-spread, spread, shape + (2,)), rng.uniform(-np.pi, np.pi, shape + (1,)),
        rng.uniform(0.3, 5.0, shape + (1,)), rng.uniform(0.3, 2.5, shape + (1,))], -1), jnp.float32)


@jax.jit
def _corner_reference(a, b, va, vb):
    """The corner-based separating-axis test of jax_drive.geometry, broadcast to (..., P, T, O)."""
    ca = box_corners(*(a[..., k] for k in range(5)))[..., :, :, None, :, :]
    cb = box_corners(*(b[..., k] for k in range(5)))[..., None, :, :, :, :]
    ca, cb = jnp.broadcast_arrays(ca, cb)
    return corner_boxes_overlap(ca, cb) & va[..., None] & vb[..., None, :, :]


BOX_CASES = [((), 1, 1, 1), ((2,), 5, 7, 11), ((3,), 9, 4, 130), ((2, 2), 3, 5, 6)]


@pytest.mark.parametrize("lead,p,t,o", BOX_CASES)
def test_box_twin_matches_corner_sat_and_kernel_matches_twin(lead, p, t, o):
    rng = np.random.default_rng(p * 100 + o)
    a, b = _boxes(rng, lead + (p, t)), _boxes(rng, lead + (t, o))
    va = jnp.asarray(rng.random(lead + (p, t)) > 0.2)
    vb = jnp.asarray(rng.random(lead + (t, o)) > 0.2)
    twin = boxes_overlap(a, b, va, vb, impl="jax")
    assert twin.shape == lead + (p, t, o) and twin.dtype == jnp.bool_
    ref = _corner_reference(a, b, va, vb)
    np.testing.assert_array_equal(twin, ref)
    if p * t * o > 10:
        assert 0 < float(twin.mean()) < 0.5  # both outcomes occur
    # default tiles where O = 130 spans two object tiles, small ones (several per axis) elsewhere
    config = BoxOverlapConfig() if o > 128 else BoxOverlapConfig(proposal_block=4, object_block=8)
    np.testing.assert_array_equal(boxes_overlap(a, b, va, vb, config=config, impl="interpret"), twin)


def test_box_overlap_touching_counts_and_gap_separates():
    """Axis-aligned 4 x 2 boxes side by side: touching overlaps, 1 mm apart does not; also
    rotated by 30 degrees together (touching within float rounding is not asserted)."""
    def pair(gap):
        a = jnp.asarray([[[0.0, 0.0, 0.0, 4.0, 2.0]]])  # (P=1, T=1, 5)
        b = jnp.asarray([[[4.0 + gap, 0.0, 0.0, 4.0, 2.0]]])  # (T=1, O=1, 5)
        return a, b

    for impl in ("jax", "interpret"):
        assert bool(boxes_overlap(*pair(0.0), impl=impl)[0, 0, 0])
        assert not bool(boxes_overlap(*pair(1e-3), impl=impl)[0, 0, 0])
        a, b = pair(-0.01)
        rot = lambda x: x.at[..., 2].set(np.pi / 6).at[..., :2].set(
            x[..., :2] @ jnp.asarray([[np.cos(np.pi / 6), np.sin(np.pi / 6)],
                                      [-np.sin(np.pi / 6), np.cos(np.pi / 6)]]))
        assert bool(boxes_overlap(rot(a), rot(b), impl=impl)[0, 0, 0])


def test_box_overlap_all_pairs_like_the_simulator():
    """(A, 5) agents against themselves: symmetric, every box overlaps itself, and equal to
    the corner-based test; the (P, T, O) layout with T = 1."""
    rng = np.random.default_rng(4)
    boxes = _boxes(rng, (12,), spread=5.0)
    for impl in ("jax", "interpret"):
        pairs = boxes_overlap(boxes[:, None], boxes[None], impl=impl)[:, 0]  # (A, 1, A)
        assert pairs.shape == (12, 12)
        np.testing.assert_array_equal(pairs, pairs.T)
        assert bool(jnp.all(jnp.diagonal(pairs)))
        ones = jnp.ones((12, 1), bool)
        np.testing.assert_array_equal(pairs, _corner_reference(boxes[:, None], boxes[None], ones, ones.T)[:, 0])


def test_box_overlap_broadcasts_leading_dims_and_vmaps():
    rng = np.random.default_rng(5)
    a, b = _boxes(rng, (3, 4, 6)), _boxes(rng, (6, 5))
    out = boxes_overlap(a, b, impl="interpret")
    assert out.shape == (3, 4, 6, 5)
    np.testing.assert_array_equal(out, boxes_overlap(a, jnp.broadcast_to(b, (3, 6, 5, 5)), impl="jax"))
    vmapped = jax.vmap(lambda x: boxes_overlap(x, b, impl="interpret"))(a)
    np.testing.assert_array_equal(vmapped, out)


def test_box_overlap_bad_input_raises():
    a, b = jnp.zeros((2, 3, 5)), jnp.zeros((3, 4, 5))
    with pytest.raises(ValueError, match="steps"):
        boxes_overlap(a, jnp.zeros((4, 4, 5)))
    with pytest.raises(ValueError, match=r"\(\.\.\., P, T, 5\)"):
        boxes_overlap(a[..., :4], b)
    with pytest.raises(ValueError, match="valid"):
        boxes_overlap(a, b, valid_a=jnp.ones((2,), bool))
    with pytest.raises(ValueError, match="powers of two"):
        BoxOverlapConfig(object_block=100)


# ----------------------------------------------------------------------------- dispatch
def test_dispatch_defaults_and_overrides():
    assert resolve_impl(None) == ("pallas" if ON_ACCELERATOR else "jax")
    assert resolve_impl("jax") == "jax" and resolve_impl("interpret") == "interpret"
    with pytest.raises(ValueError, match="impl must be"):
        resolve_impl("triton")
    if not ON_ACCELERATOR:
        with pytest.raises(ValueError, match="GPU or TPU"):
            resolve_impl("pallas")


@NEEDS_ACCELERATOR
def test_compiled_kernels_match_twins_on_accelerator():
    hidden, head, targets, mask = _problem(11, (4, 300), 128, 5000)
    fn = lambda impl: (lambda h, w: token_logprobs(h, w, targets, mask, impl=impl))
    out, grads = _values_and_grads(fn("pallas"), hidden, head)
    ref, ref_grads = _values_and_grads(fn("jax"), hidden, head)
    # TF32-class matmul precision on GPUs: looser than the interpret-mode 1e-5.
    np.testing.assert_allclose(out, ref, atol=2e-3, rtol=2e-3)
    for got, want in zip(grads, ref_grads):
        np.testing.assert_allclose(got, want, atol=2e-3, rtol=2e-3)
    rng = np.random.default_rng(0)
    a, b = _boxes(rng, (8, 16, 41)), _boxes(rng, (8, 41, 50))
    np.testing.assert_array_equal(boxes_overlap(a, b, impl="pallas"), boxes_overlap(a, b, impl="jax"))
