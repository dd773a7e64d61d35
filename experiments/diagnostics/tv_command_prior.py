"""Diagnostic: which command SmolLM2 gives TalkingVehicles' drivers, read as its masked
distribution over the seven commands, and whether the order the prompt lists them in moves it.

Under the action grammar SmolLM2-135M answered ``go`` in 100 % of its silent decisions and
85 % of its talking ones, and both rows scored what ``keep`` scores (docs/talking_vehicles.md).
``go`` is the first command the role text lists. This reads, on real decision prompts, the
probability of each command after ``{"command": "`` under the commands-only mask
(:func:`jax_drive.sampling.options.option_probabilities`, no sampling), at temperature 1 (the
model's distribution) and at the agents' sampling temperature (what the sampler draws from),
with the commands listed as the prompts list them and in reverse order: if the favourite
follows the order, the model reads the list, not the scene.

Protocol (fixed before the run): the ``cpu-demo`` preset's agents and model; the decision
prompts of its evaluation episodes of seed 0 (both episodes of each of the six scenarios,
nominal), recorded while every agent keeps its command and says nothing (the keep-only
fallback drives like ``go`` here; so talking prompts carry no received messages); moving
agents only (a stopped vehicle's command is ignored); per scenario ``--per-scenario`` prompts
(default 4) evenly spaced over the recorded ones; the talking and the silent prompt; the listed
order and its reverse.

Usage:
  python experiments/diagnostics/tv_command_prior.py --json experiments/results/talking_vehicles/command_prior.json
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from tqdm import tqdm

from jax_drive.runinfo import (add_output_args, command_line, require_min, run_main, run_metadata,
                               script_environment, write_json)

script_environment()

LISTED = "go, stop, slow down, speed up, change lane left, change lane right, keep"
CONTEXT = '{"command": "'


def recording_empty():
    """An engine that answers nothing (so every agent keeps its command and says nothing) and
    keeps every prompt in ``conversations``."""
    from jax_drive.pipelines.talking_vehicles.evaluation import EmptyAnswers

    class RecordingEmpty(EmptyAnswers):
        def __init__(self):
            self.conversations: list[list[dict]] = []

        def generate_chat(self, conversations, params, key):
            self.conversations += [list(c) for c in conversations]
            return super().generate_chat(conversations, params, key)

    return RecordingEmpty()


def decision_prompts(preset, communicate: bool) -> dict[str, list[list[dict]]]:
    """{scenario: the moving agents' decision prompts of seed 0's evaluation episodes}."""
    import dataclasses

    from jax_drive.coop.agent import LanguagePolicy
    from jax_drive.coop.learning import run_specs
    from jax_drive.pipelines.talking_vehicles.evaluation import eval_specs

    out = {}
    for scenario in preset.scenarios:
        engine = recording_empty()
        agent = dataclasses.replace(preset.agent, communicate=communicate, constrain_answers=False)
        specs = [s for s in eval_specs(preset, "zero_shot") if s.seed == 0 and s.scenario == scenario]
        run_specs(specs, LanguagePolicy(engine, agent, name="record"), max_time=preset.max_time)
        out[scenario] = [c for c in engine.conversations if LISTED in c[0]["content"]]  # stopped agents: no list
    return out


def reorder(conversation: list[dict], order: tuple[str, ...]) -> list[dict]:
    """The conversation with the role text's command list in ``order``."""
    system = conversation[0]["content"].replace(LISTED, ", ".join(order))
    return [{"role": "system", "content": system}, *conversation[1:]]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-scenario", type=int, default=4, help="prompts per scenario (default 4)")
    parser.add_argument("--batch", type=int, default=4, help="prompts per forward pass (default 4)")
    add_output_args(parser, json_required=True)
    args = parser.parse_args(argv)
    require_min(1, per_scenario=args.per_scenario, batch=args.batch)

    from jax_drive.coop.agent import COMMANDS
    from jax_drive.pipelines.talking_vehicles import PRESETS, Engines
    from jax_drive.sampling.options import option_probabilities

    preset = PRESETS["cpu-demo"]
    commands = tuple(COMMANDS)
    orders = {"listed": commands, "reversed": commands[::-1]}
    temperatures = {"t1": 1.0, "agent": preset.agent.temperature}
    model, tokenizer = Engines(preset).local_model()
    results = {}
    start = time.perf_counter()
    for setting, communicate in (("comm", True), ("silent", False)):
        recorded = decision_prompts(preset, communicate)
        picked = {s: [convs[int(k)] for k in np.linspace(0, len(convs) - 1, min(args.per_scenario, len(convs)))]
                  for s, convs in recorded.items() if convs}
        for order_name, order in orders.items():
            rows = [(s, reorder(c, order)) for s, convs in picked.items() for c in convs]
            ids = [tokenizer.encode(tokenizer.apply_chat_template(c, add_generation_prompt=True)) for _, c in rows]
            name = f"{setting}/{order_name}"
            results[name] = {"prompts": len(rows), "prompt_tokens_mean": float(np.mean([len(i) for i in ids]))}
            for label, temperature in temperatures.items():
                probs = np.concatenate([
                    option_probabilities(model, tokenizer, ids[k: k + args.batch], CONTEXT, commands, temperature)
                    for k in tqdm(range(0, len(ids), args.batch), desc=f"{name} T={temperature:g}",
                                  disable=args.no_progress)])
                results[name][label] = summarise(probs, [s for s, _ in rows], commands)
                line = ", ".join(f"{c} {v:.2f}" for c, v in results[name][label]["mean_probability"].items())
                print(f"{name:15s} T={temperature:<4g}: {line}; entropy "
                      f"{results[name][label]['entropy_nats_mean']:.2f} nats", file=sys.stderr)
    write_json(args.json, {"command": command_line(__file__, argv), "preset": "cpu-demo", "model": preset.model,
                           "context": CONTEXT, "orders": {k: list(v) for k, v in orders.items()},
                           "temperatures": temperatures, "per_scenario": args.per_scenario, "results": results,
                           "wall_seconds": time.perf_counter() - start,
                           "meta": run_metadata(benchmark="tv_command_prior")})
    _plot(results, commands, args.json.rsplit(".", 1)[0] + ".png")
    return 0


