"""TalkingVehicles / CoopReflect presets: one frozen :class:`Preset` per setting.

``smoke`` (a random tiny model, two scenarios, seconds per method; tests), ``cpu-demo`` (the
embedded SmolLM2 on a 2-core CPU: the protocol's minimum episodes, one learning episode per
lane, the distilled student with two DAgger rounds) and ``paper`` (the seed's protocol with a
vLLM-served model as the LLM agents). Any field can be changed per run with ``--set``.
"""

from __future__ import annotations

import dataclasses

from jax_drive.coop.agent import AgentConfig
from jax_drive.coop.distill import StudentConfig
from jax_drive.coop.learning import LearningConfig
from jax_drive.names import BASELINES, TALKING_VEHICLES_PRESETS, check_names
from jax_drive.rl.optim import OptimConfig
from jax_drive.rl.sft import SFTConfig
from jax_drive.sim.scenarios import TALKING_VEHICLES
from jax_drive.sim.variations import check_held_out

# Sampler prompt buckets: multiples of 8 up to 128 (the distilled policy's ~40-token
# prompts pad to 40 or 48, not 64), then coarser.
PROMPT_BUCKETS = tuple(range(16, 129, 8)) + (160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 1024, 1536, 2048,
                                            3072, 4096, 8192)


@dataclasses.dataclass(frozen=True)
class Preset:
    """One experiment setting.

    Attributes:
      name: preset name.
      model: the LLM agents' model: a ``load_pretrained`` source ('smollm2-135m-instruct', a
        directory, a GGUF file) or 'tiny' (random tiny model, tests); with engine 'openai'
        the served model name.
      engine: 'jax' (local JaxEngine) or 'openai' (an OpenAI-compatible server, e.g. vLLM).
      base_url: the server of engine 'openai'.
      server_command: how the paper setting expects the server to be started (documentation).
      scenarios, seeds: evaluation and learning lanes.
      eval_episodes: evaluation episodes per scenario per seed of the LLM methods.
      baseline_eval_episodes, student_eval_episodes: the same for rule_based / silent and for
        the distilled policy (cheaper policies get more episodes; the first ``eval_episodes``
        are the LLM methods' episodes; None = ``eval_episodes``).
      agent: prompts and decoding of the LLM agents (full style). Its ``constrain_answers``
        samples every decision under the action grammar (``{"command": <one of the seven>,
        "message": <at most max_message_chars characters>}``, docs/structured.md), so every
        answer parses, with the answer budget derived from the grammar (its fewest tokens plus
        the message cap, not ``max_new_tokens``). On in the small-model presets (smoke,
        cpu-demo); off in ``paper`` and to reproduce the seed's unconstrained protocol
        (``--set agent.constrain_answers=false``: the ``max_new_tokens`` budget again).
      learning: the learning protocol. Its ``constrain_answers`` samples reflections,
        summaries, debrief turns and corrections under their grammars (``LearningConfig``);
        on in smoke and cpu-demo, off in ``paper``.
      distill_episodes, distill_seeds, distill_epsilons: teacher episodes per scenario per
        seed of the ``distill`` split, one exploration epsilon per distillation seed.
      distill_keep_fraction: share of uninformative teacher decisions kept
        (:func:`~jax_drive.coop.distill.select_informative`).
      dagger_rounds: DAgger rounds after the first student (0 = none): the latest student
        drives ``dagger_episodes`` new episodes per scenario per distillation seed with the
        teacher labelling every state it visits (:func:`~jax_drive.coop.distill.collect_student`),
        and the student is fine-tuned further for ``dagger_epochs`` on the teacher data plus
        every round's labelled data.
      student_model: base model of the distilled policy (local ``load_pretrained`` source).
      student_path: an already distilled policy (a saved model directory) to evaluate
        instead of distilling one ("" = distil).
      student: its fine-tuning; student_agent: its prompts and decoding (compact style;
        unconstrained: the student learns the teacher's format by fine-tuning, and its
        28-token budget is what makes it cheap).
      max_batch: rows per sampler call of the local engine (memory bound; one
        ``generate`` call per decision may run several).
      embed_tokens: texts are cut to this many tokens for retrieval embeddings.
      max_time: optional cap on evaluation episodes' length, s (quick checks; None = each
        scenario's own time limit).
      eval_variations: held-out variations (:mod:`jax_drive.sim.variations`: the same
        episodes in a world scaled outside the training ranges) every method is also
        evaluated on, after the nominal episodes; () = none.
    """

    name: str
    model: str = "smollm2-135m-instruct"
    engine: str = "jax"
    base_url: str = "http://localhost:8000/v1"
    server_command: str = ""
    scenarios: tuple[str, ...] = TALKING_VEHICLES
    seeds: tuple[int, ...] = (0, 1, 2)
    eval_episodes: int = 30
    baseline_eval_episodes: int | None = None
    student_eval_episodes: int | None = None
    agent: AgentConfig = AgentConfig()
    learning: LearningConfig = LearningConfig()
    distill_episodes: int = 10
    distill_seeds: tuple[int, ...] = (0, 1, 2)
    distill_epsilons: tuple[float, ...] = (0.0, 0.1, 0.2)
    distill_keep_fraction: float = 0.2
    dagger_rounds: int = 0
    dagger_episodes: int = 3
    dagger_epochs: int = 1
    student_model: str = "smollm2-135m-instruct"
    student_path: str = ""
    student: StudentConfig = StudentConfig()
    student_agent: AgentConfig = AgentConfig(style="compact", max_new_tokens=28)
    max_batch: int = 128
    embed_tokens: int = 192
    max_time: float | None = None
    eval_variations: tuple[str, ...] = ()

    def __post_init__(self):
        if self.engine not in ("jax", "openai"):
            raise ValueError(f"engine must be 'jax' or 'openai', got {self.engine!r}")
        if len(self.distill_epsilons) != len(self.distill_seeds):
            raise ValueError("one exploration epsilon per distillation seed")
        if min(self.eval_episodes, self.baseline_eval_episodes or 1, self.student_eval_episodes or 1) < 1:
            raise ValueError("evaluation episode counts must be >= 1")
        if self.dagger_rounds < 0 or min(self.dagger_episodes, self.dagger_epochs) < 1:
            raise ValueError("dagger_rounds must be >= 0, dagger_episodes and dagger_epochs >= 1")
        check_held_out(self.eval_variations)

    def episodes_for(self, method: str) -> int:
        """Evaluation episodes per scenario per seed of ``method``."""
        extra = {"distilled": self.student_eval_episodes}.get(method, self.baseline_eval_episodes
                                                               if method in BASELINES else None)
        return max(extra or self.eval_episodes, self.eval_episodes)


