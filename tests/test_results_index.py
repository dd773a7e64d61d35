"""The results index (experiments/results_index.py): experiments/results/INDEX.md is current,
every entry is described and cited, and every results path the docs or the results files name
exists; the checks themselves fail on a made-up tree that breaks each rule."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_script(name: str):
    """An experiments/ script as a module, without putting experiments/ on sys.path."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


results_index = _load_script("results_index")
Entry, build_index = results_index.Entry, results_index.build_index


def test_index_is_current_and_the_checks_pass():
    text, problems = build_index()
    assert problems == []
    assert (ROOT / "experiments/results/INDEX.md").read_text() == text, \
        "experiments/results/INDEX.md is stale: run python experiments/results_index.py"


def test_every_top_level_entry_has_a_row_and_there_are_at_most_30():
    entries = [p.name for p in (ROOT / "experiments/results").iterdir() if p.name != "INDEX.md"]
    index = (ROOT / "experiments/results/INDEX.md").read_text()
    assert len(entries) <= 30
    for name in entries:
        assert f"]({name}) |" in index


def _tree(tmp_path: Path) -> Path:
    """A repository with one described, cited results file and a current index."""
    results = tmp_path / "experiments/results"
    (results / "study/s0").mkdir(parents=True)
    (results / "bench.json").write_text(json.dumps({"meta": {"command": "python experiments/bench.py --json X"}}))
    (results / "study/summary.json").write_text(json.dumps({"dirs": ["experiments/results/study/s0"]}))
    (results / "study/s0/results.json").write_text("{}")
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("## Bench\n`experiments/results/bench.json`\n")
    (tmp_path / "docs/study.md").write_text("# Study\n| a |\n|---|\n| `experiments/results/study/summary.json` |\n")
    return tmp_path


CATALOGUE = {"bench.json": Entry("a benchmark"), "study": Entry("a study", runs="python run.py --seed S")}


def test_a_clean_tree_has_no_problems_and_lists_commands_and_citations(tmp_path):
    text, problems = build_index(_tree(tmp_path), CATALOGUE)
    assert problems == []
    assert "| [`bench.json`](bench.json) | a benchmark | README.md § Bench |" in text
    assert "`python experiments/bench.py --json X` |" in text  # from meta: no documented-command mark
    assert "| `study/{s0}/` | per-seed runs | `python run.py --seed S` * |" in text
    assert "docs/study.md § Study" in text


@pytest.mark.parametrize("breakage, message", [
    (lambda root: (root / "experiments/results/new.json").write_text("{}"),
     "experiments/results/new.json is not described"),
    (lambda root: (root / "docs/study.md").write_text("see experiments/results/gone.json\n"),
     "docs/study.md cites experiments/results/gone.json, which does not exist"),
    (lambda root: (root / "README.md").write_text("nothing cited\n"),
     "experiments/results/bench.json is cited by no README / docs page"),
    (lambda root: (root / "experiments/results/study/summary.json").write_text(
        json.dumps({"dirs": ["experiments/results/study/s1"]})),
     "study/summary.json refers to experiments/results/study/s1, which does not exist"),
    (lambda root: (root / "experiments/results/bench.json").write_text("{not json"),
     "bench.json is not valid JSON"),
])
def test_each_check_fails_when_its_rule_is_broken(tmp_path, breakage, message):
    root = _tree(tmp_path)
    breakage(root)
    _, problems = build_index(root, CATALOGUE)
    assert any(message in p for p in problems), problems


def test_a_catalogue_entry_without_files_is_reported(tmp_path):
    _, problems = build_index(_tree(tmp_path), {**CATALOGUE, "old.json": Entry("removed")})
    assert problems == ["CATALOGUE describes old.json, which is not in experiments/results/"]


def test_check_mode_exits_1_on_a_stale_index_and_writing_makes_it_current(tmp_path, monkeypatch, capsys):
    root = _tree(tmp_path)
    monkeypatch.setattr(results_index, "ROOT", root)
    monkeypatch.setattr(results_index, "CATALOGUE", CATALOGUE)
    assert results_index.main(["--check"]) == 1 and "is stale" in capsys.readouterr().err
    assert results_index.main([]) == 0
    assert results_index.main(["--check"]) == 0
    (root / "experiments/results/bench.json").write_text(json.dumps({"meta": {"command": "changed"}}))
    assert results_index.main(["--check"]) == 1
