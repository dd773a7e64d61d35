"""Multi-turn evaluation: rollouts of many scenes in batches, summarised."""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
from tqdm.auto import tqdm

from jax_drive.rollout.images import prompt_image_inputs
from jax_drive.rollout.multiturn import RolloutConfig, compute_reference, run_rollouts, scene_prompts
from jax_drive.rollout.result import RolloutResult, concat_results, select_scenes, summarize
from jax_drive.sampling import SamplingParams
from jax_drive.scenes import index_scene
from jax_drive.text.prompts import PromptConfig
from jax_drive.types import Scene

# the summary values averaged over held-out sets (with their standard error across sets)
SET_SUMMARY_KEYS = ("pdms_first", "pdms_final", "format_rate", "turns_mean", "final_nc", "final_dac", "final_ttc",
                    "final_ep", "final_comfort")


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


def scene_scores(result: RolloutResult) -> dict[str, list[float]]:
    """Per-scene PDMS of the first and the last answer, each a mean over the scene's G
    rollouts: ``scene_pdms_first`` and ``scene_pdms_final``, (S,) lists for paired
    comparisons of two policies on the same scenes."""
    return {"scene_pdms_first": [float(v) for v in np.asarray(result.pdms)[..., 0].mean(axis=1)],
            "scene_pdms_final": [float(v) for v in np.asarray(result.final_pdms).mean(axis=1)]}


def evaluate_sets(engine, tokenizer, sets: Sequence[tuple[Scene, np.ndarray]], config: RolloutConfig, *,
                  seeds: Sequence[int], batch_size: int, transcripts: int, num_scenes: int | None = None,
                  progress: bool = True) -> dict:
    """Multi-turn evaluation on several held-out sets (their first ``num_scenes`` scenes
    when given): per-set summaries (with :func:`scene_scores`), their mean and standard
    error, PDMS by turn budget, and the turn logs of the first set's first ``transcripts`` scenes.

    ``sets``: [(scenes (S_i,), references (S_i, 40, 3))], one per evaluation ``seeds``. The
    sets are pooled into one rollout call (``batch_size`` scenes per batch), so the sampler's
    batch padding is paid once, not per set; with greedy decoding the result does not
    depend on the PRNG key.
    """
    chosen = []
    for scenes, refs in sets:
        if num_scenes is not None:
            idx = np.arange(min(num_scenes, len(refs)))
            scenes, refs = index_scene(scenes, idx), refs[idx]
        chosen.append((scenes, np.asarray(refs)))
    pooled = jax.tree.map(lambda *a: np.concatenate([np.asarray(x) for x in a]), *[s for s, _ in chosen])
    _, result = evaluate_multiturn(engine, tokenizer, pooled, config, jax.random.key(0),
                                   references=np.concatenate([r for _, r in chosen]), batch_size=batch_size,
                                   progress=progress)
    per_seed, start = [], 0
    for seed, (_, refs) in zip(seeds, chosen):
        part = select_scenes(result, np.arange(start, start + len(refs)))
        start += len(refs)
        per_seed.append({"seed": seed, "scenes": int(len(refs)), **summarize(part), **scene_scores(part)})
    mean = {k: float(np.mean([s[k] for s in per_seed])) for k in SET_SUMMARY_KEYS}
    sem = {k: float(np.std([s[k] for s in per_seed], ddof=1) / np.sqrt(len(per_seed))) if len(per_seed) > 1 else 0.0
           for k in SET_SUMMARY_KEYS}
    by_budget = np.mean([s["pdms_by_budget"] for s in per_seed], axis=0).tolist()
    first = min(len(chosen[0][1]), transcripts)
    return {"mean": mean, "sem": sem, "pdms_by_budget": by_budget, "per_seed": per_seed,
            "transcripts": [result.turn_log(s) for s in range(first)]}


class PolicyPredictor:
    """First-turn predictor backed by a language-model engine (greedy), for the data builders
    (RL curation, on-policy recovery). ``prompt``: the prompts' settings; when they hold
    images (``uses_images``) the scenes' camera images go with them (the engine's tokenizer
    must be an image tokenizer). ``grammar``: every answer's grammar (None = free answers)."""

    name = "policy"

    def __init__(self, engine, max_new_tokens: int, prompt: PromptConfig | None = None, grammar=None):
        self.engine = engine
        self.params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, grammar=grammar)
        self.prompt = prompt

    def __call__(self, scene: Scene, key: jax.Array, prompts: Sequence[list[dict]]) -> list[str]:
        if self.prompt is None or not self.prompt.uses_images:
            return [c.text for c in self.engine.generate_chat(list(prompts), self.params, key)]
        tok = self.engine.tokenizer
        ids = [tok.encode(tok.apply_chat_template(p, add_generation_prompt=True)) for p in prompts]
        ids, images = prompt_image_inputs(tok, scene, self.prompt, None, ids)
        return [c.text for c in self.engine.generate(ids, self.params, key, images=images)]
