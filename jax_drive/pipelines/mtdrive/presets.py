"""MTDrive experiment presets: one frozen :class:`Preset` per setting, and the rollout /
trainer / model / engine configs derived from a preset (so SFT data, RL rollouts and
evaluation share one prompt and caption).

``smoke`` (tiny random model, seconds of compute per stage; tests and CI), ``smoke-vlm``
(the same on a tiny random Qwen2.5-VL whose prompts hold rendered camera images), ``tiny``
(a ~0.8 M-parameter byte-level decoder trained from scratch: the ablations' carrier), ``cpu-demo``
(SmolLM2-135M on a 2-core CPU in about 20 minutes), ``cpu-study`` (the studied CPU recipe
with the best RL result: more SFT steps, format-recovery and on-policy recovery rows, RL on
the scenes whose first answer draws feedback, with a refinement bonus; hours per seed) and
``paper`` (MTDrive section 4). Any field can be changed per run with ``--set PATH=VALUE``
(:mod:`jax_drive.configs`).
"""

from __future__ import annotations

import dataclasses

from jax_drive.names import MTDRIVE_PRESETS, check_names
from jax_drive.parallel import MeshConfig
from jax_drive.pipelines.engines import EngineSpec, ModelSpec, bucket_range
from jax_drive.render.camera import CameraConfig
from jax_drive.rl.advantages import AdvantageConfig
from jax_drive.rl.grpo import GRPOConfig
from jax_drive.rl.loss import LossConfig
from jax_drive.rl.optim import OptimConfig
from jax_drive.rl.sft import SFTConfig
from jax_drive.rollout import RolloutConfig
from jax_drive.sampling import PromptLookup, SamplingParams
from jax_drive.text.caption import CaptionConfig
from jax_drive.text.prompts import PromptConfig

TEXT_PROMPT = PromptConfig(perception="text", image_placeholder=False)
# Byte-level smoke-test models need short prompts: no scene description.
NO_PERCEPTION = PromptConfig(perception="none", image_placeholder=False)
# Compact caption for the CPU demo: the 3 nearest objects within 40 m that are not more than
# 5 m behind the ego (what is behind cannot make the ego at fault), 2 route stations (0, 30 m).
# The planning prompt is then ~550 SmolLM2 tokens instead of ~800 (default caption).
COMPACT_CAPTION = CaptionConfig(max_agents=3, radius=40.0, min_x=-5.0, num_stations=2, station_spacing=30.0)
# The paper preset trains data-parallel on every device present (a 1 x 1 mesh on one device).
ALL_DEVICES = MeshConfig(data=-1)
# MTDrive's camera prompt with a real image: a small front camera (112 x 56, 4 x 8 patches,
# 8 image tokens) for the tiny vision-language smoke model.
SMOKE_IMAGE_PROMPT = PromptConfig(perception="image", camera=CameraConfig(width=112, height=56))
# The smoke presets' answer budget: the trajectory grammar's shortest answer over the tiny
# models' byte tokenizer (173 tokens) and a little room; without the grammar it was 24.
SMOKE_TOKENS = 184


