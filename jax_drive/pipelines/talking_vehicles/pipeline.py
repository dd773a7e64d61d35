"""TalkingVehicles / CoopReflect end to end: every method of the seed's Table 1, the distilled
policy of its generalisation study and the Table 3 latency / bytes rows, on the batched JAX
simulator with a local model (``JaxEngine``) or a served one (``OpenAIEngine``).

A run is one stage per method (:mod:`jax_drive.pipelines.stages`), each evaluated on the same
held-out episodes with its memories frozen; each writes ``<run_dir>/<method>.json``
(:class:`~jax_drive.pipelines.journal.FileJournal`) and a finished method is loaded, not run
again; learning checkpoints, evaluation chunks, distillation data and the student are kept
in the run directory too, so a killed run resumes. Evaluation chunks are keyed by the
policy's identity (:mod:`~jax_drive.pipelines.talking_vehicles.identity`), so a retrained
or otherwise changed policy is evaluated again. Every LLM method's result also says whether
it equals, scenario by scenario and seed by seed, what the keep-only fallback scores on the
same episodes (``keep_fallback``). With the preset's ``eval_variations`` every method is
evaluated again on the same episodes in each held-out variation (``variations`` in its result,
with its own ``keep_fallback``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence

from jax_drive.compile_cache import enable_compile_cache
from jax_drive.names import BASELINES, TALKING_VEHICLES_METHODS
from jax_drive.pipelines.journal import FileJournal
from jax_drive.pipelines.stages import RunContext, Stage, StageOutput, run_stages
from jax_drive.pipelines.talking_vehicles.evaluation import eval_specs, evaluate, fallback_policy, same_outcomes
from jax_drive.pipelines.talking_vehicles.methods import METHODS, Engines
from jax_drive.pipelines.talking_vehicles.presets import Preset

DEFAULT_STORY = "tv_overtake_perception"  # the scenario whose first accident-prone episode is kept as a storyboard


def method_result(method: str, ctx: RunContext, engines: Engines) -> StageOutput:
    """Prepares ``method`` (learning, distillation), evaluates its policy; its result record."""
    from jax_drive.runinfo import run_metadata

    preset, start = ctx.preset, time.perf_counter()
    make_policy, extra, identity = METHODS[method](method, preset, engines, ctx.run_dir, ctx.progress)
    policy = functools.cache(make_policy)  # built once, when an evaluation chunk is not on disk

    def evaluated(variation: str) -> dict:
        nominal = variation == "nominal"
        out = evaluate(policy, eval_specs(preset, method, variation), progress=ctx.progress,
                       story=ctx.option("story", DEFAULT_STORY) if nominal else None,
                       label=method if nominal else f"{method}@{variation}", max_time=preset.max_time,
                       chunk_dir=ctx.run_dir, identity=identity)
        if method not in BASELINES:
            out["keep_fallback"] = keep_fallback(method, preset, out, ctx, variation)
        return out

    result = evaluated("nominal")
    if preset.eval_variations:
        result["variations"] = {v: evaluated(v) for v in preset.eval_variations}
    model = preset.student_model if method == "distilled" else (None if method in BASELINES else preset.model)
    engine = None if method in BASELINES else ("jax" if method == "distilled" else preset.engine)
    payload = {"method": method, "preset": preset.name, "model": model, "engine": engine,
               "episodes_per_seed": preset.episodes_for(method), "seeds": list(preset.seeds), **extra, **result,
               "policy_identity": identity,
               "wall_seconds": time.perf_counter() - start, "meta": run_metadata()}
    return StageOutput(payload, payload)


def keep_fallback(method: str, preset: Preset, result: dict, ctx: RunContext, variation: str = "nominal") -> dict:
    """Whether ``result`` equals, scenario by scenario and seed by seed, what the keep-only
    fallback scores on the same episodes (:func:`fallback_policy`, no model; saved as its own
    chunks), with the fallback's average: an LLM row that parsed nothing looks like this."""
    communicate = {"zero_shot_silent": False, "zero_shot": True,  # as methods.zero_shot sets it
                   "distilled": preset.student_agent.communicate}.get(method, preset.agent.communicate)
    label = f"keep_only_{'comm' if communicate else 'silent'}" + ("" if variation == "nominal" else f"@{variation}")
    reference = evaluate(lambda: fallback_policy(communicate), eval_specs(preset, method, variation),
                         progress=ctx.progress, label=label, max_time=preset.max_time,
                         chunk_dir=ctx.run_dir, identity={"fallback": "keep", "communicate": communicate})
    return same_outcomes(result, reference) | {"average": reference["average"]["aggregate"]}


def method_stages(methods: Sequence[str]) -> tuple[Stage, ...]:
    """One stage per method, in order (ValueError for an unknown one)."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method {unknown[0]!r}; choose from {', '.join(TALKING_VEHICLES_METHODS)}")
    return tuple(Stage(m, functools.partial(method_result, m)) for m in methods)


def run(preset: Preset, methods: Sequence[str], run_dir: str, *, engines: Engines | None = None,
        progress: bool = True, force: bool = False, story: str = DEFAULT_STORY,
        on_method: Callable[[str, dict], None] | None = None) -> dict[str, dict]:
    """Runs (or loads) the methods in order, sharing engines; returns {method: result}."""
    enable_compile_cache()
    stages = method_stages(methods)
    ctx = RunContext(preset, run_dir, {"story": story}, progress=progress)
    ctx = run_stages(stages, ctx, engines or Engines(preset), FileJournal(run_dir, force=force), after=on_method)
    return {m: ctx.values[m] for m in methods}


def run_method(preset: Preset, method: str, run_dir: str, *, engines: Engines | None = None, progress: bool = True,
               force: bool = False, story: str = DEFAULT_STORY) -> dict:
    """Runs (or loads the finished result of) one method; writes ``<run_dir>/<method>.json``."""
    return run(preset, [method], run_dir, engines=engines, progress=progress, force=force, story=story)[method]
