"""CoLMDriver / InterDrive presets: one frozen :class:`Preset` per setting.

``smoke`` (a random tiny model that cannot negotiate: every stage in minutes, its numbers mean
nothing), ``tiny-rl`` (the negotiator's mtGRPO study with a tiny model on a CPU), ``cpu-demo``
(SmolLM2-135M + LoRA with the compact prompts, one accident-prone episode per type, background
setting and seed) and ``paper`` (a served Qwen2.5-3B-Instruct negotiator, the paper-style
prompts). Any field can be changed per run with ``--set``.
"""

from __future__ import annotations

import dataclasses

from jax_drive.coop.negotiation.consensus import CONSENSUS_SCORES
from jax_drive.names import INTERDRIVE_PRESETS, check_names
from jax_drive.pipelines.engines import EngineSpec, ModelSpec, bucket_range
from jax_drive.rl.optim import OptimConfig
from jax_drive.rl.sft import SFTConfig
from jax_drive.sim import scenarios as S


@dataclasses.dataclass(frozen=True)
class RLSettings:
    """mtGRPO of the negotiator from its SFT start (the ``rl`` stage; off while ``steps`` is 0).

    Training: ``seeds`` training runs of ``steps`` trainer steps, on the same stream of
    training episodes (the preset's ``train_seeds`` and types, accident-prone and safe
    alternating) and from the same LoRA initialisation, each with its own sampling keys, row
    sampling and minibatch order; each step drives ``groups_per_step`` episodes G = ``group_size`` times under arm
    (5), the actor's replies sampled at ``temperature``. Turn reward ``quality_weight`` x the critic's round
    quality (in [0, 1]) + ``driving_weight`` x DS / 100, ``advantage`` estimator; LoRA of the
    preset's rank on the SFT-merged model, ``learning_rate``, K3 KL ``kl_coef``; at most
    ``max_rows`` replies per step; training episodes capped at ``max_time`` s (None: full).
    ``critic``: who sums, scores and criticises the rounds, in training and evaluation: 'sft'
    (the frozen SFT negotiator: CoLMDriver's setting) or 'stated' (the rule critic that reads
    each member's stated intention, :class:`~jax_drive.coop.negotiation.teacher.StatedIntentCritic`:
    where the language-model critic cannot judge, e.g. a tiny model).
    Evaluation: the start (the SFT actor) and each trained actor, greedy, with that critic on
    the preset's evaluation episodes under arm (5), paired over the same episodes.
    """

    steps: int = 0
    critic: str = "sft"
    seeds: tuple[int, ...] = (0, 1, 2)
    group_size: int = 4
    groups_per_step: int = 4
    temperature: float = 1.0
    quality_weight: float = 1.0
    driving_weight: float = 1.0
    advantage: str = "mtgrpo_cross"
    learning_rate: float = 1e-5
    kl_coef: float = 0.01
    max_rows: int = 256
    minibatch_size: int = 32
    max_time: float | None = None