@dataclasses.dataclass(frozen=True)
class Preset:
    """One experiment setting. Defaults of ``paper`` follow MTDrive section 4.

    model: ``load_pretrained`` source ('smollm2-135m-instruct', a safetensors dir, a GGUF
      file), 'tiny' / 'tiny-1m' (random tiny model + byte tokenizer: smoke tests / trained
      from scratch) or 'tiny-vlm' (a random tiny Qwen2.5-VL + the byte tokenizer with image
      tokens).
    lora_rank, lora_alpha: LoRA adapters (rank 0 = full fine-tuning).
    train_scenes: generated training scenes (SFT data and RL prompts are drawn from them).
    eval_scenes, eval_seeds: held-out scenes per evaluation seed.
    sft_single / sft_multi / sft_qa_scenes / sft_recovery: scenes used per SFT data kind
      (recovery: format-recovery samples, :func:`jax_drive.data.builders.build_recovery`; 0 = none).
    sft_onpolicy_scenes, sft_onpolicy_steps: on-policy format recovery after SFT (DAgger-style,
      :func:`jax_drive.data.builders.build_self_recovery`): the SFT policy answers this many
      fresh scenes (greedy first turn); every unusable answer gives an expert row and a
      recovery row with the policy's own answer, as many SFT rows are replayed beside them,
      and SFT continues for ``sft_onpolicy_steps`` steps on that mix. 0 scenes = off
      (default); no unusable answer = no extra step.
    sft: SFT trainer settings. rl: mtGRPO trainer settings.
    max_new_tokens: generation budget per turn (an 8-point answer is about 90 tokens).
    eval_turns: turn budget at evaluation.
    prompt: planning prompt (default: text-only, the scene captioned in item 1).
    caption: scene caption options (SFT data, RL rollouts and evaluation share them).
    seed: training scenes, LoRA init, SFT data order and RL sampling (see :func:`with_seed`).
    prompt_bucket: the sampler pads prompts to a multiple of this (fewer wasted prefill
      tokens than powers of two; each new length compiles once).
    eval_batch: scenes per evaluation rollout call (and the engine's max batch).
    untrained_eval_scenes: the untrained policy is evaluated on the first k scenes of each
      held-out set (None = all); it answers out of format, so every answer runs to
      ``max_new_tokens`` and this stage is the most expensive one per scene.
    curation_scenes: RL curation runs the SFT policy on the first k training scenes (None = all).
    curation_easy_ratio: RL curation keeps all scenes whose first answer draws feedback or
      scores low (categories 1-2) and this many easy scenes (category 3) per such scene
      (``BuildConfig.easy_ratio``; 1.0 = balanced, as MTDrive; 0 = only the hard ones, the
      scenes most likely to reach a refinement turn).
    sft_max_tokens: SFT samples longer than this are left out (None = keep all, truncated at
      ``sft.max_length``); bounds the memory of the (B, H, L, L) attention saved for backward.
    max_context_tokens: RL and evaluation rollouts stop before a turn whose context would
      exceed this (``RolloutConfig.max_context_tokens``).
    remat_layers: recompute decoder blocks in the backward pass (``ModelConfig.remat_layers``);
      on by default: SmolLM2 full fine-tuning at B=2, L=1024 peaked at 4.9 GB instead of
      12.1 GB and ran faster, not slower, on this CPU (``experiments/bench_train.py``).
    frozen_layers: training (SFT and RL) back-propagates only through the blocks above the
      first k (``ModelConfig.frozen_layers``): the LoRA adapters of the top blocks learn, the
      others keep their initial (no-op) value; default 0 (all blocks).
    prompt_lookup: prompt-lookup speculative decoding in the refinement turns of RL and
      evaluation rollouts (``JaxEngine(prompt_lookup=...)``; exact under greedy decoding,
      distribution-preserving under sampling); None = off.
    constrain_answers: every answer of RL rollouts, evaluation and RL curation is sampled
      under MTDrive's trajectory grammar (``RolloutConfig.constrain_answers``,
      docs/structured.md): always 8 well-formed points, so the reward measures driving, not
      format; the trainer scores the masked policy. ``max_new_tokens`` (and the RL
      rollouts') must then hold the grammar's shortest answer: 128 SmolLM2 tokens, 173 for
      the byte tokenizer of the tiny models. On in the small-model presets (smoke,
      smoke-vlm, tiny, cpu-demo, cpu-study); off in ``paper`` (MTDrive's unconstrained setting)
      and to reproduce it (``--set constrain_answers=false``). On-policy recovery
      (``sft_onpolicy_scenes``) then finds no unusable answer and adds no step.
    """

    name: str
    model: str = "smollm2-135m-instruct"
    lora_rank: int = 16
    lora_alpha: float = 32.0
    train_scenes: int = 256
    eval_scenes: int = 32
    eval_seeds: tuple[int, ...] = (0, 1, 2)
    sft_single: int = 128
    sft_multi: int = 128
    sft_qa_scenes: int = 16
    sft_recovery: int = 0
    sft_onpolicy_scenes: int = 0
    sft_onpolicy_steps: int = 16
    sft: SFTConfig = SFTConfig()
    rl: GRPOConfig = GRPOConfig()
    max_new_tokens: int = 112
    eval_turns: int = 3
    hard_fraction: float = 0.3
    prompt: PromptConfig = TEXT_PROMPT
    caption: CaptionConfig = CaptionConfig()
    seed: int = 0
    prompt_bucket: int = 128
    eval_batch: int = 16
    untrained_eval_scenes: int | None = None
    curation_scenes: int | None = None
    curation_easy_ratio: float = 1.0
    sft_max_tokens: int | None = None
    max_context_tokens: int = 11_500
    remat_layers: bool = True
    frozen_layers: int = 0
    prompt_lookup: PromptLookup | None = PromptLookup()
    constrain_answers: bool = False

    def __post_init__(self):
        if self.sft_recovery < 0:
            raise ValueError(f"sft_recovery must be >= 0, got {self.sft_recovery}")
        if self.sft_onpolicy_scenes < 0 or self.sft_onpolicy_steps < 1:
            raise ValueError(f"sft_onpolicy_scenes must be >= 0 and sft_onpolicy_steps >= 1, got "
                             f"{self.sft_onpolicy_scenes} and {self.sft_onpolicy_steps}")
        if self.sft_max_tokens is not None and self.sft_max_tokens < 2:
            raise ValueError(f"sft_max_tokens must be >= 2 (or None: keep all), got {self.sft_max_tokens}")
        if self.curation_scenes is not None and self.curation_scenes < 1:
            raise ValueError(f"curation_scenes must be >= 1 (or None: all), got {self.curation_scenes}")
        if not self.curation_easy_ratio >= 0:  # also refuses NaN
            raise ValueError(f"curation_easy_ratio must be >= 0, got {self.curation_easy_ratio}")


