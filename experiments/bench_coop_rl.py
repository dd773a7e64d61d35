"""Batched vs per-agent engine calls in the cooperative GRPO training loop: training-rollout
agent-decisions per second and seconds per RL step (rollout + update).

:func:`jax_drive.coop.rl.coop_grpo_train` runs the same S steps (the same episode specs of the
``rl`` split, the same starting weights, the same rollout and mini-batch keys) twice:

  * batched: ONE ``generate_chat`` call per decision for every live agent of every episode of
    the step's G x groups episodes (what the trainer does);
  * per-agent: the same loop whose engine answers each agent with its own ``generate_chat``
    call (:class:`PerAgentEngine` of ``bench_coop.py``; row n's key is the call's key folded
    with n), as a trainer that queries the model agent by agent would.

Every row samples its own tokens, so after the first decision the two paths' episodes (and
the number of decisions they take) part ways; agent-decisions/s is the comparable rate, and
the step times are reported with the decision counts they came from. Each path first runs
its S steps untimed from the starting weights (every shape it uses compiled), then again
from the same weights, timed; the update is the same code in both paths.

    # canonical (the tiny random model; a few minutes on a 2-core CPU):
    nice -n 10 python experiments/bench_coop_rl.py --groups 6 --group-size 4 --steps 3 --max-time 6 --json OUT
    # SmolLM2 with LoRA rank 8 (one 4-episode step of 2 decisions takes ~4 min here, warm-up included):
    python experiments/bench_coop_rl.py --model smollm2-135m-instruct --groups 1 --group-size 2 --steps 1 \
        --max-time 1 --max-rows 8 --json OUT

Heavy imports (JAX, the models) come after the argument checks: bad values exit 2 at once.
"""

from __future__ import annotations

import argparse
import sys

from bench_coop import PerAgentEngine, coop_engine, speedup, write_report  # sibling script (on sys.path when run)
from jax_drive.runinfo import add_output_args, command_line, require_min, run_main, script_environment

script_environment()


class DelegatingPerAgentEngine(PerAgentEngine):
    """:class:`PerAgentEngine` that passes every other attribute (the tokenizer that sizes the
    constrained answers' budget, the sampler settings) through to the wrapped engine."""

    def __getattr__(self, name):
        return getattr(self.engine, name)


def summarise(history: list[dict], inner_calls: int | None) -> dict:
    """Totals of a timed run's step records: agent decisions, engine calls, rollout / update
    seconds, agent-decisions/s of the rollouts and mean seconds per RL step."""
    steps = len(history)
    decisions = sum(r["decisions"] for r in history)
    rollout = sum(r["rollout_seconds"] for r in history)
    update = sum(r["update_seconds"] for r in history)
    calls = sum(r["engine_calls"] for r in history)
    return {"steps": steps, "agent_decisions": decisions, "policy_calls": calls,
            "engine_calls": calls if inner_calls is None else inner_calls,
            "rows_trained": sum(r["rows_trained"] for r in history),
            "rollout_seconds": rollout, "update_seconds": update,
            "agent_decisions_per_s": decisions / max(rollout, 1e-9),
            "step_seconds_mean": (rollout + update) / max(steps, 1),
            "rollout_seconds_mean": rollout / max(steps, 1), "update_seconds_mean": update / max(steps, 1),
            "per_step": [{k: r[k] for k in ("decisions", "engine_calls", "rows_trained", "rollout_seconds",
                                             "update_seconds", "return_mean", "parse_failures")} for r in history]}