@dataclasses.dataclass(frozen=True)
class Preset:
    """One experiment setting.

    Evaluation: ``types`` x ``backgrounds`` x ``eval_seeds`` x ``episodes_per_seed``
      episodes; ``config`` 'accident' (every episode accident-prone) or 'alternate'.
    Negotiation: prompt ``style``; ``max_rounds`` with a critic, ``rounds_without_critic``
      without; ``radius`` of arm (2); ``negotiate_every`` decisions (5 Hz control);
      ``turns`` 'parallel' (one actor call per round) or 'sequential'.
    Model: ``model`` (load_pretrained source, or 'tiny': a random tiny model); ``actor_tokens`` / ``consensus_tokens``
      generation budgets; greedy decoding at ``temperature`` 0; ``prompt_bucket`` pads
      prompts to a multiple of it; ``engine_batch`` rows per sampler call (None: all).
    Structured answers: ``constrain_answers`` samples the actor replies (``I will ...``, at
      most 18 words; also in the probe), the sum-actions JSON (every group member in order,
      its budget the grammar's longest answer) and the consensus score under their grammars
      (``LLMNegotiator(constrain_answers=True)``, docs/structured.md), so every answer
      parses; the budgets must hold each grammar's shortest answer (byte tokenizer of the
      tiny model: 8 actor, 36 consensus tokens). On in the small-model presets (smoke,
      cpu-demo); off in ``paper`` and to reproduce CoLMDriver's unconstrained prompts
      (``--set constrain_answers=false``).
    Consensus critic: ``consensus_scores`` are the values its score may take (the grammar's
      choices; the teacher's scores in the SFT targets are snapped to the nearest, and the
      consensus targets are selected class-balanced over them); ``consensus_readout``
      'expected' reads the score as the expected value under the model's masked distribution
      over them (constrained answers and a local model; :mod:`jax_drive.coop.negotiation.consensus`),
      'sampled' as the number written. Unconstrained answers are always read as written.
    Small-model path: teacher episodes on ``train_seeds`` (both backgrounds, alternating
      accident-prone and safe, ``train_episodes_per_seed`` per type) with
      ``corrupt_prob``; ``sft_counts`` examples per kind (each at most ``sft_max_chars``
      characters, which bounds the CPU training time); LoRA ``lora_rank`` / ``lora_alpha``;
      ``sft`` trainer settings.
    Fig. 5: ``convergence_groups`` group situations (first negotiations of evaluation
      episodes, collected with the teacher) negotiated for ``max_rounds`` rounds.
    RL: ``rl`` (:class:`RLSettings`), mtGRPO of the negotiator from its SFT start.
    Probe: ``probe_size`` first-round actor prompts of the teacher data that SFT did not
      select, answered greedily: the tuned negotiator's yield decisions against the
      teacher's, in a minute, before hours of closed-loop evaluation.
    """

    name: str
    style: str = "compact"
    types: tuple[str, ...] = S.INTERDRIVE
    backgrounds: tuple[bool, ...] = (False, True)
    eval_seeds: tuple[int, ...] = (0, 1, 2)
    episodes_per_seed: int = 1
    config: str = "accident"
    max_rounds: int = 3
    rounds_without_critic: int = 1
    radius: float = 50.0
    negotiate_every: int = 1
    turns: str = "parallel"
    model: str = "smollm2-135m-instruct"
    actor_tokens: int = 40
    consensus_tokens: int = 32
    temperature: float = 0.0
    prompt_bucket: int = 64
    engine_batch: int | None = None
    train_seeds: tuple[int, ...] = (100, 101, 102, 103)
    train_episodes_per_seed: int = 2
    corrupt_prob: float = 0.35
    sft_counts: tuple[tuple[str, int], ...] = (("actor", 360), ("sum", 120), ("consensus", 120))
    sft_max_chars: int | None = 1000
    lora_rank: int = 16
    lora_alpha: float = 32.0
    sft: SFTConfig = SFTConfig(optim=OptimConfig(learning_rate=5e-4), batch_size=4, max_steps=300, max_length=768,
                               bucket_size=32, checkpoint_every=10)
    convergence_groups: int = 24
    probe_size: int = 128
    constrain_answers: bool = False
    consensus_scores: tuple[int, ...] = CONSENSUS_SCORES
    consensus_readout: str = "expected"
    rl: RLSettings = RLSettings()

    def __post_init__(self):
        if self.rl.critic not in ("sft", "stated"):
            raise ValueError(f"rl.critic must be 'sft' or 'stated', got {self.rl.critic!r}")
        if self.consensus_readout not in ("sampled", "expected"):
            raise ValueError(f"consensus_readout must be 'sampled' or 'expected', got {self.consensus_readout!r}")
        if not self.consensus_scores or not all(0 <= int(v) <= 100 for v in self.consensus_scores):
            raise ValueError(f"consensus_scores must be integers in 0..100, got {self.consensus_scores}")
        overlap = set(self.train_seeds) & set(self.eval_seeds)
        if overlap:
            raise ValueError(f"training and evaluation seeds overlap: {sorted(overlap)}")
        unknown = [t for t in self.types if t not in S.INTERDRIVE]
        if unknown:
            raise ValueError(f"unknown InterDrive types {unknown}")