# The fields that only shape training (the budget a study varies with ``--set``); a finished
# run's policies are rebuilt for re-evaluation from its preset's name and seed plus these.
BUDGET_FIELDS = ("sft", "sft_max_tokens", "sft_recovery", "sft_onpolicy_scenes", "sft_onpolicy_steps", "rl",
                 "curation_scenes", "curation_easy_ratio")


def with_seed(preset: Preset, seed: int) -> Preset:
    """The preset with every training seed (scenes, LoRA init, SFT order, RL) set to ``seed``;
    the held-out evaluation scenes do not depend on it."""
    return dataclasses.replace(preset, seed=seed, sft=dataclasses.replace(preset.sft, seed=seed),
                               rl=dataclasses.replace(preset.rl, seed=seed))


def _rollout(group: int, turns: int, max_new_tokens: int, temperature: float,
             prompt: PromptConfig = TEXT_PROMPT, caption: CaptionConfig = CaptionConfig()) -> RolloutConfig:
    # Below T = 1 the trainer scores at T (GRPOConfig.logprob_temperature), so the sampler
    # reports the log-probs of the distribution it drew from.
    mode = "raw" if temperature in (0.0, 1.0) else "processed"
    return RolloutConfig(
        group_size=group,
        max_turns=turns,
        sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, logprobs_mode=mode),
        prompt=prompt,
        caption=caption,
    )


