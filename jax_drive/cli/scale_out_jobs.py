"""`jax-drive scale-out launch` and `jax-drive scale-out job`: multi-process runs.

    jax-drive scale-out launch --processes 2 --devices-per-process 4 -- jax-drive scale-out job sft ...
    jax-drive scale-out launch --ray HEAD_IP:6379 --processes 4 -- jax-drive scale-out job score ...
    jax-drive scale-out job {sft,grpo,score,episodes} ...     (one process of a run, or a run of one)

``launch`` starts the same command in every process (locally, or one Ray actor per host) with
the coordinator, process count and id set, and exits 1 naming the process that failed first
(:mod:`jax_drive.distributed.launch`). Under SLURM or on a TPU pod the scheduler starts the
processes instead: ``job --cluster auto`` lets JAX read them from its environment. Every
``job`` joins the run first (:func:`jax_drive.distributed.multihost.initialize`; nothing set:
one process), works on its share, and process 0 alone writes the results: ``sft`` / ``grpo``
train over the global mesh (``--out`` holds metrics and orbax checkpoints written by all
processes; ``--resume`` continues from the last one, with any process count), ``score`` is a
batched PDM evaluation of a planner, ``episodes`` runs cooperative episodes.
"""

from __future__ import annotations

import argparse

from jax_drive.runinfo import (InputError, add_output_args, output_dir, require_min, run_metadata, sigterm_exits,
                              write_json)


def register_launch(sub) -> None:
    launch = sub.add_parser("launch", help="run one command in N processes of a multi-process JAX run",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    launch.add_argument("--processes", type=int, required=True, help="processes (with --ray: hosts, one each)")
    launch.add_argument("--devices-per-process", type=int, default=None,
                        help="CPU devices of each process (XLA_FLAGS=--xla_force_host_platform_device_count)")
    launch.add_argument("--ray", default=None, metavar="ADDRESS",
                        help="run on a Ray cluster (HOST:PORT, auto or local), one actor per host")
    launch.add_argument("--placement", default="STRICT_SPREAD", choices=("STRICT_SPREAD", "SPREAD", "PACK"),
                        help="Ray placement of the hosts' bundles (STRICT_SPREAD: one per node)")
    launch.add_argument("--cpus-per-host", type=float, default=1.0, help="Ray CPUs each process holds")
    launch.add_argument("--heartbeat-timeout", type=int, default=None,
                        help="seconds without heartbeats before a process counts as dead (default 30)")
    launch.add_argument("--grace", type=float, default=None,
                        help="seconds the others get to fail on their own after a failure (default heartbeat + 30)")
    launch.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="set in every process")
    launch.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    launch.set_defaults(func=_launch)


def _launch(args) -> int:
    from jax_drive.distributed.launch import launch_local, launch_ray

    require_min(1, processes=args.processes, devices_per_process=args.devices_per_process,
                heartbeat_timeout=args.heartbeat_timeout)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise InputError("launch needs a command after --")
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--env wants KEY=VALUE, got {item!r}")
        env[key] = value
    common = dict(devices_per_process=args.devices_per_process, env=env, heartbeat_s=args.heartbeat_timeout,
                  grace_s=args.grace)
    with sigterm_exits():  # a stopped launcher stops its processes (they run in their own sessions)
        if args.ray is None:
            return launch_local(command, args.processes, **common).returncode
        return launch_ray(command, args.processes, address=args.ray, cpus_per_host=args.cpus_per_host,
                          placement=args.placement, **common).returncode


