"""The negotiator trained with mtGRPO from its SFT start, evaluated against that start.

For each of the preset's ``rl.seeds``: :func:`train_seed` trains LoRA adapters on the
SFT-merged model as the actor (:func:`jax_drive.coop.negotiation.rl.negotiation_mtgrpo_train`,
with the preset's critic, :func:`make_critic`; resumable from its checkpoints) and evaluates
the trained actor, greedy, on the preset's evaluation episodes under arm (5)
(``rl/seed<s>/eval.json``). :func:`evaluate_start` evaluates the SFT actor with the same
critic on the same episodes (``rl/start.json``); :func:`summary` pairs them.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from jax_drive.coop.negotiation.rl import NegotiationRLConfig, TrainedActor, negotiation_mtgrpo_train
from jax_drive.pipelines import engines
from jax_drive.pipelines.coop_rl import paired_difference
from jax_drive.pipelines.interdrive import arms as A
from jax_drive.pipelines.interdrive import negotiator as N
from jax_drive.pipelines.interdrive.presets import Preset, engine_spec
from jax_drive.rl.advantages import AdvantageConfig
from jax_drive.rl.loss import LossConfig
from jax_drive.rl.optim import OptimConfig
from jax_drive.sampling import SamplingParams
from jax_drive.stats import mean_sem

ARM = "5_consensus"  # the closed loop the actor is trained and evaluated in


def rl_config(preset: Preset, seed: int) -> NegotiationRLConfig:
    """The trainer's settings of one training seed."""
    s = preset.rl
    return NegotiationRLConfig(
        types=tuple(preset.types), train_seeds=tuple(preset.train_seeds), negotiation=A.arm_config(ARM, preset),
        group_size=s.group_size, groups_per_step=s.groups_per_step, steps=s.steps, actor_tokens=preset.actor_tokens,
        style=preset.style, temperature=s.temperature, quality_weight=s.quality_weight,
        driving_weight=s.driving_weight, advantage=AdvantageConfig(mode=s.advantage),
        loss=LossConfig(kl_coef=s.kl_coef), optim=OptimConfig(learning_rate=s.learning_rate),
        max_rows=s.max_rows, minibatch_size=s.minibatch_size, max_time=s.max_time, seed=int(seed))


def eval_sampling(preset: Preset) -> SamplingParams:
    """The trained actor's decoding at evaluation: the SFT negotiator's (greedy at the preset's
    temperature, the reply grammar when the preset constrains answers)."""
    from jax_drive.sampling.grammar import actor_reply_grammar

    grammar = actor_reply_grammar(A.arm_config(ARM, preset).rounds.max_words) if preset.constrain_answers else None
    return SamplingParams(max_new_tokens=preset.actor_tokens, temperature=preset.temperature, grammar=grammar)


def episode_rows(details: list[dict], background: bool) -> list[dict]:
    """Per-episode rows {"tag", "ds", "sr"} of a unit's ``episodes_detail`` (SR in percent)."""
    return [{"tag": f"{d['type']}/{d['seed']}/{d['k']}/{'bg' if background else 'nobg'}", "seed": d["seed"],
             "ds": float(d["DS"]), "sr": 100.0 * float(bool(d["success"]))} for d in details]


def settings_record(preset: Preset) -> dict:
    """What an evaluation record is checked against (with the negotiator and closed loop)."""
    return dataclasses.asdict(preset.rl)


def seed_settings(settings: dict) -> dict:
    """The settings one seed's training depends on: all but the step budget (more steps continue
    the training) and the list of seeds (each seed trains alone)."""
    return {k: v for k, v in settings.items() if k not in ("steps", "seeds")}


def make_critic(preset: Preset, sft_negotiator):
    """The critic of training and evaluation (``rl.critic``); ``sft_negotiator()`` builds the
    SFT negotiator only when it is the critic."""
    from jax_drive.coop.negotiation.teacher import StatedIntentCritic

    return StatedIntentCritic() if preset.rl.critic == "stated" else sft_negotiator()


def evaluate_actor(preset: Preset, engine, critic, backgrounds, tick=None) -> list[dict]:
    """Per-episode rows of the actor behind ``engine`` (greedy) with ``critic`` under arm (5) on
    the preset's evaluation episodes of every background setting."""
    actor = TrainedActor(engine, critic, eval_sampling(preset), style=preset.style, name="actor")
    rows = []
    for background in backgrounds:
        result = A.evaluate_policy(A.make_policy(ARM, preset, actor), preset, background, progress=tick)
        rows += episode_rows(A.episodes_detail(*result["results"]), background)
    return rows


def evaluate_start(preset: Preset, adapter: str, critic, backgrounds, tick=None) -> list[dict]:
    """:func:`evaluate_actor` of the SFT start (the adapter folded in)."""
    model, tokenizer = N.load_model(preset, adapter)
    return evaluate_actor(preset, engines.make_engine(engine_spec(preset), model, tokenizer), critic, backgrounds,
                          tick)


