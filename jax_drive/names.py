"""The names command lines offer as choices, importable without JAX (standard library only).

Parsers list these in ``--help`` and refuse anything else before a model, JAX or Ray
starts. Each is the one home of its list: the registries built on them (presets, methods,
arms, advantage estimators) take their keys from here and check that they match.
"""

TALKING_VEHICLES_SCENARIOS = (
    "tv_overtake_perception",
    "tv_red_light",
    "tv_left_turn",
    "tv_overtake_negotiation",
    "tv_highway_merge",
    "tv_highway_exit",
)
INTERDRIVE_SCENARIOS = (
    "ic_straight_straight",
    "ic_straight_left",
    "ic_opposite_lane",
    "ic_chaos",
    "lm_straight_right",
    "lm_neighbour_lane",
    "lm_left_right",
    "lm_highway_merge",
    "lc_right_straight",
    "lc_highway_change",
)
SCENARIOS = TALKING_VEHICLES_SCENARIOS + INTERDRIVE_SCENARIOS  # jax_drive.sim.scenarios builds each

ADVANTAGE_MODES = ("grpo", "mtgrpo_intra", "mtgrpo_cross")  # MTDrive Table 3

MTDRIVE_PRESETS = ("smoke", "smoke-vlm", "tiny", "cpu-demo", "cpu-study", "paper")
MTDRIVE_POLICIES = ("untrained", "sft", "rl")  # the policies an MTDrive run can evaluate

TALKING_VEHICLES_PRESETS = ("smoke", "cpu-demo", "paper")
COOP_RL_PRESETS = ("smoke", "tiny-study", "tiny-distilled", "cpu-demo", "paper")  # jax-drive coop-rl
BASELINES = ("rule_based", "silent")  # the non-language policies of jax_drive.coop.baselines
LEARNING_METHODS = ("reflection", "correction_rag", "debrief")  # CoopReflect's in-context learning
LLM_METHODS = ("zero_shot_silent", "zero_shot") + LEARNING_METHODS
TALKING_VEHICLES_METHODS = BASELINES + LLM_METHODS + ("central_memory", "distilled")

INTERDRIVE_PRESETS = ("smoke", "tiny-rl", "cpu-demo", "paper")
INTERDRIVE_ARMS = ("1_no_negotiation", "2_no_grouping", "3_grouping", "4_critic_se", "5_consensus")  # Table 2
INTERDRIVE_STAGES = ("data", "sft", "probe", "rl", "eval", "fig5", "render", "report")


def check_names(what: str, names, expected) -> None:
    """Raises RuntimeError when a registry's keys are not the listed names (in order)."""
    if tuple(names) != tuple(expected):
        raise RuntimeError(f"{what}: {tuple(names)} differ from jax_drive.names: {tuple(expected)}")
