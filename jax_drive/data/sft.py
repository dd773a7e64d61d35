"""MTDrive's training data as token rows: the SFT mix, on-policy recovery rows, RL curation.

Builders of :mod:`jax_drive.data.builders` make chat records from scenes; this module makes
them into the token rows the trainers take (tokenised with the policy's chat template,
images attached, long rows left out) and picks the RL prompts. Every function takes its
settings explicitly; the MTDrive pipeline passes its preset's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jax_drive.data.builders import (
    BuildConfig,
    ConstantVelocityPredictor,
    FirstTurnPredictor,
    build_multi,
    build_qa,
    build_recovery,
    build_rl,
    build_self_recovery,
    build_single,
)
from jax_drive.data.tokens import TokenRow, chat_samples, tokenize_chat, with_images
from jax_drive.scenes import index_scene
from jax_drive.text.format_score import FormatConfig
from jax_drive.types import Scene


def filter_by_length(rows: Sequence, kinds: Sequence[str], max_tokens: int | None) -> tuple[list, dict]:
    """Keeps the token rows of at most ``max_tokens`` tokens (all when None).

    Returns (kept rows, {"max_tokens": ..., kind: number kept per kind}). Raises when
    nothing is left.
    """
    if len(rows) != len(kinds):
        raise ValueError(f"{len(rows)} rows but {len(kinds)} kinds")
    keep = [i for i, r in enumerate(rows) if max_tokens is None or len(r) <= max_tokens]
    if not keep:
        raise ValueError(f"no SFT sample has at most {max_tokens} tokens")
    counts = {k: sum(kinds[i] == k for i in keep) for k in dict.fromkeys(kinds)}
    return [rows[i] for i in keep], {"max_tokens": max_tokens, **counts}


def tokenize_records(records: Sequence[dict], tokenizer, train_on: str) -> list[TokenRow]:
    """Builder records -> SFT rows (a record's own ``train_on`` wins over ``train_on``)."""
    processed: dict[int, Any] = {}  # one preprocessing per camera frame: the rows of a scene share it
    return [with_images(tokenize_chat(tokenizer, m, own),
                        [processed.setdefault(id(im), tokenizer.preprocess([im])[0]) for im in r.get("images", ())],
                        tokenizer)
            for (m, own), r in zip(chat_samples(records, train_on), records)]


def sft_rows(train: Scene, tokenizer, key: jax.Array, *, single: int, multi: int, recovery: int, qa_scenes: int,
             build: BuildConfig, train_on: str, max_tokens: int | None) -> tuple[list[TokenRow], dict]:
    """Tokenised SFT rows and their data card (MTDrive section 3.2).

    ``single`` single-turn, ``multi`` 2-turn (constant-velocity first turn + PDM feedback),
    ``recovery`` format-recovery rows (0 = none) from consecutive training scenes (cycling
    over the N scenes of ``train``), and PDM-understanding QA from the first ``qa_scenes``;
    target always the expert trajectory; rows over ``max_tokens`` left out.
    """
    n = int(train.command.shape[0])
    k_multi, k_qa = jax.random.split(key)
    singles = build_single(index_scene(train, np.arange(0, single) % n), build)
    multis, multi_stats = build_multi(index_scene(train, np.arange(single, single + multi) % n),
                                      ConstantVelocityPredictor(), k_multi, build)
    # recovery scenes follow the multi-turn ones; their key is new so that the other kinds
    # (and runs without recovery rows) stay as they were
    start = single + multi
    recoveries, recovery_counts = (build_recovery(index_scene(train, np.arange(start, start + recovery) % n),
                                                  jax.random.fold_in(key, 3), build) if recovery else ([], {}))
    qa, qa_counts = build_qa(index_scene(train, np.arange(qa_scenes)), k_qa, build)
    card = {"single": len(singles), "multi": len(multis), "qa": len(qa), "multi_stats": multi_stats,
            "qa_counts": qa_counts}
    if recovery:
        card.update(recovery=len(recoveries), recovery_counts=recovery_counts)
    records = singles + multis + recoveries + qa
    kinds = (["single"] * len(singles) + ["multi"] * len(multis) + ["recovery"] * len(recoveries)
             + ["qa"] * len(qa))
    kept, card["kept"] = filter_by_length(tokenize_records(records, tokenizer, train_on), kinds, max_tokens)
    return kept, card


def onpolicy_rows(scenes: Scene, predictor: FirstTurnPredictor, tokenizer, replay: Sequence[TokenRow],
                  key: jax.Array, *, build: BuildConfig, format_config: FormatConfig, train_on: str,
                  max_tokens: int | None) -> tuple[list[TokenRow], dict]:
    """On-policy recovery rows and their card (DAgger-style).

    ``predictor`` (the SFT policy, greedy first turn) answers ``scenes``; each unusable answer
    gives an expert row and a recovery row holding that answer verbatim
    (:func:`jax_drive.data.builders.build_self_recovery`); as many rows drawn from ``replay``
    (the SFT data; with ``key``) follow, so the continuation keeps the rest. Empty rows when
    every answer is usable.
    """
    k_answer, k_replay = jax.random.split(key)
    records, stats = build_self_recovery(scenes, predictor, k_answer, build, format_config)
    if not records:  # every answer was usable: nothing to continue on
        return [], {**stats, "kept": {}, "replay": 0}
    rows, kept = filter_by_length(tokenize_records(records, tokenizer, train_on), [r["kind"] for r in records],
                                  max_tokens)
    pick = np.sort(np.asarray(jax.random.permutation(k_replay, len(replay)))[:len(rows)])
    return rows + [replay[int(i)] for i in pick], {**stats, "kept": kept, "replay": len(pick)}


def curate(candidates: Scene, predictor: FirstTurnPredictor, key: jax.Array,
           build: BuildConfig) -> tuple[np.ndarray, dict]:
    """RL prompt curation (MTDrive section 3.3) with ``predictor``'s first turn: (indices
    into ``candidates`` of the kept scenes, curation statistics). Keeps every candidate when
    the builder keeps none."""
    records, stats = build_rl(candidates, predictor, key, build)
    chosen = np.array([r["scene_id"] for r in records], dtype=np.int64)
    scene_ids = np.asarray(candidates.scene_id)
    n = int(scene_ids.shape[0])
    index = np.flatnonzero(np.isin(scene_ids, chosen)) if len(chosen) else np.arange(n)
    return index, stats
