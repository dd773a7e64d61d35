"""Episode specifications and their JSON records.

An :class:`EpisodeSpec` names one episode completely (scenario, seed, index within the
seed, accident-prone flag, background traffic, time cap); its ``id`` is the key of the
result store. :func:`plan_episodes` gives the same episodes as ``jax-drive sim run`` /
:func:`jax_drive.coop.evaluate.evaluate` (seed s, episode k: key ``fold_in(key(s), k)``,
configuration from :func:`~jax_drive.coop.evaluate.episode_flags`).

A record is the JSON form of an :class:`~jax_drive.coop.runner.EpisodeResult`: the spec,
the outcomes, metrics, end time, message counts and log, plus a ``meta`` dict (worker,
attempt, wall time) that is not part of the result.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from jax_drive.runinfo import InputError

_NAME = re.compile(r"^[a-z0-9_]+$")
# Record keys that hold the result (everything but ``meta``).
RESULT_KEYS = ("episode_id", "spec", "scenario", "accident_prone", "background", "policy", "outcomes",
               "end_time", "bytes_sent", "messages_sent", "metrics", "message_log")


@dataclasses.dataclass(frozen=True)
class EpisodeSpec:
    """One episode.

    Fields: scenario (a name of :data:`jax_drive.sim.scenarios.SCENARIOS`); seed and index
    (the JAX key is ``fold_in(key(seed), index)``); accident_prone; background (background
    traffic); max_time (optional cap on the episode's time limit, s).
    """

    scenario: str
    seed: int
    index: int
    accident_prone: bool
    background: bool = False
    max_time: float | None = None

    def __post_init__(self):
        if not _NAME.match(self.scenario):
            raise InputError(f"scenario name {self.scenario!r} must be lower-case letters, digits and _")
        if self.seed < 0 or self.index < 0:
            raise InputError(f"seed and index must be >= 0, got {self.seed}, {self.index}")
        if self.max_time is not None and not self.max_time > 0:
            raise InputError(f"max_time must be > 0, got {self.max_time}")

    @property
    def id(self) -> str:
        """Stable, file-name-safe id, e.g. ``tv_red_light-s0-e3-ap`` (``-bg`` with background,
        ``-t12.5`` with a time cap)."""
        parts = [self.scenario, f"s{self.seed}", f"e{self.index}", "ap" if self.accident_prone else "safe"]
        if self.background:
            parts.append("bg")
        if self.max_time is not None:
            parts.append(f"t{self.max_time:g}")
        return "-".join(parts)

    def key(self):
        """The episode's JAX PRNG key (as :func:`jax_drive.coop.evaluate.evaluate` makes it)."""
        import jax

        return jax.random.fold_in(jax.random.key(self.seed), self.index)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> EpisodeSpec:
        return cls(**data)

    @property
    def group(self) -> tuple:
        """Specs with equal groups can share one batch (one background flag and time cap)."""
        return (self.background, self.max_time)


def plan_episodes(scenarios: Iterable[str], seeds: Iterable[int], episodes: int, *, config: str = "alternate",
                  background: bool = False, max_time: float | None = None) -> list[EpisodeSpec]:
    """Specs of ``episodes`` episodes per seed for each scenario, in (scenario, seed, index)
    order; ``config`` as in :func:`jax_drive.coop.evaluate.episode_flags`."""
    from jax_drive.coop.evaluate import episode_flags
    from jax_drive.sim.scenarios import family

    if episodes < 1:
        raise InputError(f"episodes must be >= 1, got {episodes}")
    names = list(scenarios)
    try:
        flags = episode_flags(config, episodes)
        for name in names:
            family(name)  # raises on an unknown scenario
    except ValueError as error:
        raise InputError(str(error)) from error
    seeds = [int(s) for s in seeds]
    if not names or not seeds:
        raise InputError("need at least one scenario and one seed")
    return [EpisodeSpec(name, seed, k, flags[k], background, max_time)
            for name in names for seed in seeds for k in range(episodes)]


def chunk_specs(specs: Iterable[EpisodeSpec], size: int) -> list[tuple[EpisodeSpec, ...]]:
    """Consecutive specs grouped into chunks of at most ``size`` that share a
    :attr:`EpisodeSpec.group` (one batch each); order is kept within each group."""
    if size < 1:
        raise InputError(f"chunk size must be >= 1, got {size}")
    by_group: dict[tuple, list[EpisodeSpec]] = {}
    for spec in specs:
        by_group.setdefault(spec.group, []).append(spec)
    return [tuple(group[i:i + size]) for group in by_group.values() for i in range(0, len(group), size)]


def episode_record(spec: EpisodeSpec, result, meta: dict | None = None) -> dict:
    """JSON record of one :class:`~jax_drive.coop.runner.EpisodeResult` of ``spec``."""
    from jax_drive.coop.evaluate import jsonable

    return jsonable({
        "episode_id": spec.id,
        "spec": spec.to_json(),
        "scenario": result.scenario,
        "accident_prone": bool(result.accident_prone),
        "background": bool(result.background),
        "policy": result.policy,
        "outcomes": [dataclasses.asdict(o) for o in result.outcomes],
        "end_time": float(result.end_time),
        "bytes_sent": int(result.bytes_sent),
        "messages_sent": int(result.messages_sent),
        "metrics": dict(result.metrics),
        "message_log": [[float(t), int(vid), str(text)] for t, vid, text in result.message_log],
        "meta": dict(meta or {}),
    })


def result_of(record: dict):
    """The :class:`~jax_drive.coop.runner.EpisodeResult` of a record (no trajectory)."""
    from jax_drive.coop.runner import EpisodeResult
    from jax_drive.sim.metrics import AgentOutcome

    nan = float("nan")
    return EpisodeResult(
        scenario=record["scenario"], accident_prone=record["accident_prone"], background=record["background"],
        policy=record["policy"], outcomes=[AgentOutcome(**o) for o in record["outcomes"]],
        end_time=record["end_time"], bytes_sent=record["bytes_sent"], messages_sent=record["messages_sent"],
        metrics={k: nan if v is None else v for k, v in record["metrics"].items()},
        message_log=[tuple(m) for m in record["message_log"]])


def result_part(record: dict) -> dict:
    """The record without ``meta``: what must agree between two runs of the same spec."""
    return {k: record[k] for k in RESULT_KEYS}


def summarise_records(records: Iterable[dict]) -> list[dict]:
    """Per scenario (and background flag): the family's metrics per seed and aggregated
    over seeds, as :func:`jax_drive.coop.evaluate.summarise` gives them."""
    from jax_drive.coop.evaluate import jsonable, summarise
    from jax_drive.sim.scenarios import family

    groups: dict[tuple, dict[int, list]] = {}
    for rec in records:
        spec = rec["spec"]
        by_seed = groups.setdefault((spec["scenario"], spec["background"], rec["policy"]), {})
        by_seed.setdefault(spec["seed"], []).append((spec["index"], result_of(rec)))
    out = []
    for (name, background, policy), by_seed in sorted(groups.items()):
        ordered = {s: [r for _, r in sorted(items, key=lambda x: x[0])] for s, items in by_seed.items()}
        fam = family(name)
        report = summarise(ordered, fam)
        out.append(jsonable({"scenario": name, "family": fam, "background": background, "policy": policy,
                             "seeds": sorted(ordered), "episodes": sum(len(v) for v in ordered.values()),
                             **report}))
    return out