# ----------------------------------------------------------------------------- jobs
def register_jobs(sub) -> None:
    job = sub.add_parser("job", help="one process's part of a multi-process run (see `scale-out launch`)")
    kinds = job.add_subparsers(dest="job", required=True)

    sft = kinds.add_parser("sft", help="SFT over the global mesh")
    _train_args(sft)
    sft.add_argument("--data", required=True, help="chat JSONL (one {'messages': [...]} per line)")
    sft.add_argument("--batch-size", type=int, default=8)
    sft.add_argument("--max-length", type=int, default=512)
    sft.add_argument("--bucket-size", type=int, default=32)
    sft.set_defaults(func=_sft)

    grpo = kinds.add_parser("grpo", help="mtGRPO over the global mesh, each process sampling its own scenes")
    _train_args(grpo)
    grpo.add_argument("--scenes", type=int, default=8, help="generated training scenes")
    grpo.add_argument("--prompts-per-step", type=int, default=4)
    grpo.add_argument("--group-size", type=int, default=2)
    grpo.add_argument("--turns", type=int, default=2)
    grpo.add_argument("--max-new-tokens", type=int, default=16)
    grpo.add_argument("--minibatch-size", type=int, default=8)
    grpo.set_defaults(func=_grpo)

    score = kinds.add_parser("score", help="batched PDM evaluation of a planner on generated scenes")
    _runtime_args(score)
    score.add_argument("--planner", default="pdm_closed", help="constant_velocity, idm, pdm_closed or expert")
    score.add_argument("--scenes", type=int, default=64)
    score.add_argument("--seed", type=int, default=0)
    score.add_argument("--batch-size", type=int, default=32, help="scenes per chunk (fixes the results)")
    add_output_args(score, progress=False)
    score.set_defaults(func=_score)

    episodes = kinds.add_parser("episodes", help="cooperative episodes, chunks split over processes and devices")
    _runtime_args(episodes)
    episodes.add_argument("--scenario", action="append", required=True)
    episodes.add_argument("--episodes", type=int, default=4, help="episodes per seed")
    episodes.add_argument("--seeds", type=int, default=1)
    episodes.add_argument("--seed", type=int, default=0, help="first seed")
    episodes.add_argument("--config", default="alternate", choices=("alternate", "accident", "safe"))
    episodes.add_argument("--policy", default="rule_based")
    episodes.add_argument("--chunk-size", type=int, default=4, help="episodes per simulator batch (fixes the results)")
    episodes.add_argument("--max-time", type=float, default=None)
    add_output_args(episodes, progress=False)
    episodes.set_defaults(func=_episodes)


def _runtime_args(parser) -> None:
    parser.add_argument("--cluster", default=None,
                        help="JAX's cluster detection (auto, slurm, gcetpu, gketpu, ompi) instead of JAX_DRIVE_*")


def _train_args(parser) -> None:
    _runtime_args(parser)
    parser.add_argument("--model", default="tiny", help="tiny (random, byte tokenizer) or a model directory / GGUF")
    parser.add_argument("--lora-rank", type=int, default=4, help="0: full fine-tuning")
    parser.add_argument("--out", required=True, type=output_dir,
                        help="metrics.jsonl, tb/, checkpoints/ (written by process 0 / all)")
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--checkpoint-every", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mesh", default="-1,1", metavar="DATA,FSDP", help="global mesh (-1: every device)")
    parser.add_argument("--no-progress", action="store_true")


def _join(args):
    """Joins the run (before anything touches JAX) and says where this process stands."""
    from jax_drive.distributed import multihost

    try:
        runtime = multihost.initialize(cluster=args.cluster)
    except ValueError as error:  # a malformed JAX_DRIVE_* variable
        raise InputError(str(error)) from None
    print(f"jax-drive job {args.job}: process {runtime.process_id} of {runtime.num_processes}, "
          f"{runtime.local_devices} local of {runtime.global_devices} devices", flush=True)
    return runtime


def _mesh(text: str):
    from jax_drive.parallel import MeshConfig

    try:
        data, fsdp = (int(x) for x in text.split(","))
        return MeshConfig(data=data, fsdp=fsdp)
    except ValueError as error:
        raise InputError(f"--mesh wants DATA,FSDP (e.g. -1,1 or 2,4): {error}") from None


def _policy(args):
    """(model, tokenizer) of --model with --lora-rank adapters."""
    if args.model == "tiny":
        from jax_drive.models.tiny import tiny_policy

        model, _, tokenizer = tiny_policy(seed=args.seed, lora_rank=args.lora_rank or None)
        return model, tokenizer
    from flax import nnx

    from jax_drive.models import load_pretrained
    from jax_drive.models.lora import apply_lora

    model, _, tokenizer = load_pretrained(args.model)
    if args.lora_rank:
        apply_lora(model, rank=args.lora_rank, alpha=2.0 * args.lora_rank, rngs=nnx.Rngs(args.seed + 1))
    return model, tokenizer