PRESETS = {
    # A 2-core CPU: SmolLM2-135M + LoRA rank 16, the compact prompts, one accident-prone
    # episode per type, background setting and seed; 600 SFT examples, 300 steps of 4 (two
    # epochs; fewer left a negotiator that always said STOP). Arms 2 and 3 (no critic) talk
    # one round, the paper preset three, so from (3) to (4) the critic adds its extra rounds
    # as well as its feedback.
    "cpu-demo": Preset(name="cpu-demo", constrain_answers=True),
    # The negotiator's mtGRPO study on a 2-core CPU (the protocol fixed before any result): a
    # random tiny model over the byte tokenizer, answers under their grammars, SFT (LoRA rank
    # 32, 600 steps of 4) on the teacher's data, then 10 mtGRPO steps (about 2 min each here)
    # of 4 groups x G 4 full-length training episodes per training seed, 3 training seeds
    # (one process each), the stated-intent rule critic (the tiny model's own critic barely
    # reads the replies: SFT leaves 4.7 nats per byte, probe AUC 0.60); evaluation of the SFT and trained actors on 30 held-out accident-prone episodes
    # (10 types x 3 seeds, no background traffic), greedy.
    "tiny-rl": Preset(name="tiny-rl", backgrounds=(False,), model="tiny", actor_tokens=48, consensus_tokens=40,
                      constrain_answers=True, lora_rank=32, lora_alpha=64.0,
                      sft=SFTConfig(optim=OptimConfig(learning_rate=3e-3), batch_size=4, max_steps=600,
                                    max_length=1536, bucket_size=64, checkpoint_every=50),
                      convergence_groups=8, probe_size=64,
                      rl=RLSettings(steps=10, critic="stated", seeds=(0, 1, 2), group_size=4, groups_per_step=4,
                                    learning_rate=1e-3,
                                    kl_coef=0.01, max_rows=256, minibatch_size=32)),
    # A GPU (vLLM serving Qwen2.5-3B-Instruct, the paper's negotiator size, via --engine
    # openai): the paper-style prompts, four episodes per type and setting and seed
    # alternating accident-prone and safe, three rounds with and without the critic,
    # 20k SFT examples for three epochs at full rank.
    "paper": Preset(name="paper", style="paper", episodes_per_seed=4, config="alternate", rounds_without_critic=3,
                    model="Qwen2.5-3B-Instruct", actor_tokens=64, consensus_tokens=64, prompt_bucket=128,
                    engine_batch=256, train_seeds=tuple(range(100, 140)), train_episodes_per_seed=4,
                    sft_counts=(("actor", 12000), ("sum", 4000), ("consensus", 4000)), sft_max_chars=None,
                    lora_rank=64,
                    lora_alpha=128.0,
                    sft=SFTConfig(optim=OptimConfig(learning_rate=1e-4), batch_size=32, epochs=3, max_length=2048,
                                  bucket_size=64, checkpoint_every=200),
                    convergence_groups=200),
    # A check of every stage in minutes: a random tiny model over the byte tokenizer
    # (it cannot negotiate; its output exercises the parsers' failure paths), two types,
    # one seed, no background traffic, a handful of SFT examples and steps; answers under
    # their grammars (40 consensus tokens hold the consensus grammar's 36-byte shortest answer).
    "smoke": Preset(name="smoke", types=("ic_straight_straight", "ic_straight_left"), backgrounds=(False,),
                    eval_seeds=(0,), max_rounds=2, model="tiny", actor_tokens=8, consensus_tokens=40,
                    constrain_answers=True,
                    train_seeds=(100,), train_episodes_per_seed=1,
                    sft_counts=(("actor", 6), ("sum", 3), ("consensus", 3)), lora_rank=4, lora_alpha=8.0,
                    sft=SFTConfig(optim=OptimConfig(learning_rate=1e-3), batch_size=2, max_steps=2, max_length=1536,
                                  bucket_size=64, checkpoint_every=None),
                    convergence_groups=2, probe_size=4,
                    rl=RLSettings(steps=1, seeds=(0,), group_size=2, groups_per_step=2, learning_rate=1e-3,
                                  max_rows=32, minibatch_size=8, max_time=6.0)),
}
PRESETS = {name: PRESETS[name] for name in INTERDRIVE_PRESETS}
check_names("InterDrive presets", PRESETS, INTERDRIVE_PRESETS)


def model_spec(preset: Preset, adapter_dir: str | None = None, lora: bool = False) -> ModelSpec:
    """The preset's base model, with a trained adapter merged in or (``lora``, training) fresh
    adapters and decoder blocks recomputed in the backward pass (much less memory)."""
    return ModelSpec(preset.model, seed=0, lora_rank=preset.lora_rank if lora else 0, lora_alpha=preset.lora_alpha,
                     lora_seed=1, adapter=adapter_dir, remat_layers=True if lora else None)


def consensus_readout(preset: Preset, engine: str) -> str:
    """The read-out the negotiator uses: the preset's, but 'sampled' wherever 'expected' cannot
    apply (unconstrained answers, a served model)."""
    return preset.consensus_readout if preset.constrain_answers and engine == "jax" else "sampled"


def engine_spec(preset: Preset, url: str | None = None, served_model: str | None = None) -> EngineSpec:
    """The negotiator's engine: local (prompts padded to multiples of ``prompt_bucket``) or the server at ``url``."""
    if url is not None:
        return EngineSpec(kind="openai", url=url, served_model=served_model or preset.model)
    return EngineSpec(prompt_buckets=bucket_range(preset.prompt_bucket, 8192), max_batch=preset.engine_batch)