def summarise(probs: np.ndarray, scenarios: list[str], commands: tuple[str, ...]) -> dict:
    """Mean probability and favourite share per command, mean entropy and p(go) per scenario
    of (N, C) option probabilities of N prompts (``scenarios``: each prompt's)."""
    entropy = -(probs * np.log(np.clip(probs, 1e-12, None))).sum(axis=1)
    favourite, go = probs.argmax(axis=1), commands.index("go")
    return {"mean_probability": {c: float(probs[:, j].mean()) for j, c in enumerate(commands)},
            "favourite_share": {c: float(np.mean(favourite == j)) for j, c in enumerate(commands)},
            "entropy_nats_mean": float(entropy.mean()),
            "go_probability_by_scenario": {s: float(probs[[k for k, sc in enumerate(scenarios) if sc == s], go].mean())
                                           for s in dict.fromkeys(scenarios)}}


def _plot(results: dict, commands: tuple[str, ...], path: str) -> None:
    """Mean probability of each command at temperature 1, one bar per (setting, order)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    x, width = np.arange(len(commands)), 0.8 / len(results)
    for k, (name, r) in enumerate(results.items()):
        ax.bar(x + (k - (len(results) - 1) / 2) * width, [r["t1"]["mean_probability"][c] for c in commands], width,
               label=name)
    ax.set_xticks(x, commands, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("mean probability")
    ax.set_ylim(0, 1)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, title="prompt / command order", title_fontsize=7)
    ax.set_title("SmolLM2-135M's masked command distribution on TalkingVehicles decision prompts (T = 1)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(run_main(main))
