"""Dataset builders: JSONL records of chat messages for SFT, QA and RL prompt sets.

Every record is a dict ``{"id", "kind", "scene_id", "messages", "meta"}`` (recovery
records add ``"train_on"``) where
``messages`` is a chat conversation (:mod:`jax_drive.text.chat`). Kinds:

* ``single``: [system?] user prompt -> assistant expert trajectory (MTDrive single-turn).
* ``multi``: 2-turn samples bootstrapped from a :class:`FirstTurnPredictor` (appendix B):
  user prompt, assistant first-turn answer, user PDM feedback, assistant expert
  trajectory. Only scenes whose first-turn feedback is non-empty give a sample (an empty
  feedback ends the rollout). With ``BuildConfig.mock_turns`` >= 2, *mock multi-turn*
  samples are added: several independent noisy first-turn answers of the same scene
  (each with its own feedback) stacked as successive turns, ``meta.mock = True``.
* ``recovery``: format recovery (``BuildConfig.format_feedback`` follows a malformed
  answer): user prompt, assistant answer that holds no usable trajectory (the
  constant-velocity answer with a point too many or too few, cut off, or without its
  ``[PT, ...]`` brackets: the ways a small policy fails; a standing ego gives eight equal
  points, where the policy loses count), user format feedback, assistant expert
  trajectory. The record carries ``"train_on": "last"`` so that SFT learns the recovery,
  never the malformed answer (:func:`jax_drive.data.tokens.chat_samples`).
  :func:`build_self_recovery` writes them from a policy's own unusable answers instead.
* ``qa``: PDM-understanding yes/no questions (:mod:`jax_drive.text.qa`), balanced per
  metric.
* ``rl``: prompts only, for RL. Scenes are categorised by the first-turn answer:
  1 = its feedback is non-empty, 2 = else its PDMS < ``low_score_threshold`` (0.8),
  3 = the rest; all of 1 and 2 are kept and ``easy_ratio`` x that many of 3 are sampled.

With ``PromptConfig(perception="image")`` every record also holds ``"images"``: for each
``<image>`` placeholder in its messages, in order, its scene's front camera (uint8
(H, W, 3), :func:`jax_drive.text.prompts.prompt_images`; in memory, not JSON).

The expert trajectory is only ever the final assistant target of SFT records; it never
enters a prompt message (EP is not part of the feedback). Prompts are a function of the
scene without its ``expert`` field; ``tests/test_data_builders.py`` checks this.

Scoring is batched: all first-turn answers of all scenes are scored in one jitted call of
the PDM scorer (proposals (N, P, 8, 3)).
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.configs import at_least
from jax_drive.pdm import PDMConfig, interpolate_poses, score_proposals
from jax_drive.text import chat
from jax_drive.text.caption import CaptionConfig, caption_scenes
from jax_drive.text.codec import ANSWER_PREFIX, format_point, format_trajectory, parse_trajectories
from jax_drive.text.feedback import FORMAT_FEEDBACK, feedback_message, select, violations_to_numpy
from jax_drive.text.format_score import FormatConfig, check_answer
from jax_drive.text.prompts import IMAGE_PLACEHOLDER, SYSTEM_PROMPT, PromptConfig, planning_prompt, prompt_images
from jax_drive.text.qa import QAConfig, qa_candidates, qa_items
from jax_drive.types import NUM_OUTPUT_POSES, OUTPUT_DT, Scene

KINDS = ("single", "multi", "recovery", "qa", "rl")
MALFORMATIONS = ("extra_point", "missing_point", "truncated", "no_brackets")
METRIC_NAMES = ("nc", "dac", "ttc", "ep", "comfort")


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    """Dataset options (defaults follow MTDrive where it says).

    prompt: prompt options (image placeholder, camera / text perception, system message).
    caption: scene captions, used when ``prompt.perception == "text"``.
    qa: QA generation options.
    pdm: scorer constants (NAVSIM v1.1 defaults).
    reference: EP reference for scoring first turns: "pdm_closed" (NAVSIM; needs
      ``jax_drive.planners``), "expert" (the logged expert, only affects EP and therefore
      only the RL categories, never a prompt), or "auto" (pdm_closed when available).
    low_score_threshold: RL category 2 below this first-turn PDMS (0.8, as MTDrive).
    easy_ratio: RL category-3 samples kept per category-1/2 sample (1.0: balanced).
    mock_turns: noisy first-turn answers stacked per mock multi-turn sample (3; < 2 = off).
    noise_lateral: std of the mock answers' lateral offset at 4 s, metres (1.5).
    noise_speed: std of the mock answers' relative speed change (0.25).
    format_feedback: the user message after an unusable answer in recovery records (the
      rollout's :data:`jax_drive.text.feedback.FORMAT_FEEDBACK`; keep both the same).
    """

    prompt: PromptConfig = PromptConfig()
    caption: CaptionConfig = CaptionConfig()
    qa: QAConfig = QAConfig()
    pdm: PDMConfig = PDMConfig()
    reference: str = "auto"
    low_score_threshold: float = 0.8
    easy_ratio: float = 1.0
    mock_turns: int = 3
    noise_lateral: float = 1.5
    noise_speed: float = 0.25
    format_feedback: str = FORMAT_FEEDBACK

    def __post_init__(self):
        if self.reference not in ("auto", "pdm_closed", "expert"):
            raise ValueError(f"reference must be auto, pdm_closed or expert, got {self.reference!r}")
        at_least(self, 0, "easy_ratio")


# ---------------------------------------------------------------------------------------
# first-turn predictors


class FirstTurnPredictor(Protocol):
    """Anything that answers the single-turn prompts of a batch of scenes.

    ``__call__(scene, key, prompts) -> list[str]``: one answer text per scene (scene has
    one leading batch dim N; prompts are the N prompt conversations). A language-model
    policy generates from ``prompts``; analytic planners read ``scene``. Answers are
    parsed with the trajectory codec; unparsable answers are counted and skipped.
    """

    name: str

    def __call__(self, scene: Scene, key: jax.Array, prompts: Sequence[list[dict]]) -> list[str]: ...


def constant_velocity_poses(scene: Scene) -> jax.Array:
    """(..., 8, 3) constant-velocity poses (NAVSIM's constant velocity agent).

    Uses ``jax_drive.planners.constant_velocity`` when that module exists; otherwise the
    same model inline: the rear axle keeps its t0 velocity vector, heading = its direction.
    """
    try:
        from jax_drive.planners import constant_velocity
    except ImportError:
        constant_velocity = None
    if constant_velocity is not None:
        return constant_velocity(scene)
    v = scene.ego.velocity  # (..., 2)
    t = (jnp.arange(NUM_OUTPUT_POSES) + 1.0) * OUTPUT_DT  # (8,)
    speed = jnp.linalg.norm(v, axis=-1)
    heading = jnp.where(speed > 1e-6, jnp.arctan2(v[..., 1], v[..., 0]), 0.0)
    xy = v[..., None, :] * t[:, None]
    return jnp.concatenate([xy, jnp.broadcast_to(heading[..., None, None], xy.shape[:-1] + (1,))], -1)


@dataclasses.dataclass(frozen=True)
class ConstantVelocityPredictor:
    """The constant-velocity model MTDrive used to add 2-turn data (deterministic)."""

    name: str = "constant_velocity"

    def __call__(self, scene: Scene, key: jax.Array, prompts: Sequence[list[dict]]) -> list[str]:
        poses = np.asarray(jax.device_get(constant_velocity_poses(scene)), np.float64)
        return [format_trajectory(p) for p in poses]


def perturb_poses(key: jax.Array, poses: jax.Array, lateral_std: float, speed_std: float) -> jax.Array:
    """Random smooth variants of (..., 8, 3) poses: along-track scale and a lateral drift.

    Each variant scales the positions by ``max(1 + speed_std * n1, 0)`` and adds a lateral
    offset ``lateral_std * n2 * (k / 8)^2`` at pose k (perpendicular to the pose's
    heading); headings follow the new displacement between consecutive poses (kept where
    a step is shorter than 0.1 m). Returns the same shape.
    """
    k1, k2 = jax.random.split(key)
    shape = poses.shape[:-2]
    scale = jnp.maximum(1.0 + speed_std * jax.random.normal(k1, shape), 0.0)
    drift = lateral_std * jax.random.normal(k2, shape)
    frac = (jnp.arange(NUM_OUTPUT_POSES) + 1.0) / NUM_OUTPUT_POSES
    h = poses[..., 2]
    normal = jnp.stack([-jnp.sin(h), jnp.cos(h)], -1)
    xy = poses[..., :2] * scale[..., None, None] + (drift[..., None] * frac**2)[..., None] * normal
    prev = jnp.concatenate([jnp.zeros_like(xy[..., :1, :]), xy[..., :-1, :]], -2)
    step = xy - prev
    moving = jnp.linalg.norm(step, axis=-1) > 0.1
    heading = jnp.where(moving, jnp.arctan2(step[..., 1], step[..., 0]), h)
    return jnp.concatenate([xy, heading[..., None]], -1)


# ---------------------------------------------------------------------------------------
# scoring


def _reference(scene: Scene, config: BuildConfig) -> tuple[jax.Array, str]:
    """(N, 40, 3) EP reference poses at 0.1 .. 4.0 s and the name of what was used."""
    if config.reference in ("auto", "pdm_closed"):
        try:
            from jax_drive.planners import PDMClosedConfig, pdm_closed
        except ImportError:
            if config.reference == "pdm_closed":
                raise
        else:
            return pdm_closed(scene, PDMClosedConfig(pdm=config.pdm)).poses, "pdm_closed"
    states = interpolate_poses(scene, scene.expert, OUTPUT_DT)  # (N, 41, 3)
    return states[..., 1:, :], "expert"


@dataclasses.dataclass
class Scored:
    """Host results of scoring R answers per scene.

    texts: N lists of R answer texts; poses (N, R, 8, 3); ok (N, R) parsed;
    scores: dict metric -> (N, R) float (pdms and METRIC_NAMES), NaN where not ok;
    feedback: N lists of R strings ("" where nothing is violated or not ok);
    reference: which EP reference was used.
    """

    texts: list[list[str]]
    poses: np.ndarray
    ok: np.ndarray
    scores: dict[str, np.ndarray]
    feedback: list[list[str]]
    reference: str


def score_answers(scene: Scene, texts: Sequence[Sequence[str]], config: BuildConfig) -> Scored:
    """Parses N x R answers and scores them all in ONE scorer call; writes the feedback."""
    n = len(texts)
    r = len(texts[0]) if n else 0
    if any(len(t) != r for t in texts):
        raise ValueError("every scene needs the same number of answers")
    flat_poses, flat_ok = parse_trajectories([t for row in texts for t in row])
    poses = flat_poses.reshape(n, r, NUM_OUTPUT_POSES, 3)
    ok = flat_ok.reshape(n, r)
    reference, used = _reference(scene, config)
    result = score_proposals(scene, jnp.asarray(poses, jnp.float32), reference, config.pdm)
    host = jax.device_get(result)
    scores = {}
    for name in ("pdms",) + METRIC_NAMES:
        value = np.asarray(getattr(host, name), np.float64)
        scores[name] = np.where(ok, value, np.nan)
    arrays = violations_to_numpy(host.violations)
    feedback = [
        [feedback_message(poses[i, j], select(arrays, (i, j))) if ok[i, j] else "" for j in range(r)]
        for i in range(n)
    ]
    return Scored([list(t) for t in texts], poses, ok, scores, feedback, used)


# ---------------------------------------------------------------------------------------
# prompts and records


def prompt_conversations(scene: Scene, config: BuildConfig = BuildConfig()) -> list[list[dict]]:
    """The single-turn prompt conversation of each of N scenes (no expert inside)."""
    host = jax.device_get(scene)
    n = int(np.asarray(host.command).shape[0])
    captions = caption_scenes(scene, config.caption) if config.prompt.perception == "text" else [None] * n
    system = SYSTEM_PROMPT if config.prompt.system_prompt else None
    return [
        chat.conversation(
            planning_prompt(host.ego.history_poses[i], host.command[i], config.prompt, captions[i]), system
        )
        for i in range(n)
    ]


def attach_images(records: list[dict], scene: Scene, config: BuildConfig) -> list[dict]:
    """``records`` with their ``"images"`` (see the module docstring) when the prompt holds
    images; unchanged otherwise."""
    images = prompt_images(scene, config.prompt)
    if images is None:
        return records
    by_scene = dict(zip(_scene_ids(scene), images))
    for record in records:
        count = sum(m["content"].count(IMAGE_PLACEHOLDER) for m in record["messages"])
        record["images"] = list(by_scene[record["scene_id"]]) * count
    return records


def _record(kind: str, scene_id: int, index: int, messages: list[dict], **meta) -> dict:
    chat.validate(messages)
    return {"id": f"{kind}-{scene_id:06d}-{index}", "kind": kind, "scene_id": int(scene_id),
            "messages": messages, "meta": meta}


def _expert_texts(scene: Scene) -> list[str]:
    expert = np.asarray(jax.device_get(scene.expert), np.float64)
    return [format_trajectory(p) for p in expert]


def _scene_ids(scene: Scene) -> list[int]:
    return [int(i) for i in np.asarray(jax.device_get(scene.scene_id))]


def build_single(scene: Scene, config: BuildConfig = BuildConfig()) -> list[dict]:
    """Single-turn SFT records: prompt -> expert trajectory."""
    prompts = prompt_conversations(scene, config)
    targets = _expert_texts(scene)
    return attach_images([
        _record("single", sid, 0, chat.add_turn(p, t), turns=1)
        for sid, p, t in zip(_scene_ids(scene), prompts, targets)
    ], scene, config)


def first_turn(
    scene: Scene, predictor: FirstTurnPredictor, key: jax.Array, config: BuildConfig = BuildConfig()
) -> tuple[list[list[dict]], Scored]:
    """Prompts and the scored first-turn answers (R = 1) of N scenes."""
    prompts, answers = _first_answers(scene, predictor, key, config)
    return prompts, score_answers(scene, [[a] for a in answers], config)


def _first_answers(scene: Scene, predictor: FirstTurnPredictor, key: jax.Array,
                   config: BuildConfig) -> tuple[list[list[dict]], list[str]]:
    """The N prompt conversations and the predictor's N answer texts (unscored)."""
    prompts = prompt_conversations(scene, config)
    answers = predictor(scene, key, prompts)
    if len(answers) != len(prompts):
        raise ValueError(f"predictor {predictor.name} returned {len(answers)} answers for {len(prompts)} scenes")
    return prompts, list(answers)


def build_multi(
    scene: Scene, predictor: FirstTurnPredictor, key: jax.Array, config: BuildConfig = BuildConfig()
) -> tuple[list[dict], dict]:
    """2-turn records (+ mock multi-turn records) and statistics for the data card.

    The first-turn answers and the ``mock_turns`` noisy variants of each are scored
    together in one scorer call (R = 1 + mock_turns answers per scene).
    """
    k_first, k_mock = jax.random.split(key)
    prompts, answers = _first_answers(scene, predictor, k_first, config)
    ids = _scene_ids(scene)
    mock_turns = config.mock_turns if config.mock_turns >= 2 else 0
    texts = [[a] for a in answers]
    if mock_turns:
        base, ok = parse_trajectories(answers)
        base = jnp.broadcast_to(jnp.asarray(base, jnp.float32)[:, None], (len(ids), mock_turns, NUM_OUTPUT_POSES, 3))
        noisy = np.asarray(perturb_poses(k_mock, base, config.noise_lateral, config.noise_speed), np.float64)
        for i in range(len(ids)):
            # An unparsable first answer has no variants: repeat it so it stays unparsed.
            texts[i] += [format_trajectory(p) for p in noisy[i]] if ok[i] else [answers[i]] * mock_turns
    scored = score_answers(scene, texts, config)
    targets = _expert_texts(scene)
    records = []
    for i, sid in enumerate(ids):
        fb = scored.feedback[i][0]
        if scored.ok[i, 0] and fb:
            messages = chat.add_turn(chat.add_turn(prompts[i], scored.texts[i][0], fb), targets[i])
            records.append(
                _record("multi", sid, 0, messages, turns=2, mock=False, predictor=predictor.name,
                        first_turn_pdms=float(scored.scores["pdms"][i, 0]))
            )
    stats = {"first_turn": _turn_stats(scored), "two_turn": len(records), "mock": 0}
    for i, sid in enumerate(ids):
        turns = [j for j in range(1, 1 + mock_turns) if scored.ok[i, j] and scored.feedback[i][j]]
        if len(turns) < 2:
            continue
        messages = prompts[i]
        for j in turns:
            messages = chat.add_turn(messages, scored.texts[i][j], scored.feedback[i][j])
        messages = chat.add_turn(messages, targets[i])
        records.append(
            _record("multi", sid, 1, messages, turns=len(turns) + 1, mock=True, predictor=predictor.name)
        )
        stats["mock"] += 1
    return attach_images(records, scene, config), stats


def malformed_answer(poses: np.ndarray, kind: str, cut: int) -> str:
    """An answer written from (8, 3) poses that holds no usable trajectory.

    kind: one of :data:`MALFORMATIONS`: ``extra_point`` repeats pose ``cut`` (9 points),
    ``missing_point`` drops pose ``cut`` (7), ``truncated`` stops after ``cut`` poses,
    mid-list, ``no_brackets`` writes all 8 poses without ``[PT, ...]``. cut in [1, 7].
    """
    poses = np.asarray(poses, np.float64)
    if kind == "extra_point":
        return format_trajectory(np.concatenate([poses[: cut + 1], poses[cut:]]))
    if kind == "missing_point":
        return format_trajectory(np.delete(poses, cut, axis=0))
    if kind == "truncated":
        return f"{ANSWER_PREFIX} [PT, " + ", ".join(format_point(p) for p in poses[:cut]) + ", ("
    if kind == "no_brackets":
        return f"{ANSWER_PREFIX} " + ", ".join(format_point(p) for p in poses) + "."
    raise ValueError(f"unknown malformation {kind!r}; choose from {MALFORMATIONS}")


def build_recovery(scene: Scene, key: jax.Array, config: BuildConfig = BuildConfig()) -> tuple[list[dict], dict]:
    """Format-recovery records (one per scene, malformation drawn per scene) and their
    counts per malformation. The malformed answers are written from the constant-velocity
    poses, not the expert (which only ever is the target); each is checked to be unusable."""
    k_kind, k_cut = jax.random.split(key)
    n = len(_scene_ids(scene))
    kinds = np.asarray(jax.random.randint(k_kind, (n,), 0, len(MALFORMATIONS)))
    cuts = np.asarray(jax.random.randint(k_cut, (n,), 1, NUM_OUTPUT_POSES))
    base = np.asarray(jax.device_get(constant_velocity_poses(scene)), np.float64)
    prompts, targets = prompt_conversations(scene, config), _expert_texts(scene)
    records, counts = [], {k: 0 for k in MALFORMATIONS}
    for i, sid in enumerate(_scene_ids(scene)):
        kind = MALFORMATIONS[int(kinds[i])]
        bad = malformed_answer(base[i], kind, int(cuts[i]))
        if check_answer(bad).usable:  # a bug here would teach the policy to refuse good answers
            raise AssertionError(f"malformation {kind} left a usable answer: {bad!r}")
        records.append(_recovery_record(sid, prompts[i], bad, targets[i], config, malformation=kind))
        counts[kind] += 1
    return attach_images(records, scene, config), counts


def _recovery_record(scene_id: int, prompt: list[dict], bad: str, target: str, config: BuildConfig,
                     **meta) -> dict:
    """prompt, unusable answer, format feedback, expert answer; the loss on the last only."""
    messages = chat.add_turn(chat.add_turn(prompt, bad, config.format_feedback), target)
    record = _record("recovery", scene_id, 0, messages, turns=2, **meta)
    record["train_on"] = "last"
    return record


def build_self_recovery(
    scene: Scene,
    predictor: FirstTurnPredictor,
    key: jax.Array,
    config: BuildConfig = BuildConfig(),
    format_config: FormatConfig = FormatConfig(),
) -> tuple[list[dict], dict]:
    """On-policy format recovery (DAgger-style): the predictor answers each scene's first
    turn; for every answer that is not usable (``check_answer`` with ``format_config``, the
    rollout's rule for sending the format feedback) two records are written: a ``single``
    one (prompt -> expert: the state it failed in, labelled by the expert) and a
    ``recovery`` one with the predictor's OWN answer as the malformed turn (loss on the
    correction only). Scenes answered usably give nothing.

    Returns (records, stats): stats has ``scenes``, ``unusable``, ``scene_ids`` (of the
    unusable answers) and ``answer_chars`` (their lengths, a hint of what went wrong).
    """
    prompts, answers = _first_answers(scene, predictor, key, config)
    targets = _expert_texts(scene)
    records, failed, chars = [], [], []
    for i, sid in enumerate(_scene_ids(scene)):
        if check_answer(answers[i], format_config).usable:
            continue
        failed.append(sid)
        chars.append(len(answers[i]))
        records.append(_record("single", sid, 1, chat.add_turn(prompts[i], targets[i]), turns=1, on_policy=True))
        records.append(_recovery_record(sid, prompts[i], answers[i], targets[i], config, on_policy=True))
    stats = {"scenes": len(prompts), "unusable": len(failed), "scene_ids": failed, "answer_chars": chars}
    return attach_images(records, scene, config), stats


def build_qa(scene: Scene, key: jax.Array, config: BuildConfig = BuildConfig()) -> tuple[list[dict], dict]:
    """PDM-understanding QA records and per-metric yes/no counts."""
    candidates = jax.device_get(qa_candidates(key, scene, config.qa))
    n = len(_scene_ids(scene))
    captions = caption_scenes(scene, config.caption) if config.prompt.perception == "text" else [None] * n
    records, counts = [], {f"{m}_{a}": 0 for m in ("dac", "nc", "ttc") for a in ("yes", "no")}
    for i, sid in enumerate(_scene_ids(scene)):
        for j, item in enumerate(qa_items(candidates, i, config.prompt, captions[i])):
            messages = chat.add_turn(chat.conversation(item["question"]), item["answer"])
            records.append(_record("qa", sid, j, messages, metric=item["metric"], label=item["label"]))
            counts[f"{item['metric']}_{'yes' if item['label'] else 'no'}"] += 1
    return attach_images(records, scene, config), counts


def build_rl(
    scene: Scene, predictor: FirstTurnPredictor, key: jax.Array, config: BuildConfig = BuildConfig()
) -> tuple[list[dict], dict]:
    """Curated RL prompt records (prompt only) and the category counts."""
    k_first, k_pick = jax.random.split(key)
    prompts, scored = first_turn(scene, predictor, k_first, config)
    ids = _scene_ids(scene)
    category = np.full(len(ids), 3, np.int32)
    for i in range(len(ids)):
        if scored.ok[i, 0] and scored.feedback[i][0]:
            category[i] = 1
        elif not scored.ok[i, 0] or scored.scores["pdms"][i, 0] < config.low_score_threshold:
            category[i] = 2  # an unusable first answer counts as low score
    hard = np.flatnonzero(category < 3)
    easy = np.flatnonzero(category == 3)
    n_easy = min(len(easy), int(round(config.easy_ratio * len(hard))))
    order = np.asarray(jax.random.permutation(k_pick, len(easy))) if len(easy) else np.zeros(0, int)
    chosen = np.sort(np.concatenate([hard, easy[order[:n_easy]]]).astype(int))
    records = []
    for i in chosen:
        pdms = scored.scores["pdms"][i, 0]
        records.append(
            _record(
                "rl", ids[i], 0, prompts[i], category=int(category[i]), predictor=predictor.name,
                first_turn_pdms=None if np.isnan(pdms) else float(pdms),
                first_turn_feedback=bool(scored.feedback[i][0]),
            )
        )
    stats = {
        "first_turn": _turn_stats(scored),
        "category_counts": {str(c): int((category == c).sum()) for c in (1, 2, 3)},
        "selected": {str(c): int((category[chosen] == c).sum()) for c in (1, 2, 3)},
    }
    return attach_images(records, scene, config), stats


def _turn_stats(scored: Scored) -> dict:
    ok = scored.ok[:, 0]
    out = {"scored": int(ok.sum()), "unparsed": int((~ok).sum()), "reference": scored.reference}
    for name in METRIC_NAMES:
        out[f"{name}_fail"] = int(np.sum(ok & (scored.scores[name][:, 0] < 1.0)))
    out["feedback_nonempty"] = int(sum(bool(f[0]) for f in scored.feedback))
    out["mean_pdms"] = float(np.nanmean(scored.scores["pdms"][:, 0])) if ok.any() else None
    return out


def iterate_batches(num_scenes: int, batch_size: int) -> Iterator[tuple[int, int]]:
    """(start, size) chunks covering num_scenes."""
    for start in range(0, num_scenes, batch_size):
        yield start, min(batch_size, num_scenes - start)

