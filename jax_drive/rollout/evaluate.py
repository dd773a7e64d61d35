"""Multi-turn evaluation: rollouts of many scenes in batches, summarised."""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
from tqdm.auto import tqdm

from jax_drive.rollout.multiturn import RolloutConfig, compute_reference, run_rollouts, scene_prompts
from jax_drive.rollout.result import RolloutResult, concat_results, summarize
from jax_drive.scenes import index_scene
from jax_drive.types import Scene


def evaluate_multiturn(
    engine,
    tokenizer,
    scenes: Scene,
    config: RolloutConfig = RolloutConfig(group_size=1),
    key: jax.Array | None = None,
    *,
    references: Any = None,
    prompts: Sequence[str] | None = None,
    pdm_config=None,
    batch_size: int = 64,
    progress: bool = True,
) -> tuple[dict, RolloutResult]:
    """Multi-turn evaluation: PDMS per turn, final PDMS, format rate, turns used.

    Uses ``config`` as given (for greedy evaluation pass ``sampling.temperature = 0``).
    Scenes are processed ``batch_size`` at a time; batch b samples with
    ``fold_in(key, first scene index of b)``. Returns (summary dict, RolloutResult).
    """
    n = int(scenes.command.shape[0])
    key = jax.random.key(0) if key is None else key
    if references is None:
        references = compute_reference(scenes, pdm_config)
    references = np.asarray(references, np.float32)
    prompts = list(scene_prompts(scenes, config.prompt, config.caption) if prompts is None else prompts)
    results = []
    for start in tqdm(range(0, n, batch_size), desc="eval", disable=not progress, dynamic_ncols=True):
        idx = np.arange(start, min(n, start + batch_size))
        results.append(run_rollouts(engine, tokenizer, index_scene(scenes, idx), jax.random.fold_in(key, start), config,
                                    reference=references[idx], pdm_config=pdm_config,
                                    prompts=[prompts[i] for i in idx]))
    result = concat_results(results)
    return summarize(result), result
