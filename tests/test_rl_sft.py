"""SFT: chat tokenisation masks, padding/bucketing, loss parity, and learning on a tiny model."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_drive.data.tokens import TokenRow, as_conversations, chat_samples, tokenize_chat
from jax_drive.rl.batching import bucket_length, bucketed_batches, pad_rows
from jax_drive.rl.optim import OptimConfig
from jax_drive.rl.sft import SFTConfig, sft_loss_fn, sft_train
from jax_drive.models.tiny import byte_tokenizer, tiny_policy

CONV = [
    {"role": "user", "content": "plan"},
    {"role": "assistant", "content": "[PT, (+1.0, 0.0, 0.0)]"},
    {"role": "user", "content": "fix"},
    {"role": "assistant", "content": "[PT, (+2.0, 0.0, 0.0)]"},
]


def _tiny_model(seed=0):
    return tiny_policy(seed, lora_rank=None)[0]


def test_tokenize_chat_masks_assistant_answers():
    tok = byte_tokenizer()
    row = tokenize_chat(tok, CONV)
    text = tok.decode(row.ids.tolist(), skip_special_tokens=False)
    assert text == tok.apply_chat_template(CONV, add_generation_prompt=False)
    trained = tok.decode(row.ids[row.weight > 0].tolist(), skip_special_tokens=False)
    assert trained == "[PT, (+1.0, 0.0, 0.0)]<|im_end|>\n[PT, (+2.0, 0.0, 0.0)]<|im_end|>\n"
    last = tokenize_chat(tok, CONV, train_on="last")
    np.testing.assert_array_equal(last.ids, row.ids)
    assert tok.decode(last.ids[last.weight > 0].tolist(), skip_special_tokens=False) == "[PT, (+2.0, 0.0, 0.0)]<|im_end|>\n"
    with pytest.raises(ValueError):
        tokenize_chat(tok, [{"role": "user", "content": "no answer"}])
    with pytest.raises(ValueError):
        tokenize_chat(tok, [{"role": "user"}])


def test_pad_rows_shifts_targets_and_mask():
    rows = [TokenRow(np.array([5, 6, 7, 8], np.int32), np.array([0, 0, 1, 1], np.float32)),
            TokenRow(np.array([9, 10], np.int32), np.array([0, 1], np.float32))]
    b = pad_rows(rows, 4, pad_id=0, num_rows=3, extra={"old": [np.array([0, 0, -1, -2.0]), np.array([0, -3.0])]})
    np.testing.assert_array_equal(b["input_ids"], [[5, 6, 7, 8], [9, 10, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(b["targets"], [[6, 7, 8, 0], [10, 0, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(b["loss_mask"], [[0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(b["attention_mask"], [[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(b["positions"], [[0, 1, 2, 3], [0, 1, 1, 1], [0, 0, 0, 0]])
    np.testing.assert_array_equal(b["old"], [[0, -1, -2, 0], [-3, 0, 0, 0], [0, 0, 0, 0]])
    assert bucket_length(65, 64) == 128 and bucket_length(10, 64, max_length=40) == 64


def test_bucketed_batches_cover_every_index_once():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 100, size=53)
    batches = bucketed_batches(lengths, 4, np.random.default_rng(1), pool_batches=4)
    flat = np.concatenate(batches)
    np.testing.assert_array_equal(np.sort(flat), np.arange(53))
    # within a pool batches are length-sorted: the spread inside a batch is small on average
    spread = np.mean([lengths[b].max() - lengths[b].min() for b in batches])
    random_spread = np.mean([lengths[b].max() - lengths[b].min() for b in np.array_split(np.arange(52), 13)])
    assert spread < random_spread


def test_jsonl_loading(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"messages": CONV, "meta": 1}) + "\n\n" + json.dumps(CONV[:2]) + "\n")
    assert len(as_conversations(path)) == 2
    assert as_conversations([{"messages": CONV}]) == [CONV]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json}\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        as_conversations(bad)


def test_a_sample_may_set_its_own_train_on(tmp_path):
    """A recovery-style sample ({"train_on": "last"}) trains only on its last answer while
    the dataset default trains on every answer; bad values name the sample."""
    tok = byte_tokenizer()
    items = [{"messages": CONV, "train_on": "last"}, {"messages": CONV}, CONV]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    for dataset in (items, path):
        samples = chat_samples(dataset, "all")
        assert [t for _, t in samples] == ["last", "all", "all"]
        assert all(m == CONV for m, _ in samples)
    rows = [tokenize_chat(tok, m, t) for m, t in chat_samples(items)]
    trained = [tok.decode(r.ids[r.weight > 0].tolist(), skip_special_tokens=False) for r in rows]
    assert trained[0] == "[PT, (+2.0, 0.0, 0.0)]<|im_end|>\n"
    assert trained[1] == trained[2] == "[PT, (+1.0, 0.0, 0.0)]<|im_end|>\n[PT, (+2.0, 0.0, 0.0)]<|im_end|>\n"
    with pytest.raises(ValueError, match="sample 1: train_on"):
        chat_samples([{"messages": CONV}, {"messages": CONV, "train_on": "first"}])
    with pytest.raises(ValueError, match="train_on"):
        chat_samples(items, "none")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": CONV, "train_on": 3}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        chat_samples(bad)


def test_sft_loss_matches_full_logits():
    model = _tiny_model()
    tok = byte_tokenizer()
    rows = [tokenize_chat(tok, CONV), tokenize_chat(tok, CONV[:2])]
    batch = {k: jnp.asarray(v) for k, v in pad_rows(rows, 96, tok.pad_token_id).items()}
    loss, _ = sft_loss_fn(chunk_size=32)(model, batch)
    logits, _ = model(batch["input_ids"], batch["positions"], batch["attention_mask"])
    logp = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1))
    picked = np.take_along_axis(logp, np.asarray(batch["targets"])[..., None], axis=-1)[..., 0]
    m = np.asarray(batch["loss_mask"])
    np.testing.assert_allclose(float(loss), -(picked * m).sum() / m.sum(), rtol=1e-5)


def test_sft_learns_and_writes_back(tmp_path):
    model = _tiny_model()
    tok = byte_tokenizer()
    data = [CONV[:2], [{"role": "user", "content": "go"}, {"role": "assistant", "content": "[PT, (+3.0, 0.0, 0.0)]"}]] * 2
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in data))
    cfg = SFTConfig(optim=OptimConfig(learning_rate=1e-2, trainable="full", weight_decay=0.0),
                    batch_size=2, max_steps=30, bucket_size=64)
    rows = [tokenize_chat(tok, m) for m in data]
    before = pad_rows(rows[:2], 64, tok.pad_token_id)
    before = {k: jnp.asarray(v) for k, v in before.items()}
    loss_before = float(sft_loss_fn()(model, before)[0])
    result = sft_train(model, str(path), cfg, tokenizer=tok, out_dir=tmp_path / "run", progress=False)
    losses = [r["loss"] for r in result.history]
    assert len(losses) == 30
    assert losses[-1] < 0.5 * losses[0]
    loss_after = float(sft_loss_fn()(model, before)[0])  # the live model was updated in place
    assert loss_after < 0.5 * loss_before
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 30 and {"loss", "tokens_per_s", "peak_rss_gb", "grad_norm"} <= set(records[0])
    assert any(p.name.startswith("events") for p in (tmp_path / "run" / "tb").iterdir())


def test_lora_requires_adapters():
    model = _tiny_model()
    with pytest.raises(ValueError, match="no lora parameters"):
        sft_train(model, [CONV], SFTConfig(max_steps=1), tokenizer=byte_tokenizer(), progress=False)