def _presets() -> dict[str, Preset]:
    cpu_rl = GRPOConfig(
        rollout=_rollout(group=4, turns=3, max_new_tokens=112, temperature=1.0),
        advantage=AdvantageConfig(mode="mtgrpo_cross"),
        loss=LossConfig(kl_coef=0.01),
        optim=OptimConfig(learning_rate=2e-5),
        prompts_per_step=4,
        minibatch_size=16,
        ppo_epochs=1,
        steps=8,
        bucket_size=64,
        checkpoint_every=1,  # a killed run loses at most one step (--resume)
    )
    return {
        "smoke": Preset(
            # every scorer / sampler call sees 4 scenes (or 2 x G 2 in RL), so one process compiles few shapes
            name="smoke", model="tiny", lora_rank=4, lora_alpha=8.0, train_scenes=8, eval_scenes=4,
            eval_seeds=(0,), sft_single=4, sft_multi=4, sft_qa_scenes=4, curation_scenes=4,
            sft=SFTConfig(optim=OptimConfig(learning_rate=1e-3), batch_size=4, max_steps=2, bucket_size=64,
                          max_length=2048, checkpoint_every=1),
            # 184 new tokens: the trajectory grammar's shortest answer is 173 byte tokens
            rl=dataclasses.replace(cpu_rl, rollout=_rollout(2, 2, SMOKE_TOKENS, 1.0, NO_PERCEPTION),
                                   prompts_per_step=2, minibatch_size=4, steps=2),
            max_new_tokens=SMOKE_TOKENS, eval_turns=2, prompt=NO_PERCEPTION, constrain_answers=True,
        ),
        # Sized for about 20 minutes on 2 CPU cores: compact caption, 168 new tokens (an
        # 8-point answer is ~140-170 SmolLM2 tokens), 2 turns. LoRA in every block (adapters in
        # the top blocks only did not learn to stop after 8 points). RL without the KL term (two
        # small updates cannot drift far; it saves the reference pass) at T = 0.6 (at T = 1 the
        # briefly tuned model's samples were all out of format: zero gradient); groups without
        # signal skip the update.
        "cpu-demo": Preset(
            name="cpu-demo", lora_rank=8, lora_alpha=16.0, train_scenes=96, eval_scenes=5, eval_seeds=(0, 1, 2),
            sft_single=32, sft_multi=64, sft_qa_scenes=1,
            sft=SFTConfig(optim=OptimConfig(learning_rate=1e-3), batch_size=2, max_steps=32, bucket_size=128,
                          checkpoint_every=1),
            rl=dataclasses.replace(
                cpu_rl, rollout=_rollout(4, 2, 168, 0.6, TEXT_PROMPT, COMPACT_CAPTION), prompts_per_step=1,
                drop_degenerate_groups=True,
                minibatch_size=2, steps=2, optim=OptimConfig(learning_rate=5e-5), recompute_old_logprobs=False,
                loss=LossConfig(kl_coef=0.0), bucket_size=128),
            max_new_tokens=168, eval_turns=2, caption=COMPACT_CAPTION, eval_batch=8, untrained_eval_scenes=1,
            curation_scenes=4, sft_max_tokens=1280, max_context_tokens=1408, constrain_answers=True,
        ),
        # The ablation carrier (MTDrive Table 3, multi- vs single-turn): the same pipeline,
        # scorer, feedback and advantages on a ~0.8 M-parameter byte-level decoder trained
        # from scratch (full fine-tuning): SFT ~19 min, 1-4.5 min per RL arm and seed on this
        # CPU, so an ablation can use 5 seeds. The prompt has no scene description (a byte
        # model this small cannot read a caption in minutes of training): turn 1 sees the
        # ego's history and command, later turns also the PDM Agent's feedback.
        "tiny": Preset(
            name="tiny", model="tiny-1m", lora_rank=0, train_scenes=512, eval_scenes=16, eval_seeds=(0, 1, 2),
            sft_single=512, sft_multi=512, sft_qa_scenes=0,
            sft=SFTConfig(optim=OptimConfig(learning_rate=1e-3, trainable="full"), batch_size=8, max_steps=200,
                          bucket_size=64, max_length=2048, checkpoint_every=50),
            rl=dataclasses.replace(cpu_rl, rollout=_rollout(8, 3, SMOKE_TOKENS, 1.0, NO_PERCEPTION),
                                   optim=OptimConfig(learning_rate=1e-4, trainable="full"), prompts_per_step=2,
                                   minibatch_size=16, steps=10, checkpoint_every=5),
            max_new_tokens=SMOKE_TOKENS, eval_turns=3, prompt=NO_PERCEPTION, constrain_answers=True,
            curation_scenes=64, max_context_tokens=2048,
        ),
        "paper": Preset(
            name="paper", model="Qwen2.5-VL-3B-Instruct", lora_rank=0, train_scenes=100_000, eval_scenes=12_146,
            eval_seeds=(0,), sft_single=100_000, sft_multi=100_000, sft_qa_scenes=10_000,
            sft=SFTConfig(optim=OptimConfig(learning_rate=4e-5, trainable="full"), batch_size=128, epochs=4,
                          checkpoint_every=500, mesh=ALL_DEVICES),
            rl=GRPOConfig(rollout=_rollout(8, 6, 256, 1.0), prompts_per_step=32, minibatch_size=128, steps=300,
                          optim=OptimConfig(learning_rate=1e-6, trainable="full"), mesh=ALL_DEVICES),
            max_new_tokens=256, eval_turns=6,
        ),
    }


