"""An MTDrive run directory: where its checkpoints are, whose SFT policy it holds, what it is.

Layout of ``run_mtdrive(preset, run_dir)``: ``run.json`` (the run's identity) and
``stages/`` (the journal), ``sft/``, ``sft_onpolicy/`` and ``rl/`` (metrics and orbax
checkpoints of each training stage), ``results.json`` and the plots.
"""

from __future__ import annotations

import dataclasses
import json
import os

from jax_drive.configs import OverrideError, flatten, override
from jax_drive.pipelines.mtdrive.presets import BUDGET_FIELDS, PRESETS, Preset, with_seed
from jax_drive.pipelines.stages import PolicyRef
from jax_drive.rl.checkpoint import committed_steps, restore_trainable


def sft_checkpoint_dir(run_dir: str | os.PathLike) -> str:
    """Where ``run_mtdrive(preset, run_dir)`` saves the SFT state (orbax)."""
    return os.path.join(os.fspath(run_dir), "sft", "checkpoints")


def rl_checkpoint_dir(run_dir: str | os.PathLike) -> str:
    """Where ``run_mtdrive(preset, run_dir)`` saves the mtGRPO state (orbax)."""
    return os.path.join(os.fspath(run_dir), "rl", "checkpoints")


def onpolicy_checkpoint_dir(run_dir: str | os.PathLike) -> str:
    """Where the on-policy recovery continuation of SFT saves its state (orbax)."""
    return os.path.join(os.fspath(run_dir), "sft_onpolicy", "checkpoints")


def sft_lineage(run_dir: str | os.PathLike) -> list[str]:
    """``run_dir``, then the run it took its SFT policy from (``sft_from`` in its
    ``run.json``), then that run's source, ... (each once: runs that name each other end
    the list)."""
    lineage = [os.fspath(run_dir)]
    seen = {os.path.abspath(run_dir)}
    while True:
        try:
            with open(os.path.join(lineage[-1], "run.json")) as f:
                source = json.load(f).get("sft_from")
        except (OSError, ValueError, AttributeError):
            return lineage
        if not isinstance(source, str) or os.path.abspath(source) in seen:
            return lineage
        seen.add(os.path.abspath(source))
        lineage.append(source)


def final_sft_dir(run_dir: str | os.PathLike) -> str:
    """The checkpoint directory of a run's final SFT policy: the on-policy continuation's
    when the run has one, else the SFT stage's; a run that loaded its SFT policy from
    another (``sft_from`` in its ``run.json``) and trained none of its own passes the
    question on to that run (e.g. an on-policy stage that found nothing to correct). When
    no run of the lineage has one: the SFT stage's directory of ``run_dir``."""
    for run in sft_lineage(run_dir):
        for checkpoints in (onpolicy_checkpoint_dir(run), sft_checkpoint_dir(run)):
            if committed_steps(checkpoints):
                return checkpoints
    return sft_checkpoint_dir(run_dir)


def sft_history_of(run_dir: str | os.PathLike) -> list[dict]:
    """The SFT loss curve of whichever run of ``run_dir``'s lineage trained the SFT stage."""
    from jax_drive.rl.logging import read_jsonl

    histories = [os.path.join(run, "sft", "metrics.jsonl") for run in sft_lineage(run_dir)]
    return next((read_jsonl(h) for h in histories if os.path.exists(h)), [])


def load_sft(model, preset: Preset, run_dir: str | os.PathLike) -> dict:
    """Loads the trained (LoRA) params of an earlier run's final SFT policy (see
    :func:`final_sft_dir`) into ``model`` in place.

    The checkpoint must come from the same model, LoRA rank and trainable set. Returns the
    checkpoint's meta (step, data position).
    """
    return restore_trainable(model, preset.sft.optim, final_sft_dir(run_dir))


def restore_policy(model, policy: PolicyRef) -> dict:
    """Loads ``policy``'s checkpoint into ``model`` (the Workspace's restore)."""
    return restore_trainable(model, policy.optim, policy.checkpoint)


def run_identity(preset: Preset, advantage: str | None, sft_from: str | os.PathLike | None) -> dict:
    """What a resumed run must share with the run it continues (everything that changes results)."""
    return {"pipeline": "mtdrive", "preset": dataclasses.asdict(preset), "advantage": advantage,
            "sft_from": None if sft_from is None else os.path.abspath(os.fspath(sft_from))}


def run_preset(run_dir: str | os.PathLike) -> tuple[Preset, dict]:
    """The preset a finished run evaluated with, and its ``run.json`` identity.

    The preset is rebuilt from the recorded name and seed, with the recorded value of every
    other field that differs from it (a run made with ``--set`` overrides); the fields that
    only shape training (:data:`~jax_drive.pipelines.mtdrive.presets.BUDGET_FIELDS`) keep the
    base preset's values.
    Raises:
      ValueError when ``run_dir`` holds no run, names an unknown preset, or records a field
      that today's preset no longer has or takes (the preset changed since).
    """
    path = os.path.join(os.fspath(run_dir), "run.json")
    try:
        with open(path) as f:
            identity = json.load(f)
    except (OSError, ValueError) as error:
        raise ValueError(f"{os.fspath(run_dir)} holds no MTDrive run ({path}: {error})") from None
    recorded = identity.get("preset") if isinstance(identity, dict) else None
    if identity.get("pipeline") != "mtdrive" or not isinstance(recorded, dict):
        raise ValueError(f"{path} is not the journal of an MTDrive run")
    if recorded.get("name") not in PRESETS:
        raise ValueError(f"{path}: unknown preset {recorded.get('name')!r}; choose from {sorted(PRESETS)}")
    preset = with_seed(PRESETS[recorded["name"]], int(recorded["seed"]))
    differ = _differing_fields(preset, recorded)
    try:
        preset = override(preset, flatten({k: recorded[k] for k in differ if k in recorded}))
    except OverrideError as error:
        raise ValueError(f"{path}: the run's preset cannot be rebuilt from today's {preset.name!r} ({error}); "
                         "its policies cannot be evaluated") from None
    left = _differing_fields(preset, recorded)
    if left:
        raise ValueError(f"{path}: the run's preset differs from today's {preset.name!r} in {left}; "
                         "its policies cannot be rebuilt for evaluation")
    return preset, identity


def _differing_fields(preset: Preset, recorded: dict) -> list[str]:
    """The top-level fields, budget fields aside, whose value differs from the record's."""
    mine = json.loads(json.dumps(dataclasses.asdict(preset), default=str))
    return sorted(k for k in set(mine) | set(recorded) if k not in BUDGET_FIELDS and mine.get(k) != recorded.get(k))
