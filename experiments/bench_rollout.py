"""Benchmark: one MTDrive rollout step (S scenes x G rollouts x up to N turns, PDM scoring
and feedback included) with jax-drive's engine vs the same workflow written with
transformers ``generate`` and the numpy reference scorer, in one run.

Workload (the cpu-demo's prompts): ``--scenes`` generated scenes (default 8), ``--group`` G
rollouts each (8), ``--turns`` N (3), ``--max-new-tokens`` per turn (168), sampling at
``--temperature`` (1.0, MTDrive's RL setting; pure temperature sampling, no top-k/top-p), on
SmolLM2-135M-Instruct (untrained, or ``--sft-from RUN_DIR``: the LoRA adapters of a
cpu-demo run's SFT stage). Every turn: generate for the live rows, parse, score, write the
PDM Agent feedback (or the format feedback), stop rows without violations.

* ours: :func:`jax_drive.rollout.run_rollouts` with ``JaxEngine`` (at most ``--batch`` rows
  per device batch) and the batched JAX PDM scorer, in four configurations, to report each
  feature's contribution separately:
    full            shared-prefix prefill + sessions (cross-turn KV reuse) + prompt lookup
    no_prefix       full without shared-prefix prefill (each row prefills its prompt)
    no_lookup       full without prompt-lookup speculative decoding
    no_sessions     neither sessions nor prompt lookup (every turn re-prefills each row's
                    whole context; prompt lookup only runs in session turns)
    constrained     no_lookup with every answer sampled under MTDrive's trajectory grammar
                    (``RolloutConfig(constrain_answers=True)``: canonical literal spellings,
                    every answer well-formed and ending at its last character)
    constrained_jump  constrained with jump-forward (``JaxEngine(jump_forward=7)``: tokens
                    the grammar forces ride along with the next sampled token's forward pass)
  contribution of prefix sharing = t(no_prefix) / t(full); of prompt lookup =
  t(no_lookup) / t(full); of KV reuse = t(no_sessions) / t(no_lookup); of constrained answers =
  t(no_lookup) / t(constrained); of jump-forward = t(constrained) / t(constrained_jump).
* transformers: the way a user would write it today: the conversation as chat messages,
  ``apply_chat_template`` + the tokenizer every turn, ``model.generate`` (its own KV cache
  per call, nothing shared across calls or rows) on ``--batch`` left-padded rows at a time,
  and :class:`jax_drive.pdm_reference.ReferenceScorer` (numpy, one proposal at a time, one
  scorer per scene) for scores and feedback. Same weights (our model saved with
  ``save_safetensors``, LoRA folded in), same prompts, same stop ids.

Timing: wall and process CPU seconds of the whole step (a busy shared machine distorts CPU
time less); for ours also the XLA compilation seconds inside the step (``jax.monitoring``)
and the step without them. ``--warmup`` runs one untimed step per JAX configuration first
(another PRNG key), so the timed step compiles little. Sampled runs differ in their tokens,
so the generated tokens and turns of every run are reported with its time, and speedups are
given per step and per generated token.

  python experiments/bench_rollout.py --json OUT [--warmup] [--sft-from RUN_DIR] [--no-torch]
  quick check: --quick (1 scene x G 2, 2 turns of 8 tokens, batch 4)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from jax_drive.runinfo import (CompileClock, InputError, add_output_args, finite_float, require_min,  # noqa: E402
                               run_main, run_metadata, script_environment, write_json)

script_environment()

CONFIGS = {  # name -> (share_prefix and pack_prompts, use_sessions, prompt_lookup, constrained, jump_forward)
    "full": (True, True, True, False, 0),
    "no_prefix": (False, True, True, False, 0),
    "no_lookup": (True, True, False, False, 0),
    "no_sessions": (True, False, False, False, 0),
    "constrained": (True, True, False, True, 0),
    "constrained_jump": (True, True, False, True, 7),
}
CONFIG_FIELDS = ("share_prefix", "sessions", "prompt_lookup", "constrained", "jump_forward")


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def rollout_stats(pdms, fmt, turn_mask, generated_tokens: int) -> dict:
    """What a step produced: rows per turn, generated tokens, mean PDMS / format of taken turns."""
    import numpy as np

    m = np.asarray(turn_mask, bool)
    return {"rows_per_turn": [int(c) for c in m.reshape(-1, m.shape[-1]).sum(0)],
            "turns": int(m.sum()), "generated_tokens": int(generated_tokens),
            "pdms_mean": float(np.asarray(pdms)[m].mean()) if m.any() else 0.0,
            "format_rate": float(np.asarray(fmt)[m].mean()) if m.any() else 0.0}


# ------------------------------------------------------------------------------ ours
def run_ours(model, tokenizer, scenes, refs, prompts, args, name: str, key, clock: CompileClock) -> dict:
    from jax_drive.pipelines.mtdrive.presets import TEXT_PROMPT
    from jax_drive.rollout import RolloutConfig, run_rollouts
    from jax_drive.sampling import JaxEngine, PromptLookup, SamplingParams
    from jax_drive.sampling.sampler import SamplerConfig

    share, sessions, lookup, constrained, jump = CONFIGS[name]
    engine = JaxEngine(model, tokenizer, SamplerConfig(prompt_buckets=tuple(range(128, 32_769, 128)),
                                                       share_prefix=share, pack_prompts=share),
                       max_batch_size=args.batch, prompt_lookup=PromptLookup() if lookup else None, jump_forward=jump)
    config = RolloutConfig(group_size=args.group, max_turns=args.turns, prompt=TEXT_PROMPT,
                           sampling=SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature),
                           use_sessions=sessions, max_context_tokens=args.max_context_tokens,
                           constrain_answers=constrained)
    compile0, wall, cpu = clock.seconds, time.perf_counter(), time.process_time()
    result = run_rollouts(engine, tokenizer, scenes, key, config, reference=refs, prompts=prompts)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    compile_s = clock.seconds - compile0
    return {"seconds": round(wall, 3), "cpu_seconds": round(cpu, 3), "compile_seconds": round(compile_s, 3),
            "seconds_excluding_compile": round(wall - compile_s, 3),
            **rollout_stats(result.pdms, result.format, result.turn_mask, result.num_generated_tokens)}


# ---------------------------------------------------------------------- transformers
def reference_violations(score: dict, scene_np, num_poses: int = 8):
    """PointViolations (the feedback's input) from a reference scorer result: per output pose
    the first flagged step of its window (steps 5k+1 .. 5k+5, pose 0 also step 0), the object
    hit there and its box at that step."""
    import numpy as np

    from jax_drive.text.feedback import PointViolations

    v = PointViolations.empty(num_poses)
    fields = dataclasses.asdict(v)
    agents = scene_np.agents
    for kind in ("nc", "ttc"):
        steps, objects = np.asarray(score[f"{kind}_step"], bool), np.asarray(score[f"{kind}_object"])
        for k in range(num_poses):
            window = np.arange(0 if k == 0 else 5 * k + 1, 5 * k + 6)
            hit = window[steps[window]]
            if not len(hit):
                continue
            t, obj = int(hit[0]), int(objects[hit[0]])
            fields[f"{kind}_point"][k] = True
            if obj >= 0:
                fields[f"{kind}_object"][k] = obj
                fields[f"{kind}_box"][k] = [agents.x[obj, t], agents.y[obj, t], agents.z[obj, t], agents.length[obj],
                                            agents.width[obj], agents.height[obj], agents.heading[obj, t]]
                fields[f"{kind}_class"][k] = int(agents.agent_type[obj])
    fields["dac_point"] = np.asarray(score["dac_point"], bool)
    return PointViolations(**fields)


def run_transformers(hf, hf_tok, scenes, refs, prompts, args, eos_ids, seed: int) -> dict:
    import numpy as np
    import torch

    from jax_drive.pdm_reference import ReferenceScorer, scene_to_numpy
    from jax_drive.rollout import FORMAT_FEEDBACK
    from jax_drive.text.feedback import feedback_message
    from jax_drive.text.format_score import check_answer

    torch.manual_seed(seed)
    num_scenes, g_, n_ = len(prompts), args.group, args.turns
    wall, cpu = time.perf_counter(), time.process_time()
    scene_np = [scene_to_numpy(scenes, s) for s in range(num_scenes)]
    scorers: dict[int, ReferenceScorer] = {}
    chats = [[{"role": "user", "content": prompts[r // g_]}] for r in range(num_scenes * g_)]
    active = np.ones(num_scenes * g_, bool)
    shape = (num_scenes, g_, n_)
    pdms, fmt, mask = np.zeros(shape), np.zeros(shape), np.zeros(shape, bool)
    generated = 0
    sample = args.temperature > 0
    for j in range(n_):
        live = np.flatnonzero(active)
        if not live.size:
            break
        for start in range(0, live.size, args.batch):
            rows = live[start:start + args.batch]
            texts = [hf_tok.apply_chat_template(chats[r], add_generation_prompt=True, tokenize=False) for r in rows]
            enc = hf_tok(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
            with torch.inference_mode():
                out = hf.generate(**enc, max_new_tokens=args.max_new_tokens, do_sample=sample,
                                  temperature=args.temperature if sample else None, top_k=0 if sample else None,
                                  top_p=1.0 if sample else None, eos_token_id=list(eos_ids),
                                  pad_token_id=hf_tok.pad_token_id)
            new = out[:, enc["input_ids"].shape[1]:]
            for r, ids in zip(rows, new.tolist()):
                n = next((i + 1 for i, t in enumerate(ids) if t in eos_ids), len(ids))
                generated += n
                answer = hf_tok.decode(ids[:n], skip_special_tokens=True)
                s, g = divmod(int(r), g_)
                check = check_answer(answer)
                mask[s, g, j], fmt[s, g, j] = True, check.format
                feedback = FORMAT_FEEDBACK
                if check.usable:
                    scorer = scorers.setdefault(s, ReferenceScorer(scene_np[s]))
                    score = scorer.score(np.asarray(check.parsed.poses), np.asarray(refs[s]))
                    pdms[s, g, j] = score["pdms"]
                    feedback = feedback_message(check.parsed.poses, reference_violations(score, scene_np[s]))
                chats[r] += [{"role": "assistant", "content": answer}, {"role": "user", "content": feedback}]
                if not feedback or j == n_ - 1:
                    active[r] = False
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"seconds": round(wall, 3), "cpu_seconds": round(cpu, 3), **rollout_stats(pdms, fmt, mask, generated)}


# ------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser, json_required=True)
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes to check the script: 1 scene x G 2, 2 turns of 8 tokens, batch 4")
    parser.add_argument("--scenes", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=168)
    parser.add_argument("--max-context-tokens", type=int, default=4096)
    parser.add_argument("--temperature", type=finite_float, default=1.0)
    parser.add_argument("--batch", type=int, default=16, help="rows per generate call / device batch (both sides)")
    parser.add_argument("--configs", nargs="+", default=["full", "no_prefix", "no_lookup", "no_sessions"],
                        choices=list(CONFIGS), help="configurations of ours to run (see the module docstring)")
    parser.add_argument("--warmup", action="store_true", help="one untimed step per JAX configuration first")
    parser.add_argument("--sft-from", default=None, help="a cpu-demo run directory: use its SFT LoRA adapters")
    parser.add_argument("--no-torch", action="store_true", help="skip the transformers peer")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.scenes, args.group, args.turns, args.max_new_tokens, args.batch = 1, 2, 2, 8, 4
    require_min(1, scenes=args.scenes, group=args.group, turns=args.turns, max_new_tokens=args.max_new_tokens,
                max_context_tokens=args.max_context_tokens, batch=args.batch)
    require_min(0, temperature=args.temperature)
    if args.sft_from is not None and not os.path.isdir(args.sft_from):
        raise InputError(f"--sft-from {args.sft_from}: no such run directory")

    import jax
    import numpy as np
    from tqdm.auto import tqdm

    from jax_drive.models import load_pretrained
    from jax_drive.models.export import save_safetensors
    from jax_drive.pipelines.mtdrive import EVAL_SEED_OFFSET, load_policy, load_sft
    from jax_drive.pipelines.mtdrive.presets import PRESETS, TEXT_PROMPT
    from jax_drive.rollout import compute_reference, scene_prompts
    from jax_drive.scenes import GeneratorConfig, generate_scenes

    load_before = load_avg()
    if args.sft_from:
        preset = PRESETS["cpu-demo"]
        model, tokenizer = load_policy(preset)
        load_sft(model, preset, args.sft_from)
    else:
        model, _, tokenizer = load_pretrained("smollm2-135m-instruct")
    caption = PRESETS["cpu-demo"].caption
    scenes = generate_scenes(jax.random.key(EVAL_SEED_OFFSET + 100 + args.seed), args.scenes,
                             GeneratorConfig(hard_fraction=0.3))
    refs = np.asarray(compute_reference(scenes))
    prompts = scene_prompts(scenes, TEXT_PROMPT, caption)
    results: dict = {
        "meta": run_metadata(benchmark="bench_rollout"),
        "workload": {"scenes": args.scenes, "group": args.group, "turns": args.turns,
                     "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "batch": args.batch,
                     "max_context_tokens": args.max_context_tokens,
                     "policy": f"SmolLM2-135M-Instruct + SFT LoRA of {args.sft_from}" if args.sft_from
                     else "SmolLM2-135M-Instruct (untrained)",
                     "prompt_tokens": [len(tokenizer.encode(tokenizer.apply_chat_template(
                         [{"role": "user", "content": p}], add_generation_prompt=True))) for p in prompts]},
        "configs": {name: dict(zip(CONFIG_FIELDS, CONFIGS[name])) for name in args.configs},
        "warmup": args.warmup,
        "host": {},
        "ours": {},
    }
    clock = CompileClock()
    key = jax.random.key(args.seed)
    bar = tqdm(total=len(args.configs) * (2 if args.warmup else 1) + (0 if args.no_torch else 1),
               desc="bench_rollout", unit="step", disable=args.no_progress)
    for name in args.configs:
        bar.set_postfix(run=name)
        if args.warmup:
            run_ours(model, tokenizer, scenes, refs, prompts, args, name, jax.random.fold_in(key, 1), clock)
            bar.update(1)
        results["ours"][name] = run_ours(model, tokenizer, scenes, refs, prompts, args, name, key, clock)
        bar.update(1)
    if not args.no_torch:
        import torch
        import transformers

        results["host"].update(torch=torch.__version__, transformers=transformers.__version__,
                               torch_threads=torch.get_num_threads())
        bar.set_postfix(run="transformers")
        with tempfile.TemporaryDirectory() as tmp:
            save_safetensors(model, tmp)
            hf = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
        from jax_drive.models.loading import smollm2_gguf_path

        gguf = smollm2_gguf_path()
        hf_tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        if hf_tok.pad_token is None:
            hf_tok.pad_token = hf_tok.convert_ids_to_tokens(int(tokenizer.pad_token_id))
        results["transformers"] = run_transformers(hf, hf_tok, scenes, refs, prompts, args,
                                                   set(int(i) for i in tokenizer.eos_token_ids), args.seed)
        bar.update(1)
    bar.close()

    ours = results["ours"]

    def ratio(a: dict, b: dict, key: str) -> float | None:
        return round(a[key] / b[key], 3) if a.get(key) and b.get(key) else None

    def per_token(run: dict, key: str) -> float:
        return run[key] / max(run["generated_tokens"], 1)

    contributions = {}
    for feature, (slow, fast) in {"shared_prefix_prefill": ("no_prefix", "full"),
                                  "prompt_lookup": ("no_lookup", "full"),
                                  "cross_turn_kv_reuse": ("no_sessions", "no_lookup"),
                                  "constrained_answers": ("no_lookup", "constrained"),
                                  "jump_forward": ("constrained", "constrained_jump")}.items():
        if slow in ours and fast in ours:
            contributions[feature] = {
                "speedup": ratio(ours[slow], ours[fast], "seconds_excluding_compile"),
                "speedup_wall": ratio(ours[slow], ours[fast], "seconds"),
                "speedup_cpu": ratio(ours[slow], ours[fast], "cpu_seconds"),
                "speedup_per_token": round(per_token(ours[slow], "seconds_excluding_compile")
                                           / per_token(ours[fast], "seconds_excluding_compile"), 3),
                "compared": f"{slow} / {fast}"}
    results["contributions"] = contributions
    if "transformers" in results:
        peer = results["transformers"]
        speedups = {name: {
            "step": ratio(peer, run, "seconds"),
            "step_excluding_compile": round(peer["seconds"] / run["seconds_excluding_compile"], 3),
            "cpu": ratio(peer, run, "cpu_seconds"),
            "per_generated_token": round(per_token(peer, "seconds") / per_token(run, "seconds_excluding_compile"), 3),
        } for name, run in ours.items()}
        if "full" in speedups:
            results["speedup_vs_transformers"] = speedups["full"]
        results["speedup_vs_transformers_by_config"] = speedups
    results["load_avg_before"] = load_before
    results["load_avg_after"] = load_avg()
    write_json(args.json, results)
    print(json.dumps({k: results[k] for k in ("contributions", "speedup_vs_transformers_by_config") if k in results},
                     indent=2))
    for name, run in [*ours.items(), *([("transformers", results["transformers"])] if "transformers" in results else [])]:
        print(f"{name:>16}: {run['seconds']:8.1f} s (cpu {run['cpu_seconds']:.1f} s, compile "
              f"{run.get('compile_seconds', 0):.1f} s), {run['generated_tokens']} tokens, rows per turn "
              f"{run['rows_per_turn']}, format {run['format_rate']:.2f}, PDMS {run['pdms_mean']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