def train_seed(preset: Preset, seed: int, adapter: str, critic, out_dir: str, backgrounds, *, progress: bool,
               tick=None) -> dict:
    """Trains one seed's actor from the SFT adapter (resuming its checkpoints) and evaluates
    it. Returns {"rows": per-episode rows, "train": the last step's record, "steps"}."""
    model, tokenizer = N.load_model(preset, adapter, lora=True)
    engine = engines.make_engine(engine_spec(preset), model, tokenizer)
    result = negotiation_mtgrpo_train(model, tokenizer, critic, rl_config(preset, seed), engine=engine,
                                      out_dir=out_dir, resume=True, progress=progress)
    return {"rows": evaluate_actor(preset, engine, critic, backgrounds, tick),
            "train": result.history[-1] if result.history else {}, "steps": int(result.state.step)}


def by_seed_means(rows: list[dict], key: str, seed_of) -> list[float]:
    """Each seed's mean of ``key`` over its rows (``seed_of(row)`` names the seed)."""
    seeds = sorted({seed_of(r) for r in rows})
    return [float(np.mean([r[key] for r in rows if seed_of(r) == s])) for s in seeds]


def summary(sft_rows: list[dict], trained: dict[int, list[dict]]) -> dict:
    """DS / SR of the SFT actor (mean and standard error over evaluation seeds) and of the
    trained ones (over training seeds; per seed with the episodes whose DS or SR changed),
    both with the training critic, the paired difference mtgrpo - sft over the same episodes
    (percentile bootstrap, every training seed kept) and the per-episode rows."""
    out = {"sft": {k: mean_sem(by_seed_means(sft_rows, k, lambda r: r["seed"])) for k in ("ds", "sr")},
           "mtgrpo": {k: mean_sem([float(np.mean([r[k] for r in rows])) for rows in trained.values()])
                      for k in ("ds", "sr")}}
    out["sft"]["seeds"], out["mtgrpo"]["seeds"] = len({r["seed"] for r in sft_rows}), len(trained)
    start = {r["tag"]: r for r in sft_rows}
    out["mtgrpo"]["per_seed"] = {
        str(seed): {"ds": float(np.mean([r["ds"] for r in rows])), "sr": float(np.mean([r["sr"] for r in rows])),
                    "episodes_changed": sum((r["ds"], r["sr"]) != (start[r["tag"]]["ds"], start[r["tag"]]["sr"])
                                            for r in rows)}
        for seed, rows in trained.items()}
    out["mtgrpo_vs_sft"] = {f"{k}_diff": paired_difference(trained, sft_rows, k) for k in ("ds", "sr")}
    out["rows"] = {"sft": sft_rows, **{f"mtgrpo_seed{seed}": rows for seed, rows in trained.items()}}
    return out


def seed_dir(run_dir: str, seed: int) -> str:
    return os.path.join(run_dir, "rl", f"seed{seed}")


def curves(run_dir: str, seeds) -> dict:
    """Each seed's training record per step (step, DS, SR, round quality, turn reward, KL)."""
    from jax_drive.rl.logging import read_jsonl

    keep = ("step", "ds", "sr", "quality_mean", "turn_reward_mean", "kl", "rows_trained")
    out = {}
    for seed in seeds:
        path = os.path.join(seed_dir(run_dir, seed), "metrics.jsonl")
        if os.path.exists(path):
            out[str(seed)] = [{k: h[k] for k in keep if k in h} for h in read_jsonl(path) if "step" in h]
    return out


def plot(result: dict, path: str) -> str:
    """Training curves (turn reward and DS per step, one line per seed) beside the held-out
    DS / SR of sft and mtgrpo with standard errors."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_d, ax_e) = plt.subplots(1, 3, figsize=(13, 3.6))
    for seed, rows in result["curves"].items():
        steps = [r["step"] for r in rows]
        ax_r.plot(steps, [r["turn_reward_mean"] for r in rows], marker="o", label=f"seed {seed}")
        ax_d.plot(steps, [r["ds"] for r in rows], marker="o", label=f"seed {seed}")
    ax_r.set(xlabel="mtGRPO step", ylabel="mean turn reward", title="training groups: turn reward")
    ax_d.set(xlabel="mtGRPO step", ylabel="DS", title="training groups: driving score")
    ax_r.legend(fontsize=8)
    x = np.arange(2)
    for k, (key, label) in enumerate((("ds", "DS"), ("sr", "SR %"))):
        means = [result[m][key]["mean"] for m in ("sft", "mtgrpo")]
        sems = [result[m][key]["sem"] for m in ("sft", "mtgrpo")]
        ax_e.bar(x + 0.38 * k, means, 0.36, yerr=sems, capsize=3, label=label)
    ax_e.set_xticks(x + 0.19, ["sft (start)", "mtgrpo"])
    ax_e.set(title="held-out episodes (arm 5)", ylim=(0, 105))
    ax_e.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