def _smoke_vlm(smoke: Preset) -> Preset:
    """The smoke run on a tiny random Qwen2.5-VL: every prompt holds its scene's rendered front
    camera (SFT data, RL curation, rollouts and evaluation; ``rl_config`` / ``eval_config``
    carry the preset's prompt). Without prompt lookup: the random model can sample its own
    image-pad id, which the trainer's M-RoPE batching rejects, and the plain sampler's draws at
    this seed do not contain one (lookup changes the draws; the sampler does not yet mask the
    vision special ids)."""
    return dataclasses.replace(smoke, name="smoke-vlm", model="tiny-vlm", prompt=SMOKE_IMAGE_PROMPT,
                               prompt_lookup=None)


def _cpu_study(demo: Preset) -> Preset:
    """The studied CPU recipe: 96 SFT steps on rows of at most 1,664 tokens with 16
    format-recovery rows, on-policy recovery over 128 fresh scenes (16 more steps), then 20
    mtGRPO steps of 2 prompts at lr 5e-5 on curated scenes whose first answer draws feedback
    (64 candidates, no easy ones), each later turn also earning its reward gain (bonus 1)."""
    rl = dataclasses.replace(demo.rl, steps=20, prompts_per_step=2, optim=OptimConfig(learning_rate=5e-5),
                             rollout=dataclasses.replace(demo.rl.rollout, improvement_weight=1.0))
    return dataclasses.replace(demo, name="cpu-study", sft=dataclasses.replace(demo.sft, max_steps=96),
                               sft_max_tokens=1664, sft_recovery=16, sft_onpolicy_scenes=128, sft_onpolicy_steps=16,
                               rl=rl, curation_scenes=64, curation_easy_ratio=0.0)


PRESETS = _presets()
PRESETS["smoke-vlm"] = _smoke_vlm(PRESETS["smoke"])
PRESETS["cpu-study"] = _cpu_study(PRESETS["cpu-demo"])
PRESETS = {name: PRESETS[name] for name in MTDRIVE_PRESETS}
check_names("MTDrive presets", PRESETS, MTDRIVE_PRESETS)


def model_spec(preset: Preset) -> ModelSpec:
    """The preset's policy: its model with fresh LoRA adapters (A from ``seed + 1``) and its
    training settings."""
    return ModelSpec(preset.model, seed=preset.seed, lora_rank=preset.lora_rank, lora_alpha=preset.lora_alpha,
                     lora_seed=preset.seed + 1, remat_layers=preset.remat_layers, frozen_layers=preset.frozen_layers)


def engine_spec(preset: Preset) -> EngineSpec:
    """The in-process engine of rollouts and evaluation: prompts padded to multiples of
    ``prompt_bucket``, ``eval_batch`` rows per call, the preset's prompt lookup."""
    return EngineSpec(prompt_buckets=bucket_range(preset.prompt_bucket, 32_768), max_batch=preset.eval_batch,
                      prompt_lookup=preset.prompt_lookup)


def eval_config(preset: Preset) -> RolloutConfig:
    """Greedy multi-turn evaluation rollouts (one per scene, ``eval_turns`` turns; under the
    trajectory grammar with ``constrain_answers``)."""
    config = _rollout(group=1, turns=preset.eval_turns, max_new_tokens=preset.max_new_tokens, temperature=0.0,
                      prompt=preset.prompt, caption=preset.caption)
    return dataclasses.replace(config, max_context_tokens=preset.max_context_tokens,
                               constrain_answers=preset.constrain_answers)


def rl_config(preset: Preset, advantage: str | None = None) -> GRPOConfig:
    """The preset's RL settings with its prompt / caption (so RL prompts match the SFT data)."""
    config = preset.rl
    rollout = dataclasses.replace(config.rollout, prompt=preset.prompt, caption=preset.caption,
                                  max_context_tokens=preset.max_context_tokens,
                                  constrain_answers=preset.constrain_answers)
    config = dataclasses.replace(config, rollout=rollout)
    if advantage is not None:
        config = dataclasses.replace(config, advantage=dataclasses.replace(config.advantage, mode=advantage))
    return config
