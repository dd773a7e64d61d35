"""Data card: what a dataset build produced (counts per kind, per metric failure)."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Any


def _merge(into: dict, stats: dict) -> None:
    """Adds numeric leaves of ``stats`` into ``into`` (nested dicts merge; others overwrite)."""
    for key, value in stats.items():
        if isinstance(value, dict):
            _merge(into.setdefault(key, {}), value)
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            into[key] = value
        elif key.startswith("mean_"):
            into.setdefault(key + "_parts", []).append(value)
            parts = into[key + "_parts"]
            into[key] = sum(parts) / len(parts)
        else:
            into[key] = into.get(key, 0) + value


@dataclasses.dataclass
class DataCard:
    """Summary of one build.

    kind, num_scenes, seed, out: what was asked; records: records written;
    record_counts: per (kind, turns / metric / category) key; stats: builder statistics
    (first-turn metric failures, RL categories, QA yes/no counts), summed over batches.
    """

    kind: str
    num_scenes: int
    seed: int
    out: str = ""
    records: int = 0
    record_counts: Counter = dataclasses.field(default_factory=Counter)
    stats: dict = dataclasses.field(default_factory=dict)

    def add_records(self, records: list[dict]) -> None:
        for r in records:
            self.records += 1
            meta = r.get("meta", {})
            key = r["kind"]
            if r["kind"] == "multi":
                key += f"/{'mock' if meta.get('mock') else 'bootstrap'}/{meta.get('turns')}-turn"
            elif r["kind"] == "recovery":
                key += f"/{meta.get('malformation')}"
            elif r["kind"] == "qa":
                key += f"/{meta.get('metric')}/{'yes' if meta.get('label') else 'no'}"
            elif r["kind"] == "rl":
                key += f"/category-{meta.get('category')}"
            self.record_counts[key] += 1

    def add_stats(self, stats: dict[str, Any]) -> None:
        _merge(self.stats, stats)

    def to_dict(self) -> dict:
        stats = json.loads(json.dumps(self.stats, default=str))
        _strip_parts(stats)
        return {
            "kind": self.kind, "num_scenes": self.num_scenes, "seed": self.seed, "out": self.out,
            "records": self.records, "record_counts": dict(sorted(self.record_counts.items())), "stats": stats,
        }

    def to_text(self) -> str:
        d = self.to_dict()
        lines = [
            f"Data card: kind={d['kind']} scenes={d['num_scenes']} seed={d['seed']} records={d['records']}",
            f"  output: {d['out']}" if d["out"] else "",
            "  records by type:",
        ]
        lines += [f"    {k}: {v}" for k, v in d["record_counts"].items()] or ["    (none)"]
        first = d["stats"].get("first_turn")
        if first:
            lines.append("  first turn (predictor answers):")
            for k, v in first.items():
                lines.append(f"    {k}: {round(v, 4) if isinstance(v, float) else v}")
        for section in ("category_counts", "selected", "qa"):
            if section in d["stats"]:
                lines.append(f"  {section}: " + ", ".join(f"{k}={v}" for k, v in d["stats"][section].items()))
        for k, v in d["stats"].items():
            if k not in ("first_turn", "category_counts", "selected", "qa"):
                lines.append(f"  {k}: {v}")
        return "\n".join(line for line in lines if line)


def _strip_parts(d: dict) -> None:
    for key in [k for k in d if k.endswith("_parts")]:
        del d[key]
    for value in d.values():
        if isinstance(value, dict):
            _strip_parts(value)