def run_path(name: str, model, tokenizer, engine, config, progress: bool) -> dict:
    """The warm-up run then the timed run of one path, both from the model's current weights
    (restored after each)."""
    from flax import nnx

    from jax_drive.coop.rl import coop_grpo_train
    from jax_drive.rl.optim import copy_tree

    start = copy_tree(nnx.state(model))
    per_agent = isinstance(engine, PerAgentEngine)
    histories = []
    for phase in ("warm-up", "timed"):
        if progress:
            print(f"{name}: {phase}", file=sys.stderr)
        if per_agent:
            engine.calls = 0
        result = coop_grpo_train(model, tokenizer, config, engine=engine, progress=progress)
        histories.append(result.history)
        nnx.update(model, copy_tree(start))
    return summarise(histories[1], engine.calls if per_agent else None)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny",
                        help="'tiny' (a random tiny model over the byte tokenizer) or a load_pretrained source, "
                             "e.g. smollm2-135m-instruct")
    parser.add_argument("--groups", type=int, default=4, help="groups per RL step (episode specs)")
    parser.add_argument("--group-size", type=int, default=4, help="G, episodes per group (>= 2)")
    parser.add_argument("--steps", type=int, default=3, help="timed RL steps per path")
    parser.add_argument("--max-time", type=float, default=4.0, help="cap on every training episode's length, s")
    parser.add_argument("--max-rows", type=int, default=64, help="decisions trained per step at most")
    parser.add_argument("--lora-rank", type=int, default=8,
                        help="LoRA rank of a pretrained model (0: train every weight; the tiny model trains every "
                             "weight)")
    parser.add_argument("--seed", type=int, default=0)
    add_output_args(parser, json_required=True)
    args = parser.parse_args(argv)
    require_min(1, groups=args.groups, steps=args.steps, max_rows=args.max_rows)
    require_min(2, group_size=args.group_size)
    require_min(0.5, max_time=args.max_time)
    require_min(0, lora_rank=args.lora_rank)

    from jax_drive.coop.agent import AgentConfig
    from jax_drive.coop.rl import CoopRLConfig
    from jax_drive.pipelines.engines import ModelSpec, load_model
    from jax_drive.rl.optim import OptimConfig
    from jax_drive.sim.scenarios import TALKING_VEHICLES

    lora = 0 if args.model == "tiny" else args.lora_rank
    model, tokenizer = load_model(ModelSpec(args.model, lora_rank=lora))
    episodes = args.groups * args.group_size
    engine = coop_engine(model, tokenizer, episodes)
    agent = AgentConfig(style="compact", temperature=1.0, constrain_answers=True, max_message_chars=40)
    config = CoopRLConfig(agent=agent, scenarios=TALKING_VEHICLES, group_size=args.group_size,
                          groups_per_step=args.groups, steps=args.steps, max_time=args.max_time,
                          optim=OptimConfig(learning_rate=1e-5, trainable="lora" if lora else "full"),
                          max_rows=args.max_rows, minibatch_size=min(32, args.max_rows), seed=args.seed,
                          checkpoint_every=None)
    report = {"benchmark": "bench_coop_rl", "model": args.model, "lora_rank": lora, "groups": args.groups,
              "group_size": args.group_size, "episodes_per_step": episodes, "steps": args.steps,
              "max_time": args.max_time, "max_rows": args.max_rows, "scenarios": list(TALKING_VEHICLES),
              "agent": {"style": agent.style, "temperature": agent.temperature,
                        "constrain_answers": agent.constrain_answers, "max_message_chars": agent.max_message_chars},
              "timing": "coop_grpo_train's own step records of a timed run after an untimed warm-up run of the same "
                        "steps from the same weights; agent-decisions/s = agent decisions / rollout seconds; "
                        "step seconds = rollout + update"}
    progress = not args.no_progress
    report["batched"] = run_path("batched", model, tokenizer, engine, config, progress)
    report["per_agent"] = run_path("per_agent", model, tokenizer, DelegatingPerAgentEngine(engine), config, progress)
    batched, per_agent = report["batched"], report["per_agent"]
    report["speedup"] = {
        "agent_decisions_per_s": speedup(batched["agent_decisions_per_s"], per_agent["agent_decisions_per_s"]),
        "step_seconds": speedup(per_agent["step_seconds_mean"], batched["step_seconds_mean"])}
    return write_report(report, args.json, command_line(__file__, argv),
                        f"batched {batched['agent_decisions_per_s']:.2f} vs per-agent "
                        f"{per_agent['agent_decisions_per_s']:.2f} agent-decisions/s "
                        f"(x{report['speedup']['agent_decisions_per_s']:.2f}); "
                        f"{batched['step_seconds_mean']:.2f} vs {per_agent['step_seconds_mean']:.2f} s per RL step "
                        f"(x{report['speedup']['step_seconds']:.2f})")


if __name__ == "__main__":
    raise SystemExit(run_main(main))
