"""A bounded study of the consensus critic alone: does its score separate negotiations that
ended in agreement from those that did not, before and after a critic-only fine-tune?

Teacher-driven episodes (:class:`~jax_drive.coop.negotiation.RuleTeacher` with its
deliberately wrong first rounds, so that disagreements occur) are recorded on two disjoint
sets of training seeds: the consensus requests of the first are the critic's SFT targets
(snapped to the allowed scores, balanced as the protocol's ``balance`` says), those of the
second are the held-out negotiations (balanced between the teacher's "agreement" and the
rest). The critic
(``LLMNegotiator.consensus_answers``) is probed on them with the base model and with a LoRA
adapter trained on the targets only; each probe reports the separation AUC of the score it
reads out and of the number it sampled (:func:`~jax_drive.pipelines.interdrive.negotiator.critic_discrimination`),
and the same on as many of its own targets (did the fine-tune fit them?).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time

from jax_drive.pipelines.interdrive import negotiator as N
from jax_drive.pipelines.interdrive.presets import Preset


BALANCE_RULES = ("agreement", "score")  # CriticStudy.balance


@dataclasses.dataclass(frozen=True)
class CriticStudy:
    """The study's protocol (fixed before it runs).

    Attributes: train_seeds / probe_seeds: disjoint teacher seeds of the SFT targets and of
    the held-out negotiations (one accident-prone/safe alternating episode per type per seed
    and background setting, as the data stage); train_examples: consensus SFT targets;
    probe_size: held-out negotiations; sft_steps: LoRA steps of the critic-only fine-tune;
    probe_at: earlier steps at which the fine-tune is also probed (one run, resumed: a
    learning curve);
    balance: how the targets are drawn from the distinct recorded prompts: 'agreement'
    (half agreements, half not, :func:`~jax_drive.pipelines.interdrive.negotiator.equal_shares`:
    the rarer side repeated when short; the decision the loop reads at the consensus
    threshold) or 'score' (equal shares per stated score as far as each has distinct
    prompts, no repeats: the first protocol, which left 73 % of its targets at 100).

    The defaults are the third protocol, fixed before it ran. The first was
    ``CriticStudy(train_seeds=(100,), train_examples=120, sft_steps=30, balance="score")``; the
    second stopped at 60 steps (its probe is this one's ``probe_at`` point): the tuned critic
    separated neither the held-out negotiations nor its own targets, an underfit, so the third
    trains five epochs.
    """

    train_seeds: tuple[int, ...] = (100, 102, 103, 104, 105)
    probe_seeds: tuple[int, ...] = (101,)
    train_examples: int = 240
    probe_size: int = 64
    sft_steps: int = 300
    probe_at: tuple[int, ...] = (60,)
    balance: str = "agreement"

    def __post_init__(self):
        if set(self.train_seeds) & set(self.probe_seeds):
            raise ValueError(f"train_seeds {self.train_seeds} and probe_seeds {self.probe_seeds} overlap")
        if min(self.train_examples, self.probe_size, self.sft_steps) < 1:
            raise ValueError("train_examples, probe_size and sft_steps must be >= 1")
        if list(self.probe_at) != sorted(set(self.probe_at)) or not all(0 < k < self.sft_steps for k in self.probe_at):
            raise ValueError(f"probe_at must be increasing steps below sft_steps={self.sft_steps}, got {self.probe_at}")
        if self.balance not in BALANCE_RULES:
            raise ValueError(f"balance must be one of {BALANCE_RULES}, got {self.balance!r}")


def critic_targets(pool: list[dict], study: CriticStudy, consensus_scores) -> list[dict]:
    """The critic's SFT targets drawn from the recorded consensus examples ``pool`` by the
    study's ``balance`` rule (scores snapped to ``consensus_scores``)."""
    if study.balance == "score":
        return N.select_examples(pool, [("consensus", study.train_examples)], consensus_scores=consensus_scores)
    distinct = N.select_examples(pool, [("consensus", len(pool))], consensus_scores=consensus_scores)
    picks = N.equal_shares([N.ended_in_agreement(e) for e in distinct], study.train_examples)
    return [distinct[i] for i in picks]


def consensus_examples(preset: Preset, seeds, progress=None) -> list[dict]:
    """The teacher's recorded consensus examples of episodes on ``seeds``."""
    examples, _ = N.sft_examples(dataclasses.replace(preset, train_seeds=tuple(seeds), train_episodes_per_seed=1),
                                 progress=progress)
    return [e for e in examples if e["kind"] == "consensus"]


def run_critic_study(preset: Preset, study: CriticStudy, out_dir: str, *, progress=None, log=print) -> dict:
    """Records the data, probes the base critic, fine-tunes it on the targets, probes it
    again; returns {"protocol", "data", "base", "sft", "tuned", "seconds"}."""
    from jax_drive.coop.negotiation import LLMNegotiator
    from jax_drive.pipelines import engines
    from jax_drive.pipelines.interdrive.presets import consensus_readout, engine_spec

    start, seconds = time.perf_counter(), {}
    train_pool = consensus_examples(preset, study.train_seeds, progress)
    probe_pool = consensus_examples(preset, study.probe_seeds, progress)
    seconds["record"] = time.perf_counter() - start
    targets = critic_targets(train_pool, study, preset.consensus_scores)
    held_out = N.critic_probe_examples(probe_pool, targets, study.probe_size)
    data = {"recorded": {"train": len(train_pool), "probe": len(probe_pool)},
            "targets": dict(collections.Counter(str(N.consensus_class(e)) for e in targets)),
            "targets_distinct": len({e["messages"][-2]["content"] for e in targets}),
            "targets_agreed": sum(map(N.ended_in_agreement, targets)),
            "held_out": len(held_out), "held_out_agreed": sum(map(N.ended_in_agreement, held_out))}
    log(f"critic study data: {data}")

    # the fit check: as many distinct targets as held-out negotiations, half of them agreements
    distinct = list({e["messages"][-2]["content"]: e for e in targets}.values())
    own = [distinct[i] for i in N.balanced_order([N.ended_in_agreement(e) for e in distinct],
                                                 list(range(len(distinct))))[:study.probe_size]]

    def probe(adapter=None) -> tuple[dict, dict]:
        t = time.perf_counter()
        backend = engines.make_engine(engine_spec(preset), *N.load_model(preset, adapter))
        critic = LLMNegotiator(backend, preset.style, consensus_tokens=preset.consensus_tokens, temperature=0.0,
                               constrain_answers=preset.constrain_answers, consensus_scores=preset.consensus_scores,
                               consensus_readout=consensus_readout(preset, "jax"))
        report, fit = N.critic_discrimination(critic, held_out), N.critic_discrimination(critic, own)
        report["seconds"] = time.perf_counter() - t
        return report, {k: fit[k] for k in ("n", "agreed", "auc", "auc_sampled", "mean_agreed", "mean_not")}

    base, base_fit = probe()
    log(f"base critic: AUC {base['auc']} (sampled {base['auc_sampled']}), on its targets {base_fit['auc']}")
    curve = [{"steps": 0, "auc": base["auc"], "auc_sampled": base["auc_sampled"], "auc_targets": base_fit["auc"]}]
    for steps in (*study.probe_at, study.sft_steps):  # one fine-tune, resumed from each probe point
        sft_preset = dataclasses.replace(preset, sft=dataclasses.replace(preset.sft, max_steps=steps))
        sft = N.finetune(sft_preset, targets, os.path.join(out_dir, "critic_sft"), progress=progress is not None)
        tuned, tuned_fit = probe(sft["adapter"])
        curve.append({"steps": steps, "auc": tuned["auc"], "auc_sampled": tuned["auc_sampled"],
                      "auc_targets": tuned_fit["auc"], "loss_last_10": sft["loss_last_10"]})
        log(f"critic after {steps} steps: AUC {tuned['auc']} (sampled {tuned['auc_sampled']}), "
            f"on its targets {tuned_fit['auc']}")
    seconds["total"] = time.perf_counter() - start
    return {"protocol": dataclasses.asdict(study), "data": data, "base": base, "base_on_targets": base_fit,
            "sft": sft, "tuned": tuned, "tuned_on_targets": tuned_fit, "curve": curve, "seconds": seconds}
