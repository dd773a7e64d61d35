"""TalkingVehicles / CoopReflect: every method of the seed's Table 1, the distilled policy,
the Table 3 latency / bytes rows.

Modules:
  :mod:`~jax_drive.pipelines.talking_vehicles.presets`       presets (``PRESETS``)
  :mod:`~jax_drive.pipelines.talking_vehicles.methods`       the method registry (``METHODS``) and ``Engines``
  :mod:`~jax_drive.pipelines.talking_vehicles.distillation`  teacher data, the student, DAgger
  :mod:`~jax_drive.pipelines.talking_vehicles.evaluation`    batched evaluation, summaries, tables, the keep-only reference
  :mod:`~jax_drive.pipelines.talking_vehicles.identity`      policy identities: the evaluation chunks' keys
  :mod:`~jax_drive.pipelines.talking_vehicles.pipeline`      ``run`` / ``run_method`` (one stage per method)
"""

from jax_drive.names import BASELINES, LLM_METHODS
from jax_drive.names import TALKING_VEHICLES_PRESETS as PRESET_NAMES
from jax_drive.pipelines.talking_vehicles.distillation import distill_method, load_student
from jax_drive.pipelines.talking_vehicles.evaluation import (
    TV_KEYS,
    by_variation,
    difference_lines,
    evaluate,
    evaluate_chunk,
    latency_summary,
    method_differences,
    summarise_records,
    table3_rows,
    table_rows,
    variation_rows,
)
from jax_drive.pipelines.talking_vehicles.methods import METHODS, Engines, learn_method
from jax_drive.pipelines.talking_vehicles.pipeline import run, run_method
from jax_drive.pipelines.talking_vehicles.presets import PRESETS, Preset

__all__ = ["BASELINES", "LLM_METHODS", "METHODS", "PRESETS", "PRESET_NAMES", "TV_KEYS", "Engines", "Preset",
           "by_variation", "difference_lines", "distill_method", "evaluate", "evaluate_chunk",
           "latency_summary", "learn_method", "load_student", "method_differences", "run", "run_method",
           "summarise_records", "table3_rows", "table_rows", "variation_rows"]