def _optim(args):
    from jax_drive.rl.optim import OptimConfig

    return OptimConfig(learning_rate=args.lr, trainable="lora" if args.lora_rank else "full")


def _sft(args) -> int:
    require_min(1, steps=args.steps, batch_size=args.batch_size, checkpoint_every=args.checkpoint_every)
    mesh = _mesh(args.mesh)
    _join(args)
    from jax_drive.rl.sft import SFTConfig, sft_train

    model, tokenizer = _policy(args)
    config = SFTConfig(optim=_optim(args), batch_size=args.batch_size, max_steps=args.steps, max_length=args.max_length,
                       bucket_size=args.bucket_size, seed=args.seed, checkpoint_every=args.checkpoint_every, mesh=mesh)
    result = sft_train(model, args.data, config, tokenizer=tokenizer, out_dir=args.out, resume=args.resume,
                       progress=not args.no_progress)
    _print_last(result)
    return 0


def _grpo(args) -> int:
    require_min(1, steps=args.steps, scenes=args.scenes, prompts_per_step=args.prompts_per_step,
                group_size=args.group_size, turns=args.turns, max_new_tokens=args.max_new_tokens)
    mesh = _mesh(args.mesh)
    _join(args)
    import jax

    from jax_drive.rl.grpo import GRPOConfig, grpo_train
    from jax_drive.rollout import RolloutConfig
    from jax_drive.sampling import SamplingParams
    from jax_drive.scenes import generate_scenes

    model, tokenizer = _policy(args)
    rollout = RolloutConfig(group_size=args.group_size, max_turns=args.turns,
                            sampling=SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0))
    config = GRPOConfig(rollout=rollout, optim=_optim(args), prompts_per_step=args.prompts_per_step,
                        minibatch_size=args.minibatch_size, steps=args.steps, bucket_size=32, chunk_size=64,
                        seed=args.seed, checkpoint_every=args.checkpoint_every, mesh=mesh)
    scenes = generate_scenes(jax.random.PRNGKey(args.seed), args.scenes)
    result = grpo_train(model, tokenizer, scenes, config, out_dir=args.out, resume=args.resume,
                        progress=not args.no_progress)
    _print_last(result)
    return 0


def _print_last(result) -> None:
    from jax_drive.parallel import is_primary

    if is_primary() and result.history:
        last = result.history[-1]
        print(f"step {last['step']}: loss {last.get('loss')}; metrics in {result.out_dir}", flush=True)


def _score(args) -> int:
    require_min(1, scenes=args.scenes, batch_size=args.batch_size)
    _join(args)
    from jax_drive.distributed.jobs import per_scene, score_planner
    from jax_drive.evaluate import summarize
    from jax_drive.parallel import is_primary

    try:
        result = score_planner(args.planner, args.scenes, args.seed, batch_size=args.batch_size)
    except ValueError as error:
        raise InputError(str(error)) from None
    if is_primary():
        summary = summarize(result)
        print(f"{args.planner} on {args.scenes} scenes: PDMS {summary['pdms']:.4f}")
        if args.json:
            write_json(args.json, {"meta": run_metadata(command="scale-out job score", processes=_processes()),
                                   "planner": args.planner, "summary": summary, "scenes": per_scene(result)})
    return 0


def _episodes(args) -> int:
    require_min(1, seeds=args.seeds, chunk_size=args.chunk_size)
    _join(args)
    from jax_drive.distributed.episodes import plan_episodes, summarise_records
    from jax_drive.distributed.jobs import run_episode_plan
    from jax_drive.parallel import is_primary

    specs = plan_episodes(args.scenario, range(args.seed, args.seed + args.seeds), args.episodes, config=args.config,
                          max_time=args.max_time)
    records = run_episode_plan(specs, policy=args.policy, chunk_size=args.chunk_size)
    if is_primary():
        reports = summarise_records(records)
        print(f"{len(records)} episodes of {', '.join(args.scenario)}")
        if args.json:
            write_json(args.json, {"meta": run_metadata(command="scale-out job episodes", processes=_processes()),
                                   "reports": reports, "records": records})
    return 0


def _processes() -> dict:
    import jax

    return {"count": jax.process_count(), "devices": jax.device_count(), "local_devices": jax.local_device_count()}