# The distilled student's training data repeats each rare command up to this share
# (:func:`jax_drive.coop.distill.balance_commands`).
MIN_COMMAND_SHARE = 0.08


def _presets() -> dict[str, Preset]:
    return {
        # Tests and dry runs: random tiny model, two scenarios, one seed, two episodes cut at 6 s
        # (the distillation teacher's episodes run in full).
        "smoke": Preset(
            name="smoke", model="tiny", student_model="tiny", scenarios=TALKING_VEHICLES[:2], seeds=(0,),
            eval_episodes=2, baseline_eval_episodes=2,
            # the action grammar over the byte tokenizer with a 16-character message: 64 tokens
            agent=AgentConfig(max_new_tokens=8, constrain_answers=True, max_message_chars=16),
            student_agent=AgentConfig(style="compact", max_new_tokens=8),
            learning=LearningConfig(max_episodes=1, solved_streak=1, max_resets=0, reflection_tokens=64,
                                    discussion_tokens=24, constrain_answers=True, memory_words=3,
                                    discussion_words=3, max_time=6.0),
            distill_episodes=2, distill_seeds=(0,), distill_epsilons=(0.0,),
            student=StudentConfig(sft=SFTConfig(optim=OptimConfig(learning_rate=1e-3, trainable="full"),
                                                batch_size=4, max_steps=2, bucket_size=32, max_length=512)),
            max_batch=64, embed_tokens=64, max_time=6.0,
        ),
        # Sized for a 2-core CPU: the protocol's minimum for the SmolLM2 methods (2 episodes
        # per scenario per seed, one accident-prone, one safe), answers under the action
        # grammar, no chain of thought, one learning episode per lane and no reset; the
        # baselines on 10 episodes, the distilled
        # policy on 4. The student: full fine-tuning on the informative decisions of the
        # teacher's episodes with rare commands repeated (without, it rarely changed lanes),
        # then two DAgger rounds (alone it drove into states the teacher never reaches).
        "cpu-demo": Preset(
            name="cpu-demo", eval_episodes=2, baseline_eval_episodes=10, student_eval_episodes=4,
            # every answer parses, in at most 11 + 15 + 80 + 1 = 107 SmolLM2 tokens (the
            # unconstrained 24 tokens are too few for a JSON answer with a sentence-long message)
            agent=AgentConfig(max_new_tokens=24, constrain_answers=True),
            # reflections, summaries and debrief turns under their grammars too: memories of
            # at most 40 + 40 words, turns of at most 50 (the budgets cut them shorter)
            learning=LearningConfig(max_episodes=1, solved_streak=1, max_resets=0, reflection_tokens=128,
                                    discussion_tokens=80, constrain_answers=True),
            distill_episodes=6, distill_seeds=(0, 1, 2), distill_epsilons=(0.0, 0.1, 0.2),
            dagger_rounds=2, dagger_episodes=4,
            student=StudentConfig(sft=SFTConfig(optim=OptimConfig(learning_rate=1e-4, trainable="full"),
                                                batch_size=16, epochs=2, bucket_size=16, max_length=128,
                                                checkpoint_every=20), min_command_share=MIN_COMMAND_SHARE),
            # every row also on the same episodes in a world 1.3x larger and faster (outside the
            # +-3 m / +-0.5 m/s jitter the student's teacher data has)
            eval_variations=("scale1.3",),
        ),
        # The seed's protocol on a GPU: a vLLM-served instruct model as the LLM agents (the seed
        # used gpt-4o-mini), chain of thought on, 60 learning episodes / 20-success streak / 3
        # resets, 30 evaluation episodes x 3 seeds; the distilled SmolLM2 is fine-tuned
        # locally (full, 3 epochs) and evaluated with the JaxEngine.
        "paper": Preset(
            name="paper", model="meta-llama/Llama-3.1-8B-Instruct", engine="openai",
            base_url="http://localhost:8000/v1",
            server_command=("vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 8192 "
                            "--enable-prefix-caching --max-num-seqs 256 --gpu-memory-utilization 0.90 "
                            "--seed 0 --port 8000"),
            eval_episodes=30, baseline_eval_episodes=30,
            agent=AgentConfig(chain_of_thought=True, max_new_tokens=256),
            learning=LearningConfig(),
            distill_episodes=30, distill_seeds=(0, 1, 2), distill_epsilons=(0.0, 0.1, 0.2),
            distill_keep_fraction=0.5,
            student=StudentConfig(sft=SFTConfig(optim=OptimConfig(learning_rate=5e-5, trainable="full"),
                                                batch_size=32, epochs=3, bucket_size=16, max_length=128,
                                                checkpoint_every=200), min_command_share=MIN_COMMAND_SHARE),
            max_batch=512,
        ),
    }


PRESETS = _presets()
check_names("TalkingVehicles presets", PRESETS, TALKING_VEHICLES_PRESETS)
