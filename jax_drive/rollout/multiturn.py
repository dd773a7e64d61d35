"""MTDrive's multi-turn rollout: generate -> parse -> score (PDM) -> feed back -> repeat.

For S scenes and G rollouts each (R = S * G rows, row ``r = s * G + g``):

1. turn-1 prompt (the planning prompt in the policy's chat template) -> ``engine.generate``
   on token ids, one completion per row (the G rows of a scene share the prompt, so a
   sampler with shared-prefix prefill computes its cache once);
2. parse each answer once (:func:`jax_drive.text.format_score.check_answer`: poses,
   usable, format score);
3. score every row of the batch in **one** jitted call
   ``jax_drive.pdm.score_proposals(scenes, proposals (S, G, 8, 3), reference (S, 40, 3))``
   against a precomputed PDM-Closed reference;
4. reward ``r = w_p * PDMS + w_f * format`` (0.8 / 0.2; :func:`jax_drive.rollout.reward.turn_rewards`,
   once for the whole (S, G, N) batch after the last turn);
5. feedback: the PDM Agent message (:func:`jax_drive.text.feedback.feedback_message`) of
   the violated NC / DAC / TTC points; an **unusable answer** (not parseable, or outside the
   plausible range of :class:`jax_drive.text.FormatConfig`) scores format 0 and PDMS 0 and
   gets :data:`FORMAT_FEEDBACK`, asking for the required format;
6. a row stops when its feedback is empty (no violation), when it used ``max_turns`` turns,
   or when the next turn would not fit in ``max_context_tokens``; otherwise the feedback is
   appended as a user message and the row continues.

Engines that keep state between turns (:func:`jax_drive.sampling.supports_sessions`, e.g.
``JaxEngine``) run turn 1 with ``engine.start`` and every later turn with
``session.extend``, which receives only the appended close / feedback / generation-header
ids and prefills just those into each row's kept KV cache (with the engine's prompt-lookup
speculative decoding, if it has one, on these refinement turns). Other engines (HTTP
servers) get each live row's whole context every turn. Both paths give the same greedy
rollouts (tested against each other).

Token bookkeeping: a row's token sequence is exactly what the policy saw and produced:
prompt ids, then for each turn the **sampled ids** (never re-tokenised text), then the
closing/feedback/generation-header ids the chat template adds. Every token carries a turn id
(-1 for prompt and feedback tokens, j for the tokens generated in turn j) and the sampling
log-prob, so the update step puts loss only on generated tokens and maps each token to its
turn's advantage.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import numpy as np

from jax_drive.configs import at_least
from jax_drive.rollout.images import prompt_image_inputs
from jax_drive.rollout.result import SUB_SCORES, RolloutResult, Transcript, TurnRecord
from jax_drive.rollout.reward import turn_rewards
from jax_drive.sampling import SamplingParams, supports_sessions
from jax_drive.text import FormatConfig, PromptConfig, planning_prompt
from jax_drive.text.caption import CaptionConfig
from jax_drive.text.feedback import FORMAT_FEEDBACK, feedback_message, select, violations_to_numpy
from jax_drive.text.format_score import check_answer
from jax_drive.types import NUM_OUTPUT_POSES, Scene

_ANSWER_SENTINEL = "\u2063ANSWER\u2063"
_FEEDBACK_SENTINEL = "\u2063FEEDBACK\u2063"


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """Multi-turn rollout settings (MTDrive: G = 8, 6 turns, reward 0.8 PDMS + 0.2 format).

    Attributes:
      group_size: G rollouts per scene.
      max_turns: N, the turn budget.
      pdms_weight, format_weight: reward weights w_p, w_f.
      improvement_weight: refinement bonus alpha: turn j > 1 also earns alpha times its
        reward gain over turn j - 1 (SCoRe's shaping; 0 = MTDrive's Eq. 2, the default).
      sampling: decoding settings (``n`` is ignored: one completion per row; logprobs_mode
        'raw' gives log pi(token | prefix) of the policy).
      prompt: planning prompt options (default text-only: the scene is captioned).
      format: plausibility ranges of a usable answer.
      system_prompt: optional system message.
      max_context_tokens: a row stops before a turn whose context (+ max_new_tokens) would
        exceed this (MTDrive trains with 11,500 tokens).
      format_feedback: the user message after an unusable answer.
      caption: scene caption options, used when ``prompt.perception == "text"`` (must match
        the caption of the SFT data, ``BuildConfig.caption``).
      use_sessions: continue rows through the engine's session (KV caches kept between
        turns) when it has one (default True); False sends whole contexts every turn.
      constrain_answers: sample every answer under MTDrive's trajectory grammar
        (``sampling.grammar.trajectory_grammar`` with this config's ``format`` ranges: exactly
        what ``text.codec.format_trajectory`` writes, so every answer is usable); the sampler
        and the trainer then use the masked policy (docs/structured.md). ``sampling.
        max_new_tokens`` must hold the grammar's shortest answer (SmolLM2: 128 tokens).
        Default False (MTDrive's unconstrained setting).
      canonical_literals: with ``constrain_answers``, the grammar's fixed text is spelled only
        as the tokenizer spells it (more tokens forced: jump-forward skips them). Keep True
        for ``JaxEngine``; set False with a remote server, whose grammar allows every spelling
        (the trainer then replays the server's automaton exactly).
    """

    group_size: int = 8
    max_turns: int = 6
    pdms_weight: float = 0.8
    format_weight: float = 0.2
    improvement_weight: float = 0.0
    sampling: SamplingParams = SamplingParams(max_new_tokens=256, temperature=1.0)
    prompt: PromptConfig = PromptConfig(perception="text", image_placeholder=False)
    format: FormatConfig = FormatConfig()
    system_prompt: str | None = None
    max_context_tokens: int = 11_500
    format_feedback: str = FORMAT_FEEDBACK
    caption: CaptionConfig = CaptionConfig()
    use_sessions: bool = True
    constrain_answers: bool = False
    canonical_literals: bool = True

    def __post_init__(self):
        if not self.format_feedback:
            raise ValueError("format_feedback must be non-empty (an empty feedback ends the rollout)")
        at_least(self, 1, "group_size", "max_turns")
        at_least(self, 2, "max_context_tokens")
        if not self.improvement_weight >= 0:  # also refuses NaN
            raise ValueError(f"improvement_weight must be >= 0, got {self.improvement_weight}")
        if self.constrain_answers and self.sampling.grammar is not None:
            raise ValueError("constrain_answers sets the grammar: leave sampling.grammar None")

    def answer_grammar(self):
        """The grammar every answer is sampled under (None when not ``constrain_answers``)."""
        if not self.constrain_answers:
            return None
        from jax_drive.sampling.grammar import trajectory_grammar

        return trajectory_grammar(ranges=self.format).canonical(self.canonical_literals)

    @property
    def answer_sampling(self) -> SamplingParams:
        """The decoding settings of every turn: ``sampling`` with one completion per row and
        the answer grammar."""
        return self.sampling.replace(n=1, grammar=self.answer_grammar() or self.sampling.grammar)


# ------------------------------------------------------------------------------ prompts
def scene_prompts(scenes: Scene, config: PromptConfig = PromptConfig(perception="text", image_placeholder=False),
                  caption: CaptionConfig = CaptionConfig()) -> list[str]:
    """Turn-1 user prompts of S scenes (batched Scene with one leading dim); ``caption``
    sets the scene description when ``config.perception == "text"``."""
    history = np.asarray(jax.device_get(scenes.ego.history_poses))
    command = np.asarray(jax.device_get(scenes.command))
    if history.ndim != 3:
        raise ValueError(f"scenes must have exactly one batch dim, got history_poses {history.shape}")
    captions = [None] * history.shape[0]
    if config.perception == "text":
        from jax_drive.text.caption import caption_scenes

        captions = caption_scenes(scenes, caption)
    return [planning_prompt(history[i], command[i], config, captions[i]) for i in range(history.shape[0])]


def first_turn_messages(prompt: str, system_prompt: str | None = None) -> list[dict]:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user", "content": prompt}]


@dataclasses.dataclass(frozen=True)
class ChatContinuation:
    """How the chat template continues after an assistant answer with a user message.

    ``close`` is the text the template writes right after the answer's content (e.g.
    ``<|im_end|>\\n``); ``user_head`` / ``user_tail`` wrap the feedback content and end with
    the next assistant generation header.
    """

    close: str
    user_head: str
    user_tail: str
    eos_texts: tuple[str, ...]

    @classmethod
    def from_tokenizer(cls, tokenizer, system_prompt: str | None = None) -> "ChatContinuation":
        base = first_turn_messages("question", system_prompt)
        with_answer = base + [{"role": "assistant", "content": _ANSWER_SENTINEL}]
        a = tokenizer.apply_chat_template(with_answer, add_generation_prompt=False)
        b = tokenizer.apply_chat_template(with_answer + [{"role": "user", "content": _FEEDBACK_SENTINEL}],
                                          add_generation_prompt=True)
        if not b.startswith(a) or a.count(_ANSWER_SENTINEL) != 1 or b.count(_FEEDBACK_SENTINEL) != 1:
            raise ValueError("the chat template is not append-only; cannot continue a conversation in tokens")
        close = a[a.index(_ANSWER_SENTINEL) + len(_ANSWER_SENTINEL):]
        head, tail = b[len(a):].split(_FEEDBACK_SENTINEL)
        eos = tuple(tokenizer.decode([i], skip_special_tokens=False) for i in tokenizer.eos_token_ids)
        return cls(close=close, user_head=head, user_tail=tail, eos_texts=eos)

    def text(self, feedback: str, ended_with_eos: bool, eos_text: str = "") -> str:
        """Text to append after a completion: the rest of the close marker, then the user turn."""
        close = self.close
        if ended_with_eos and eos_text and close.startswith(eos_text):
            close = close[len(eos_text):]
        return close + self.user_head + feedback + self.user_tail


# ------------------------------------------------------------------------------ rollout
def compute_reference(scenes: Scene, pdm_config=None):
    """PDM-Closed reference poses (S, 40, 3) at 0.1 .. 4.0 s for the scorer."""
    from jax_drive.planners.pdm_closed import PDMClosedConfig, pdm_closed

    config = PDMClosedConfig() if pdm_config is None else PDMClosedConfig(pdm=pdm_config)
    return pdm_closed(scenes, config).poses


@dataclasses.dataclass
class _RowLog:
    """The growing token sequence and turns of one row (host side, during the rollout)."""

    tokens: list[int]
    turn_ids: list[int]
    logprobs: list[float]
    turns: list[TurnRecord]
    images: tuple = ()  # the prompt's processed images

    def extend(self, ids: Sequence[int], turn: int, logprobs: Sequence[float] | None = None) -> None:
        self.tokens.extend(ids)
        self.turn_ids.extend([turn] * len(ids))
        self.logprobs.extend([0.0] * len(ids) if logprobs is None else [float(x) for x in logprobs])

    def transcript(self) -> Transcript:
        return Transcript(tokens=np.asarray(self.tokens, np.int32), turn_ids=np.asarray(self.turn_ids, np.int32),
                          sample_logprobs=np.asarray(self.logprobs, np.float32), turns=tuple(self.turns),
                          images=self.images)


class _TurnGenerator:
    """Generates each turn for the live rows: through an engine session (turn 1 ``start``,
    then ``extend`` with only the appended ids) or, without one, from whole contexts."""

    def __init__(self, engine, sampling: SamplingParams, use_sessions: bool, with_images: bool = False):
        self.engine = engine
        self.sampling = sampling
        self.use_sessions = use_sessions and supports_sessions(engine)
        self.with_images = with_images  # prompts carry images: the engine gets them (only then)
        self.session = None
        self.session_row: dict[int, int] = {}  # rollout row -> session row

    def __call__(self, live: np.ndarray, logs: list["_RowLog"], appended: dict[int, list[int]], key) -> list:
        """Completions for rows ``live``; ``appended[r]``: ids added to row r since its last turn
        (text only: images belong to the turn-1 prompt)."""
        contexts = [logs[r].tokens for r in live]
        images = {"images": [logs[r].images for r in live]} if self.with_images else {}
        if not self.use_sessions:
            return self.engine.generate(contexts, self.sampling, key, **images)
        if self.session is None:
            self.session, completions = self.engine.start(contexts, self.sampling, key, **images)
            self.session_row = {int(r): i for i, r in enumerate(live)}
            return completions
        extra = [None] * self.session.num_rows
        for r in live:
            extra[self.session_row[int(r)]] = appended[int(r)]
        out = self.session.extend(extra, self.sampling, key)
        return [out[self.session_row[int(r)]] for r in live]

    def close(self) -> None:
        if self.session is not None:
            self.session.close()


def run_rollouts(
    engine,
    tokenizer,
    scenes: Scene,
    key: jax.Array,
    config: RolloutConfig = RolloutConfig(),
    reference: Any = None,
    pdm_config=None,
    prompts: Sequence[str] | None = None,
    progress=None,
    images: Sequence[Sequence[Any]] | None = None,
    on_finished: Callable[[list[int], list[Transcript]], None] | None = None,
) -> RolloutResult:
    """Runs G multi-turn rollouts for each of S scenes.

    Turn 1 goes to ``engine.start`` when the engine supports sessions (and
    ``config.use_sessions``), later turns to ``session.extend`` with only the appended ids;
    otherwise every turn sends each live row's whole context to ``engine.generate``.

    Args:
      engine: implements ``generate(prompts (token-id lists), SamplingParams, key) -> [Completion]``
        (and optionally ``start``, see :class:`jax_drive.sampling.SessionEngine`).
      tokenizer: encode / decode / apply_chat_template / eos_token_ids.
      scenes: Scene with one batch dim (S,).
      key: PRNG key (turn j samples with ``fold_in(key, j)``).
      config: RolloutConfig.
      reference: (S, 40, 3) PDM-Closed poses; computed with ``jax_drive.planners.pdm_closed``
        when None.
      pdm_config: PDMConfig for the scorer (default NAVSIM v1.1).
      prompts: S turn-1 user prompts (default :func:`scene_prompts`).
      progress: optional callable(turn, active_rows) for progress reporting.
      images: S per-scene lists of uint8 images for the prompts' ``<image>`` placeholders
        (default: the front camera when ``config.prompt.uses_images``, else none); they need
        an image tokenizer (``jax_drive.models.qwen2_5_vl.ImageTokenizer``) and an engine
        whose ``generate`` takes ``images``.
      on_finished: optional callable(rows, transcripts) given the rows (r = s * G + g) that
        stopped and their final transcripts as soon as they stop (after each turn; rows that
        cannot start, before the first), so a learner can process them while the others
        still generate (:mod:`jax_drive.rl.streaming`). Every row is reported once.
    Returns:
      RolloutResult.
    """
    from jax_drive.pdm import PDMConfig, score_proposals

    pdm_config = PDMConfig() if pdm_config is None else pdm_config
    num_scenes = int(scenes.command.shape[0])
    g_, n_ = config.group_size, config.max_turns
    if reference is None:
        reference = compute_reference(scenes, pdm_config)
    if prompts is None:
        prompts = scene_prompts(scenes, config.prompt, config.caption)
    if len(prompts) != num_scenes:
        raise ValueError(f"{len(prompts)} prompts for {num_scenes} scenes")
    cont = ChatContinuation.from_tokenizer(tokenizer, config.system_prompt)
    eos_text = {int(i): tokenizer.decode([int(i)], skip_special_tokens=False) for i in tokenizer.eos_token_ids}
    sampling = config.answer_sampling

    prompt_ids = [
        tokenizer.encode(tokenizer.apply_chat_template(first_turn_messages(p, config.system_prompt), add_generation_prompt=True))
        for p in prompts
    ]
    prompt_ids, scene_images = prompt_image_inputs(tokenizer, scenes, config.prompt, images, prompt_ids)
    logs = [_RowLog(list(prompt_ids[r // g_]), [-1] * len(prompt_ids[r // g_]),
                    [0.0] * len(prompt_ids[r // g_]), [], scene_images[r // g_]) for r in range(num_scenes * g_)]
    shape = (num_scenes, g_, n_)
    pdms, fmt = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    turn_mask, usable = np.zeros(shape, bool), np.zeros(shape, bool)
    scores = {name: np.zeros(shape, np.float32) for name in SUB_SCORES}
    stop = np.full((num_scenes, g_), "max_turns", dtype=object)
    active = np.array([len(log.tokens) + sampling.max_new_tokens <= config.max_context_tokens for log in logs])
    stop[~active.reshape(num_scenes, g_)] = "context"

    def report(rows) -> None:
        if on_finished is not None and len(rows):
            on_finished([int(r) for r in rows], [logs[r].transcript() for r in rows])

    report(np.flatnonzero(~active))
    generate = _TurnGenerator(engine, sampling, config.use_sessions, with_images=any(scene_images))
    appended: dict[int, list[int]] = {}  # row -> ids added after its last answer
    try:
        for j in range(n_):
            live = np.flatnonzero(active)
            if live.size == 0:
                break
            if progress is not None:
                progress(j, int(live.size))
            completions = generate(live, logs, appended, jax.random.fold_in(key, j))
            if len(completions) != live.size:
                raise RuntimeError(f"engine returned {len(completions)} completions for {live.size} prompts")
            checks = [check_answer(c.text, config.format) for c in completions]
            proposals = np.zeros((num_scenes, g_, NUM_OUTPUT_POSES, 3), np.float32)
            for r, check in zip(live, checks):
                s, g = divmod(int(r), g_)
                turn_mask[s, g, j], usable[s, g, j], fmt[s, g, j] = True, check.usable, check.format
                if check.usable:
                    proposals[s, g] = check.parsed.poses
            # every row is scored in one call; rows without a usable answer keep PDMS 0
            result = score_proposals(scenes, proposals, reference, pdm_config)
            host = jax.device_get({name: getattr(result, name) for name in SUB_SCORES + ("pdms",)})
            ok = usable[..., j]
            pdms[..., j] = np.where(ok, host["pdms"], 0.0)
            for name in SUB_SCORES:
                scores[name][..., j] = np.where(ok, host[name], 0.0)
            violations = violations_to_numpy(result.violations)
            for r, c, check in zip(live, completions, checks):
                s, g = divmod(int(r), g_)
                log = logs[r]
                feedback = (feedback_message(check.parsed.poses, select(violations, (s, g))) if check.usable
                            else config.format_feedback)
                ids = [int(t) for t in c.token_ids]
                log.extend(ids, j, c.logprobs)
                log.turns.append(TurnRecord(text=c.text, num_tokens=len(ids), finish_reason=c.finish_reason,
                                            feedback=feedback))
                ended = bool(ids) and ids[-1] in eos_text
                if not feedback:
                    stop[s, g], active[r] = "no_violation", False
                elif j == n_ - 1:
                    stop[s, g], active[r] = "max_turns", False
                else:
                    extra = tokenizer.encode(cont.text(feedback, ended, eos_text[ids[-1]] if ended else ""))
                    if len(log.tokens) + len(extra) + sampling.max_new_tokens > config.max_context_tokens:
                        stop[s, g], active[r] = "context", False
                    else:
                        log.extend(extra, -1)
                        appended[int(r)] = extra
            report([r for r in live if not active[r]])
    finally:
        generate.close()

    transcripts = np.empty((num_scenes, g_), dtype=object)
    for r, log in enumerate(logs):
        transcripts[divmod(r, g_)] = log.transcript()
    reward = np.asarray(turn_rewards(pdms, fmt, turn_mask, config.pdms_weight, config.format_weight,
                                     config.improvement_weight), np.float32)
    return RolloutResult(pdms=pdms, format=fmt, reward=reward, turn_mask=turn_mask, usable=usable, scores=scores,
                         stop_reason=stop, transcripts=transcripts)
