"""MTDrive's multi-turn rollout: generate -> parse -> score (PDM) -> feed back -> repeat.

For S scenes and G rollouts each (R = S * G rows, row ``r = s * G + g``):

1. turn-1 prompt (the planning prompt in the policy's chat template) -> ``engine.generate``
   on token ids, one completion per row;
2. parse each answer (:func:`jax_drive.text.parse_trajectory`), format score
   (:func:`jax_drive.text.format_score`);
3. score every row of the batch in **one** jitted call
   ``jax_drive.pdm.score_proposals(scenes, proposals (S, G, 8, 3), reference (S, 40, 3))``
   against a precomputed PDM-Closed reference;
4. reward ``r = w_p * PDMS + w_f * format`` (0.8 / 0.2);
5. feedback: the PDM Agent message (:func:`jax_drive.text.feedback.feedback_message`) of
   the violated NC / DAC / TTC points; an **unusable answer** (not parseable, or outside the
   plausible range of :class:`jax_drive.text.FormatConfig`) scores format 0 and PDMS 0 and
   gets :data:`FORMAT_FEEDBACK`, asking for the required format;
6. a row stops when its feedback is empty (no violation), when it used ``max_turns`` turns,
   or when the next turn would not fit in ``max_context_tokens``; otherwise the feedback is
   appended as a user message and the row continues.

Token bookkeeping: a row's token sequence is exactly what the policy saw and produced:
prompt ids, then for each turn the **sampled ids** (never re-tokenised text), then the
closing/feedback/generation-header ids the chat template adds. Every token carries a turn id
(-1 for prompt and feedback tokens, j for the tokens generated in turn j) and the sampling
log-prob, so the update step puts loss only on generated tokens and maps each token to its
turn's advantage.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np

from jax_drive.sampling import SamplingParams
from jax_drive.text import FormatConfig, PromptConfig, format_score, parse_trajectory, planning_prompt
from jax_drive.text.caption import CaptionConfig
from jax_drive.text.feedback import feedback_message, select, violations_to_numpy
from jax_drive.text.format_score import plausible
from jax_drive.types import NUM_OUTPUT_POSES, Scene

FORMAT_FEEDBACK = (
    "Your previous answer could not be used: it did not contain a valid trajectory. "
    "Output exactly 8 trajectory points, each formatted as (x:float, y:float, heading:float), "
    "inside [PT, ...], with 2 decimal places, for example: Here is the planning trajectory "
    "[PT, (+2.50, 0.0, 0.0), ...]."
)
SUB_SCORES = ("nc", "dac", "ttc", "ep", "comfort")
_ANSWER_SENTINEL = "\u2063ANSWER\u2063"
_FEEDBACK_SENTINEL = "\u2063FEEDBACK\u2063"


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """Multi-turn rollout settings (MTDrive: G = 8, 6 turns, reward 0.8 PDMS + 0.2 format).

    Attributes:
      group_size: G rollouts per scene.
      max_turns: N, the turn budget.
      pdms_weight, format_weight: reward weights w_p, w_f.
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
    """

    group_size: int = 8
    max_turns: int = 6
    pdms_weight: float = 0.8
    format_weight: float = 0.2
    sampling: SamplingParams = SamplingParams(max_new_tokens=256, temperature=1.0)
    prompt: PromptConfig = PromptConfig(perception="text", image_placeholder=False)
    format: FormatConfig = FormatConfig()
    system_prompt: str | None = None
    max_context_tokens: int = 11_500
    format_feedback: str = FORMAT_FEEDBACK
    caption: CaptionConfig = CaptionConfig()

    def __post_init__(self):
        if not self.format_feedback:
            raise ValueError("format_feedback must be non-empty (an empty feedback ends the rollout)")
        if self.group_size < 1 or self.max_turns < 1:
            raise ValueError("group_size and max_turns must be >= 1")
        if self.max_context_tokens < 2:
            raise ValueError("max_context_tokens must be >= 2")


@dataclasses.dataclass
class TurnRecord:
    """One turn of one rollout (host side)."""

    text: str
    num_tokens: int
    finish_reason: str
    usable: bool
    format: float
    pdms: float
    reward: float
    feedback: str
    scores: dict[str, float]


@dataclasses.dataclass
class RolloutResult:
    """Everything a step of training or evaluation needs.

    Arrays over (S, G, N) (N = max_turns; entries of missing turns are 0 / False):
      pdms, format, reward, turn_mask, usable, and ``scores[name]`` for nc, dac, ttc, ep, comfort.
    num_turns: (S, G) int32 turns taken. final_pdms: (S, G) PDMS of the last turn taken.
    stop_reason: (S, G) str: 'no_violation', 'max_turns' or 'context'.
    Per row r = s * G + g: ``tokens[r]`` (n_r,) int32, ``turn_ids[r]`` (n_r,) int32 (-1 =
    no loss, j = generated in turn j), ``sample_logprobs[r]`` (n_r,) float32 (0 off-policy
    tokens), ``turns[r]`` list of TurnRecord.
    """

    pdms: np.ndarray
    format: np.ndarray
    reward: np.ndarray
    turn_mask: np.ndarray
    usable: np.ndarray
    scores: dict[str, np.ndarray]
    num_turns: np.ndarray
    final_pdms: np.ndarray
    stop_reason: np.ndarray
    tokens: list[np.ndarray]
    turn_ids: list[np.ndarray]
    sample_logprobs: list[np.ndarray]
    turns: list[list[TurnRecord]]

    @property
    def group_size(self) -> int:
        return int(self.pdms.shape[1])

    @property
    def num_generated_tokens(self) -> int:
        return int(sum(int((t >= 0).sum()) for t in self.turn_ids))


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
def _index_scenes(scenes: Scene, index) -> Scene:
    return jax.tree.map(lambda x: x[index], scenes)


def compute_reference(scenes: Scene, pdm_config=None):
    """PDM-Closed reference poses (S, 40, 3) at 0.1 .. 4.0 s for the scorer."""
    from jax_drive.planners.pdm_closed import PDMClosedConfig, pdm_closed

    config = PDMClosedConfig() if pdm_config is None else PDMClosedConfig(pdm=pdm_config)
    return pdm_closed(scenes, config).poses


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
) -> RolloutResult:
    """Runs G multi-turn rollouts for each of S scenes.

    Args:
      engine: implements ``generate(prompts (token-id lists), SamplingParams, key) -> [Completion]``.
      tokenizer: encode / decode / apply_chat_template / eos_token_ids.
      scenes: Scene with one batch dim (S,).
      key: PRNG key (turn j samples with ``fold_in(key, j)``).
      config: RolloutConfig.
      reference: (S, 40, 3) PDM-Closed poses; computed with ``jax_drive.planners.pdm_closed``
        when None.
      pdm_config: PDMConfig for the scorer (default NAVSIM v1.1).
      prompts: S turn-1 user prompts (default :func:`scene_prompts`).
      progress: optional callable(turn, active_rows) for progress reporting.
    Returns:
      RolloutResult.
    """
    from jax_drive.pdm import PDMConfig, score_proposals

    pdm_config = PDMConfig() if pdm_config is None else pdm_config
    num_scenes = int(np.asarray(scenes.command).shape[0])
    g_, n_ = config.group_size, config.max_turns
    rows = num_scenes * g_
    if reference is None:
        reference = compute_reference(scenes, pdm_config)
    if prompts is None:
        prompts = scene_prompts(scenes, config.prompt, config.caption)
    if len(prompts) != num_scenes:
        raise ValueError(f"{len(prompts)} prompts for {num_scenes} scenes")
    cont = ChatContinuation.from_tokenizer(tokenizer, config.system_prompt)
    eos_ids = set(int(i) for i in tokenizer.eos_token_ids)
    eos_text = {int(i): tokenizer.decode([int(i)], skip_special_tokens=False) for i in eos_ids}
    sampling = config.sampling.replace(n=1)

    prompt_ids = [
        tokenizer.encode(tokenizer.apply_chat_template(first_turn_messages(p, config.system_prompt), add_generation_prompt=True))
        for p in prompts
    ]
    tokens = [list(prompt_ids[r // g_]) for r in range(rows)]
    turn_ids = [[-1] * len(t) for t in tokens]
    logps = [[0.0] * len(t) for t in tokens]
    turns: list[list[TurnRecord]] = [[] for _ in range(rows)]
    shape = (num_scenes, g_, n_)
    pdms, fmt, reward = (np.zeros(shape, np.float32) for _ in range(3))
    turn_mask, usable_arr = np.zeros(shape, bool), np.zeros(shape, bool)
    scores = {name: np.zeros(shape, np.float32) for name in SUB_SCORES}
    stop = np.full((num_scenes, g_), "max_turns", dtype=object)
    active = np.array([len(t) + sampling.max_new_tokens <= config.max_context_tokens for t in tokens])
    stop[~active.reshape(num_scenes, g_)] = "context"

    for j in range(n_):
        live = np.flatnonzero(active)
        if live.size == 0:
            break
        if progress is not None:
            progress(j, int(live.size))
        completions = engine.generate([tokens[r] for r in live], sampling, jax.random.fold_in(key, j))
        if len(completions) != live.size:
            raise RuntimeError(f"engine returned {len(completions)} completions for {live.size} prompts")
        proposals = np.zeros((num_scenes, g_, NUM_OUTPUT_POSES, 3), np.float32)
        parsed_rows = {}
        for r, c in zip(live, completions):
            parsed = parse_trajectory(c.text)
            ok = bool(parsed.ok and plausible(parsed.poses, config.format))
            if ok:
                proposals[r // g_, r % g_] = parsed.poses
            parsed_rows[r] = (c, parsed, ok)
        result = score_proposals(scenes, proposals, reference, pdm_config)
        host = jax.device_get({name: getattr(result, name) for name in SUB_SCORES + ("pdms",)})
        violations = violations_to_numpy(result.violations)
        for r, (c, parsed, ok) in parsed_rows.items():
            s, g = divmod(int(r), g_)
            f = float(format_score(c.text, config.format))
            p = float(host["pdms"][s, g]) if ok else 0.0
            sub = {name: (float(host[name][s, g]) if ok else 0.0) for name in SUB_SCORES}
            rew = config.pdms_weight * p + config.format_weight * f
            if ok:
                feedback = feedback_message(parsed.poses, select(violations, (s, g)))
            else:
                feedback = config.format_feedback
            pdms[s, g, j], fmt[s, g, j], reward[s, g, j] = p, f, rew
            turn_mask[s, g, j], usable_arr[s, g, j] = True, ok
            for name in SUB_SCORES:
                scores[name][s, g, j] = sub[name]
            ids = [int(t) for t in c.token_ids]
            tokens[r].extend(ids)
            turn_ids[r].extend([j] * len(ids))
            logps[r].extend(float(x) for x in c.logprobs)
            ended = bool(ids) and ids[-1] in eos_ids
            if not feedback:
                stop[s, g] = "no_violation"
                active[r] = False
            elif j == n_ - 1:
                stop[s, g] = "max_turns"
                active[r] = False
            else:
                extra = tokenizer.encode(cont.text(feedback, ended, eos_text.get(ids[-1], "") if ended else ""))
                if len(tokens[r]) + len(extra) + sampling.max_new_tokens > config.max_context_tokens:
                    stop[s, g] = "context"
                    active[r] = False
                else:
                    tokens[r].extend(extra)
                    turn_ids[r].extend([-1] * len(extra))
                    logps[r].extend([0.0] * len(extra))
            turns[r].append(TurnRecord(text=c.text, num_tokens=len(ids), finish_reason=c.finish_reason, usable=ok,
                                       format=f, pdms=p, reward=rew, feedback=feedback, scores=sub))

    num_turns = turn_mask.sum(-1).astype(np.int32)
    last = np.maximum(num_turns - 1, 0)
    final_pdms = np.take_along_axis(pdms, last[..., None], axis=-1)[..., 0] * (num_turns > 0)
    return RolloutResult(
        pdms=pdms, format=fmt, reward=reward, turn_mask=turn_mask, usable=usable_arr, scores=scores,
        num_turns=num_turns, final_pdms=final_pdms.astype(np.float32), stop_reason=stop,
        tokens=[np.asarray(t, np.int32) for t in tokens],
        turn_ids=[np.asarray(t, np.int32) for t in turn_ids],
        sample_logprobs=[np.asarray(t, np.float32) for t in logps],
        turns=turns,
    )


# ------------------------------------------------------------------------------ summaries
def summarize(result: RolloutResult) -> dict[str, Any]:
    """Per-step metrics: mean PDMS / format per turn index (over rollouts that reached it),
    PDMS by turn budget (the answer held after j + 1 turns), first- and final-turn PDMS,
    format rate, reward, turns used, sub-scores of the final turn."""
    m = result.turn_mask
    count = m.sum(axis=(0, 1))
    reached = count > 0

    def per_turn(x):
        out = (x * m).sum(axis=(0, 1)) / np.maximum(count, 1)
        return [float(v) if ok else None for v, ok in zip(out, reached)]

    last = np.maximum(result.num_turns - 1, 0)[..., None]
    final = {name: float(np.take_along_axis(v, last, axis=-1).mean()) for name, v in result.scores.items()}
    n = max(int(m.sum()), 1)
    # PDMS of the answer a rollout holds after a budget of j + 1 turns (its last answer if it stopped earlier)
    budget = np.minimum(np.arange(m.shape[-1])[None, None, :], np.maximum(result.num_turns - 1, 0)[..., None])
    by_budget = np.take_along_axis(result.pdms, budget, axis=-1).mean(axis=(0, 1))
    return {
        "pdms_per_turn": per_turn(result.pdms),
        "pdms_by_budget": [float(v) for v in by_budget],
        "format_per_turn": per_turn(result.format),
        "rollouts_per_turn": [int(c) for c in count],
        "pdms_first": float(result.pdms[..., 0].mean()),
        "pdms_final": float(result.final_pdms.mean()),
        "format_rate": float((result.format * m).sum() / n),
        "usable_rate": float((result.usable & m).sum() / n),
        "reward_mean": float((result.reward * m).sum() / n),
        "turns_mean": float(result.num_turns.mean()),
        "stopped_no_violation": float((result.stop_reason == "no_violation").mean()),
        "generated_tokens": result.num_generated_tokens,
        **{f"final_{k}": v for k, v in final.items()},
    }
