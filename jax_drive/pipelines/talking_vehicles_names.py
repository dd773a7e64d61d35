"""The names of the TalkingVehicles pipeline (methods, presets), importable without JAX so
command-line parsers can list them as choices (:mod:`jax_drive.pipelines.talking_vehicles`
builds everything else on them)."""

BASELINES = ("rule_based", "silent")
LLM_METHODS = ("zero_shot_silent", "zero_shot", "reflection", "correction_rag", "debrief")
METHODS = BASELINES + LLM_METHODS + ("central_memory", "distilled")
PRESET_NAMES = ("smoke", "cpu-demo", "paper")
