"""Writes experiments/results/INDEX.md: every top-level entry of experiments/results/, what it
is, the command that produced each results file, and the README / docs sections that cite it.

    python experiments/results_index.py           # rewrite the index
    python experiments/results_index.py --check   # exit 1 if the index is stale or a check fails

Commands come from a file's ``meta.invocation`` (the whole command line), else its
``meta.command`` (or its top-level ``command``); files written
before scripts recorded their command take the documented one from ``CATALOGUE`` (marked so
in the index). The checks, which ``tests/test_results_index.py`` runs: every entry is described
in ``CATALOGUE`` and cited by the README or a ``docs/`` page; every ``experiments/results/...``
path cited there, and every such path inside a results JSON, exists.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from jax_drive.runinfo import run_main

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "experiments/results"
INDEX = "INDEX.md"
SEED_DIR = re.compile(r"^s\d+$")
CITED_PATH = re.compile(r"experiments/results/[A-Za-z0-9_.\-/{}<>*]*")
MTDRIVE_RUN = "python experiments/mtdrive.py --preset cpu-demo --seed S ... (flags: each run's budget in results.json)"


@dataclass(frozen=True)
class Entry:
    """What a results entry is, and the command that made it where its files do not record one."""

    what: str
    command: str | None = None
    runs: str | None = None  # how the per-seed run folders (s0, s1, ...) below it were made


CATALOGUE: dict[str, Entry] = {
    "score_planners.json": Entry(
        "Rule-based planners (constant velocity, IDM, PDM-Closed, expert) on 128 generated scenes: PDMS, "
        "EPDMS and sub-scores, all and hard scenes (written before the tracker used NAVSIM's jerk matrix)",
        "python experiments/score_planners.py --scenes 128 --seed 0 --json experiments/results/score_planners.json"),
    "bench_pdm.json": Entry(
        "PDM scorer vs the numpy/shapely reference: one scene (1-4,096 proposals), 256 scenes x 8, "
        "and jax-drive score's whole process on a 300-scene x 8-proposal file (cold, warm)"),
    "navsim_parity.json": Entry(
        "jax-drive vs NAVSIM's own pdm_score (v1.1, v2.2) per column on 400 scenes x 8 proposals"),
    "bench_multihost.json": Entry(
        "An SFT step and a PDM evaluation in 1 process x 2 CPU devices vs 2 processes x 1 device "
        "(jax.distributed, gloo): agreement and communication share, not speed"),
    "bench_draw.json": Entry("Token draw: two-level Gumbel-max vs jax.random.categorical and an inverse CDF"),
    "bench_sampler": Entry("Sampler vs transformers generate, SmolLM2 greedy, batch 1 and 8 (JSON and plot)"),
    "bench_sampler/quick.json": Entry(
        "the quick run (32 new tokens)",
        "python experiments/bench_sampler.py --quick --plot --json experiments/results/bench_sampler/quick.json"),
    "bench_sampler_features.json": Entry(
        "Sampler work savers (shared-prefix prefill, sessions, prompt lookup) vs the plain paths",
        "python experiments/bench_sampler_features.py --json experiments/results/bench_sampler_features.json"),
    "bench_models.json": Entry(
        "SmolLM2 GGUF load, prefill and token log-probs vs transformers (an early run without meta)",
        "python experiments/bench_models.py --json experiments/results/bench_models.json"),
    "bench_train": Entry("One mtGRPO update, SmolLM2-135M full fine-tuning, vs transformers + torch"),
    "bench_train/L128.json": Entry(
        "B 2, L 128, both cores",
        "python experiments/bench_train.py --quick --json experiments/results/bench_train/L128.json"),
    "bench_train/L1024_1core.json": Entry(
        "B 2, L 1024, one core each, layer remat",
        "taskset -c 0 python experiments/bench_train.py --batch 2 --length 1024 --repeats 1 --threads 1 "
        "--remat-layers --json experiments/results/bench_train/L1024_1core.json"),
    "bench_rollout": Entry("One MTDrive rollout step vs transformers generate + the numpy scorer"),
    "bench_rollout/untrained.json": Entry(
        "canonical size (8 scenes x G 8 x 3 turns x 168 tokens), untrained policy, configuration full",
        "nice -n 10 python experiments/bench_rollout.py --warmup --configs full "
        "--json experiments/results/bench_rollout/untrained.json"),
    "bench_rollout/untrained_4x4x3.json": Entry(
        "reduced size (4 x 4 x 3 x 64), every configuration (each feature's contribution)",
        "python experiments/bench_rollout.py --scenes 4 --group 4 --turns 3 --max-new-tokens 64 --warmup "
        "--json experiments/results/bench_rollout/untrained_4x4x3.json"),
    "bench_rollout/constrained.json": Entry(
        "canonical size (8 scenes x G 8 x 3 turns x 168 tokens), untrained policy: constrained answers (trajectory "
        "grammar) with and without jump-forward and the unconstrained path vs the peer, one run",
        "python experiments/bench_rollout.py --configs no_lookup constrained constrained_jump "
        "--json experiments/results/bench_rollout/constrained.json"),
    "bench_rollout/constrained_2x4x2.json": Entry(
        "reduced to 2 scenes x G 4 x 2 turns x 168 tokens on a heavily loaded machine: constrained answers "
        "(trajectory grammar) with and without jump-forward vs the unconstrained path and the peer"),
    "bench_structured.json": Entry(
        "Structured answers on SmolLM2: each format's grammar compile time, the mask's overhead per decode step "
        "(batch 16), jump-forward's forward passes and wall per answer, the mass canonical spellings remove",
        "python experiments/bench_structured.py --json experiments/results/bench_structured.json"),
    "bench_rollout/trained.json": Entry(
        "canonical size, a format-recovery SFT checkpoint, with and without prompt lookup",
        "python experiments/bench_rollout.py --configs full no_lookup --sft-from RUN "
        "--json experiments/results/bench_rollout/trained.json"),
    "bench_ipss.json": Entry(
        "mtGRPO step time with IPSS / IPTC (MTDrive section 3.4), SmolLM2 LoRA, G 8, 2 turns",
        "python experiments/bench_ipss.py --json experiments/results/bench_ipss.json"),
    "bench_vlm.json": Entry(
        "Qwen2.5-VL vision tower + prefill (3B widths, 4 + 4 layers) vs transformers",
        "python experiments/bench_vlm.py --json experiments/results/bench_vlm.json"),
    "bench_coop.json": Entry("Talking agents: batched vs per-agent engine calls, SmolLM2, 16 episodes"),
    "bench_coop_rl.json": Entry("Cooperative GRPO training loop: batched vs one engine call per agent "
                                "(agent-decisions/s of the rollouts, seconds per RL step)"),
    "bench_negotiation.json": Entry(
        "CoLMDriver negotiation: batched vs per-speaker engine calls; the jitted grouping step vs its NumPy twin"),
    "bench_sim.json": Entry("Multi-agent simulator vs highway-env merge-v0, 256 episodes"),
    "bench_serve.json": Entry(
        "jax-drive serve vs in-process JaxEngine vs a llama.cpp server, 8 concurrent requests; "
        "streamed time to first token vs non-streamed latency",
        "python experiments/bench_serve.py --json experiments/results/bench_serve.json"),
    "bench_ray.json": Entry(
        "Ray scenario workers (1 / 2 / 4) vs the in-process batched runner, tv_red_light, 32 episodes",
        "python experiments/bench_ray.py --episodes 32 --workers 1,2,4 --json experiments/results/bench_ray.json"),
    "bench_test_suite.json": Entry("make test's files, this tree vs a baseline commit (test-suite speed)"),
    "diagnostics": Entry("Measurements that explain a benchmark row (experiments/diagnostics/)"),
    "diagnostics/bench_matmul_1core.json": Entry(
        "SmolLM2's matrix products in XLA:CPU vs torch, one core",
        "taskset -c 0 python experiments/diagnostics/bench_matmul.py --threads 1 "
        "--json experiments/results/diagnostics/bench_matmul_1core.json"),
    "diagnostics/memory_logprob.json": Entry(
        "XLA temp memory of one mtGRPO update with and without full (B, L, V) logits",
        "python experiments/diagnostics/memory_logprob.py --json experiments/results/diagnostics/memory_logprob.json"),
    "coop_baselines": Entry("Silent and rule-based baselines on the TalkingVehicles and InterDrive scenarios, "
                            "3 seeds (JSON and plot)"),
    "talking_vehicles": Entry("TalkingVehicles Table 1 (cpu-demo): under the grammars (table1_grammar.json: "
                              "rule-based, silent and SmolLM2 zero-shot, reflection and debrief rows with command "
                              "mix and paired differences) and with free answers (talking_vehicles.json: "
                              "zero-shot, reflection, debrief and distilled rows), the distilled student retrained "
                              "and evaluated on nominal and held-out scale1.3 episodes (distilled_heldout.json); "
                              "JSON, CR / SR plots, storyboards"),
    "talking_vehicles/command_prior.json": Entry(
        "SmolLM2's masked command distribution on TalkingVehicles decision prompts, commands listed as "
        "prompted and reversed, at T = 1 and the agents' 0.2 (silent, the first listed command wins)",
        "python experiments/diagnostics/tv_command_prior.py "
        "--json experiments/results/talking_vehicles/command_prior.json"),
    "coop_rl": Entry("Talking vehicles trained by RL (jax-drive coop-rl): tiny-study here, tiny-distilled in "
                     "tiny_distilled/, SmolLM2 pilots in smollm2_pilot/ (1 seed, 2 steps) and smollm2_scaled/ (trained "
                     "at scale 1.5, 1 seed, 10 steps); SR / CR of the start, trained and messages-dropped policies on held-out "
                     "episodes and a held-out variation, paired differences, curves, storyboard, each training "
                     "seed's metrics"),
    "coop_rl/tiny_distilled/coop_rl_distilled.json": Entry(
        "the same from a distilled start (tiny-distilled): the distilled student, grpo and messages dropped, on "
        "the nominal held-out episodes and the scale1.3 variation"),
    "coop_rl/smollm2_pilot/coop_rl_smollm2_pilot.json": Entry(
        "a SmolLM2 pilot (cpu-demo from the TalkingVehicles distilled student, 1 training seed, 2 steps, "
        "12 held-out episodes): every advantage 0, the start never fails in training"),
    "coop_rl/smollm2_scaled/coop_rl_smollm2_scaled.json": Entry(
        "the second SmolLM2 pilot: the same start trained at scale 1.5 where it fails (1 training seed, 10 steps), "
        "with the base model's zero-shot row; evaluated on nominal, held-out scale1.3 and the training world's "
        "held-out episodes"),
    "interdrive": Entry("CoLMDriver Table 2 on the InterDrive types, with Table 2, Fig. 5 and episode plots"),
    "interdrive/interdrive.json": Entry("the fine-tuned SmolLM2 negotiator"),
    "interdrive/interdrive_critic.json": Entry("the consensus critic alone: base and critic-only LoRA, separation AUC "
                                               "on held-out teacher negotiations"),
    "interdrive/interdrive_critic_arms.json": Entry("arms 4 and 5 with the tuned critic and a retrained actor: paired "
                                                    "arm 5 - arm 4, the critic judged in the loop, Fig. 5"),
    "interdrive/interdrive_teacher.json": Entry("the rule-based teacher as the negotiator (the SFT ceiling)"),
    "interdrive/negotiation_rl.json": Entry("the negotiator trained with mtGRPO (tiny-rl): the SFT start and the "
                                            "trained actors on held-out episodes, paired differences, curves"),
    "mtdrive_cpu_demo": Entry("MTDrive, the cpu-demo preset (make demo) at training seeds 0-2: the summary "
                              "against the goals and each seed's run", runs=MTDRIVE_RUN),
    "mtdrive_table3": Entry("MTDrive Table 3 and multi- vs single-turn on the tiny preset (a byte-level "
                            "decoder trained from scratch): GRPO, mtGRPO intra / cross and single-turn RL "
                            "from one SFT checkpoint, paired intervals, plot"),
    "mtdrive_table3/table3.json": Entry(
        "the four arms at RL seeds 0-4, the SFT row, paired differences per held-out scene and seed"),
    "mtdrive_studies": Entry("MTDrive budget studies beyond the demo, one folder each (docs/mtdrive.md, "
                             "The studies)", runs=MTDRIVE_RUN),
    "mtdrive_studies/sft_96_steps": Entry("96 SFT steps with 1,664-token samples, SFT only"),
    "mtdrive_studies/sft_96_steps_then_rl": Entry("sft_96_steps + 20 x 2 mtGRPO steps at lr 1e-4"),
    "mtdrive_studies/sft_format_recovery": Entry("sft_96_steps + 16 format-recovery rows, SFT only"),
    "mtdrive_studies/sft_onpolicy_recovery": Entry("sft_format_recovery + on-policy recovery (128 scenes, "
                                                   "16 more steps), SFT only"),
    "mtdrive_studies/rl_lr_1e-4": Entry("from sft_onpolicy_recovery: 20 x 2 mtGRPO steps at lr 1e-4"),
    "mtdrive_studies/rl_lr_5e-5": Entry("from sft_onpolicy_recovery: 20 x 2 mtGRPO steps at lr 5e-5"),
    "mtdrive_studies/rl_lr_5e-5_kl_0.1_pilot": Entry("rl_lr_5e-5 with a k3 KL of 0.1 to the SFT policy, seed 0 "
                                                     "only (no summary)"),
    "mtdrive_studies/rl_hard_curation": Entry("rl_lr_5e-5 with curation over 64 scenes, keeping only those whose "
                                              "answer draws feedback or scores below 0.8"),
    "mtdrive_studies/rl_hard_curation_bonus": Entry("rl_hard_curation + a refinement bonus of 1 (SFT rows "
                                                    "borrowed from rl_hard_curation)"),
    "mtdrive_studies/reeval_72_scenes": Entry(
        "the SFT and RL policies of the four RL studies evaluated again on 3 x 24 held-out scenes",
        runs="python experiments/mtdrive_reeval.py RUN... --eval-scenes 24 --evaluate sft rl --out-root DIR "
             "(the RL-only studies: --evaluate rl)"),
    "mtdrive_studies/reeval_72_scenes/rl_hard_curation": Entry("the SFT and RL policies of rl_hard_curation"),
    "mtdrive_studies/reeval_72_scenes/rl_hard_curation_bonus": Entry(
        "the RL policies of rl_hard_curation_bonus (SFT rows borrowed from reeval_72_scenes/rl_hard_curation)"),
    "mtdrive_studies/reeval_72_scenes/rl_lr_1e-4": Entry("the RL policies of rl_lr_1e-4 (SFT rows borrowed)"),
    "mtdrive_studies/reeval_72_scenes/rl_lr_5e-5": Entry("the RL policies of rl_lr_5e-5 (SFT rows borrowed)"),
    "mtdrive_studies/advantage_ablation_pilot": Entry(
        "experiments/ablation_mtgrpo.py on an earlier cpu-demo preset (8 SFT steps), one seed: a plumbing pilot, "
        "not the Table 3 result; with the seed-0 run it took two rows from",
        "python experiments/ablation_mtgrpo.py --preset cpu-demo --sft-from RUN --from-results RUN/results.json "
        "--json experiments/results/mtdrive_studies/advantage_ablation_pilot/ablation_mtgrpo.json"),
    "mtdrive_studies/advantage_ablation_pilot/cpu_demo_s0_results.json": Entry(
        "the seed-0 run of that earlier preset whose SFT and mtgrpo_cross rows the pilot reused "
        "(restored from git history; the preset has changed since)",
        "python experiments/mtdrive.py --preset cpu-demo --seed 0 --out RUN --json RUN/results.json "
        "(the preset of that time: 8 SFT steps)"),
}


def _cell(text: str) -> str:
    """Text for a markdown table cell (a ``|`` would end the cell)."""
    return text.replace("|", "\\|")


def _entries(results: Path) -> list[str]:
    return sorted(p.name for p in results.iterdir() if p.name != INDEX and not p.name.startswith("."))


def _result_files(results: Path, entry: str) -> tuple[list[str], list[str]]:
    """(JSON files of an entry outside per-seed folders, the folders holding per-seed runs), as paths
    relative to ``results``."""
    path = results / entry
    if path.is_file():
        return ([entry] if path.suffix == ".json" else []), []
    files, seeded = [], set()
    for f in sorted(path.rglob("*")):
        rel = f.relative_to(results)
        seed_part = next((i for i, part in enumerate(rel.parts) if SEED_DIR.match(part)), None)
        if seed_part is not None:
            seeded.add("/".join(rel.parts[:seed_part]))
        elif f.suffix == ".json":
            files.append(rel.as_posix())
    return files, sorted(seeded)


def _ancestry(catalogue: dict[str, Entry], rel: str) -> list[Entry]:
    """The catalogue entries of ``rel`` and of the folders above it, nearest first."""
    parts = rel.split("/")
    return [catalogue[key] for key in ("/".join(parts[:n]) for n in range(len(parts), 0, -1)) if key in catalogue]


def _described(catalogue: dict[str, Entry], rel: str) -> Entry | None:
    """The catalogue entry of ``rel`` or of its nearest described folder."""
    return next(iter(_ancestry(catalogue, rel)), None)


def _command(results: Path, rel: str, catalogue: dict[str, Entry]) -> tuple[str, bool]:
    """(the command that wrote a results file, whether the file itself records it)."""
    try:
        payload = json.loads((results / rel).read_text())
    except (OSError, ValueError):
        payload = None
    if isinstance(payload, dict):
        meta = payload.get("meta") if isinstance(payload.get("meta"), dict) else {}
        recorded = meta.get("invocation") or meta.get("command") or payload.get("command")
        if isinstance(recorded, str) and recorded.strip():
            return recorded.strip(), True
    documented = next((e.command for e in _ancestry(catalogue, rel) if e.command), "(not recorded)")
    return documented, False


def _citations(root: Path, doc_files: list[str]) -> dict[str, list[str]]:
    """cited path -> ["<doc> § <heading>", ...] for every ``experiments/results/...`` path in the docs."""
    cited: dict[str, list[str]] = {}
    for doc in doc_files:
        path = root / doc
        if not path.is_file():
            continue
        heading = "(top)"
        for line in path.read_text().splitlines():
            if line.startswith("#"):
                heading = re.sub(r"[`*]", "", line.lstrip("#").strip())
            for match in CITED_PATH.finditer(line):
                where = f"{doc} § {heading}"
                cited.setdefault(match.group(0).rstrip(".,:;"), [])
                if where not in cited[match.group(0).rstrip(".,:;")]:
                    cited[match.group(0).rstrip(".,:;")].append(where)
    return cited


def _exists(root: Path, cited: str) -> bool:
    """Whether a cited path exists; a pattern (``{...}``, ``<...>``, ``*``) is checked up to its first wildcard."""
    cut = min((i for i, c in enumerate(cited) if c in "{<*"), default=len(cited))
    return (root / cited[:cut]).exists()


def _json_paths(payload) -> list[str]:
    if isinstance(payload, dict):
        return [p for v in payload.values() for p in _json_paths(v)]
    if isinstance(payload, list):
        return [p for v in payload for p in _json_paths(v)]
    return [payload] if isinstance(payload, str) and payload.startswith(RESULTS + "/") else []


def doc_files(root: Path) -> list[str]:
    """README.md and every docs/*.md page, as paths relative to ``root``."""
    return ["README.md", *sorted(p.relative_to(root).as_posix() for p in (root / "docs").glob("*.md"))]


def build_index(root: Path = ROOT, catalogue: dict[str, Entry] = CATALOGUE) -> tuple[str, list[str]]:
    """(INDEX.md's text, the problems found) for the results folder under ``root``."""
    results = root / RESULTS
    cited = _citations(root, doc_files(root))
    problems = [f"{doc} cites {path}, which does not exist"
                for path, docs in sorted(cited.items()) if path != f"{RESULTS}/{INDEX}" and not _exists(root, path)
                for doc in dict.fromkeys(w.split(" § ")[0] for w in docs)]
    for f in sorted(results.rglob("*.json")):
        try:
            payload = json.loads(f.read_text())
        except ValueError as error:
            problems.append(f"{f.relative_to(root)} is not valid JSON: {error}")
            continue
        problems += [f"{f.relative_to(root)} refers to {p}, which does not exist"
                     for p in _json_paths(payload) if not (root / p).exists()]
    problems += [f"CATALOGUE describes {key}, which is not in {RESULTS}/" for key in catalogue
                 if not (results / key).exists()]
    overview, files = [], []
    for entry in _entries(results):
        described = catalogue.get(entry)
        if described is None:
            problems.append(f"{RESULTS}/{entry} is not described in experiments/results_index.py CATALOGUE")
        where = sorted({w for path, ws in cited.items() if path.startswith(f"{RESULTS}/{entry}") for w in ws},
                       key=lambda w: (w.split(" § ")[0] != "README.md", w))
        if not where:
            problems.append(f"{RESULTS}/{entry} is cited by no README / docs page")
        link = entry + ("/" if (results / entry).is_dir() else "")
        overview.append(f"| [`{link}`]({entry}) | {_cell(described.what) if described else '**undescribed**'} | "
                        f"{'<br>'.join(where) or '-'} |")
        json_files, seeded = _result_files(results, entry)
        for rel in json_files:
            command, recorded = _command(results, rel, catalogue)
            note = _described(catalogue, rel)
            label = note.what if note is not None and note is not described else ""
            files.append(f"| `{rel}` | {_cell(label)} | `{_cell(command)}`{'' if recorded else ' *'} |")
        for folder in seeded:
            runs = sorted(p.name for p in (results / folder).iterdir() if SEED_DIR.match(p.name))
            entry_of = _described(catalogue, folder)
            what = entry_of.what if entry_of is not None and entry_of is not described else ""
            command = next((e.runs for e in _ancestry(catalogue, folder) if e.runs), "(not recorded)")
            files.append(f"| `{folder}/{{{','.join(runs)}}}/` | per-seed runs{_cell(': ' + what if what else '')} | "
                         f"`{_cell(command)}` * |")
    text = "\n".join([
        f"# {RESULTS}",
        "",
        "Generated by `python experiments/results_index.py` from the files here, their `meta` blocks and the",
        "README / docs pages that cite them; `tests/test_results_index.py` fails when it is stale. Layout and",
        "conventions: [docs/results.md](../../docs/results.md).",
        "",
        "| entry | what it is | cited in |",
        "|---|---|---|",
        *overview,
        "",
        "## Files and the commands that wrote them",
        "",
        "Commands come from each file's `meta`; `*` marks a documented command the file does not record",
        "(`OUT`, `RUN`, `S` stand for paths and seeds you choose).",
        "",
        "| file | what it is | command |",
        "|---|---|---|",
        *files,
        "",
    ])
    return text, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the index is stale or a "
                                                             "check fails")
    args = parser.parse_args(argv)
    text, problems = build_index(ROOT, CATALOGUE)
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    index = ROOT / RESULTS / INDEX
    stale = not index.is_file() or index.read_text() != text
    if args.check:
        if stale:
            print(f"{index.relative_to(ROOT)} is stale: run python experiments/results_index.py", file=sys.stderr)
        return 1 if stale or problems else 0
    if problems:
        return 1
    index.write_text(text)
    print(f"wrote {index.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
