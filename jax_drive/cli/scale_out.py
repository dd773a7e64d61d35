"""`jax-drive scale-out`: Ray scenario workers, CARLA server pools and multi-process JAX runs.

    jax-drive scale-out run --scenario tv_red_light --seeds 3 --episodes 10 --results runs/red \
        [--workers 2] [--address local|auto|HOST:PORT] [--backend jax|carla --carla HOST:PORT:TM ...]
    jax-drive scale-out status --results runs/red
    jax-drive scale-out carla-pool --carla-root /opt/carla --servers 2 [--gpus 0,1]
    jax-drive scale-out launch --processes 2 [--devices-per-process 4] [--ray ADDRESS] -- COMMAND ...
    jax-drive scale-out job {sft,grpo,score,episodes} ...

``launch`` and ``job`` (:mod:`jax_drive.cli.scale_out_jobs`) run one program in several JAX
processes over a global mesh (JAX's multi-controller runtime).

``run`` records every episode once under ``--results`` and resumes there after a crash or
Ctrl-C (rerun the same command). ``carla-pool`` starts CARLA servers, waits until they
answer, prints their ports and restarts any that crash until interrupted.
"""

from __future__ import annotations

import sys

from jax_drive.names import BASELINES, SCENARIOS
from jax_drive.runinfo import (InputError, add_output_args, finite_float, output_dir, require_min, run_metadata,
                               write_json)


def register(subparsers) -> None:
    from jax_drive.cli.scale_out_jobs import register_jobs, register_launch

    parser = subparsers.add_parser("scale-out", help="Ray scenario workers, CARLA server pools, multi-process runs")
    sub = parser.add_subparsers(dest="scale_command", required=True)

    run = sub.add_parser("run", help="run episodes on Ray workers into a resumable results directory")
    run.add_argument("--scenario", action="append", required=True, choices=SCENARIOS, metavar="SCENARIO",
                     help=f"repeatable; one of {', '.join(SCENARIOS)}")
    run.add_argument("--episodes", type=int, default=10, help="episodes per seed")
    run.add_argument("--seeds", type=int, default=1)
    run.add_argument("--seed", type=int, default=0, help="first seed")
    run.add_argument("--config", default="alternate", choices=("alternate", "accident", "safe"))
    run.add_argument("--background", action="store_true", help="add background traffic")
    run.add_argument("--max-time", type=finite_float, default=None, help="cap every episode's time limit, s")
    run.add_argument("--policy", default="rule_based", choices=BASELINES)
    run.add_argument("--results", required=True, metavar="DIR", type=output_dir,
                     help="results directory (resumed if it exists)")
    run.add_argument("--backend", default="jax", choices=("jax", "carla"))
    run.add_argument("--carla", action="append", default=[], metavar="HOST:PORT:TM_PORT",
                     help="a CARLA server for one worker (repeat per server; --backend carla)")
    run.add_argument("--workers", type=int, default=None, help="Ray workers (default: the cores; CARLA: servers)")
    run.add_argument("--chunk-size", type=int, default=None, help="episodes per call (default 4 JAX, 1 CARLA)")
    run.add_argument("--max-restarts", type=int, default=3, help="Ray restarts per worker (-1: forever)")
    run.add_argument("--max-attempts", type=int, default=3, help="runs of an episode before it counts as failed")
    run.add_argument("--task-timeout", type=finite_float, default=None,
                     help="restart a worker whose chunk runs longer, s")
    run.add_argument("--address", default="local",
                     help="local (a Ray instance on this machine), auto or HOST:PORT (a `ray start --head` cluster)")
    run.add_argument("--xla-cache", default=None, metavar="DIR", type=output_dir,
                     help="persistent XLA cache for the workers (restarted workers skip compilation)")
    add_output_args(run)
    run.set_defaults(func=_run)

    status = sub.add_parser("status", help="progress and metrics of a results directory")
    status.add_argument("--results", required=True, metavar="DIR")
    add_output_args(status, progress=False)
    status.set_defaults(func=_status)

    pool = sub.add_parser("carla-pool", help="start and supervise CARLA servers")
    pool.add_argument("--carla-root", required=True, help="CARLA install directory (holds CarlaUE4.sh)")
    pool.add_argument("--servers", type=int, default=1)
    pool.add_argument("--base-port", type=int, default=2000, help="RPC port of the first server")
    pool.add_argument("--port-stride", type=int, default=4, help="RPC port spacing (>= 3: each server takes 3)")
    pool.add_argument("--tm-base-port", type=int, default=8000, help="Traffic Manager port of the first server")
    pool.add_argument("--gpus", default="0", help="comma-separated GPU indices, assigned round-robin")
    pool.add_argument("--render", default="offscreen", choices=("offscreen", "none"),
                      help="offscreen (-RenderOffScreen, needs a GPU) or none (-nullrhi, no cameras)")
    pool.add_argument("--ready-timeout", type=finite_float, default=180.0,
                      help="seconds to wait for a server to answer")
    pool.add_argument("--probe", default="carla", choices=("carla", "tcp"),
                      help="readiness: the CARLA client's get_server_version (needs the carla extra), or a TCP connect")
    pool.add_argument("--max-restarts", type=int, default=20, help="restarts per server before giving up")
    pool.add_argument("--once", action="store_true", help="exit once every server is ready (leaves them running)")
    add_output_args(pool, progress=False)
    pool.set_defaults(func=_carla_pool)
    register_launch(sub)
    register_jobs(sub)


def parse_carla_servers(items: list[str]) -> list[tuple[str, int, int]]:
    """``HOST:PORT:TM_PORT`` strings -> (host, port, tm_port); InputError when malformed."""
    out = []
    for item in items:
        parts = item.rsplit(":", 2)
        try:
            host, port, tm = parts[0], int(parts[1]), int(parts[2])
        except (IndexError, ValueError):
            raise InputError(f"--carla wants HOST:PORT:TM_PORT, got {item!r}") from None
        out.append((host, port, tm))
    return out


def _table(summaries: list[dict]) -> str:
    from jax_drive.coop.evaluate import ID_KEYS, TV_KEYS
    from jax_drive.sim.metrics import format_table

    lines = []
    for family, keys in (("talking_vehicles", TV_KEYS), ("interdrive", ID_KEYS)):
        rows = [(f"{s['scenario']} [{s['policy']}{', bg' if s['background'] else ''}]",
                 {k: {m: float("nan") if v is None else v for m, v in s["aggregate"][k].items()} for k in keys})
                for s in summaries if s["family"] == family]
        if rows:
            lines.append(format_table(rows, keys))
    return "\n".join(lines)


def _run(args) -> int:
    import os

    # 0 would silently mean "the default" below; the rest is checked where it is used (plan_episodes, PoolConfig)
    require_min(1, seeds=args.seeds, workers=args.workers, chunk_size=args.chunk_size)
    require_min(0, max_time=args.max_time, task_timeout=args.task_timeout)
    from jax_drive.distributed.backends import CarlaBackend, JaxBackend
    from jax_drive.distributed.episodes import plan_episodes, summarise_records
    from jax_drive.distributed.pool import PoolConfig, ScenarioPool, ray_session
    from jax_drive.distributed.store import ResultStore

    specs = plan_episodes(args.scenario, range(args.seed, args.seed + args.seeds), args.episodes, config=args.config,
                          background=args.background, max_time=args.max_time)
    if args.backend == "carla":
        servers = parse_carla_servers(args.carla)
        if not servers:
            raise InputError("--backend carla needs one --carla HOST:PORT:TM_PORT per worker")
        backends = [CarlaBackend(host=h, port=p, tm_port=t, policy=args.policy) for h, p, t in servers]
        chunk = args.chunk_size or 1
    else:
        if args.carla:
            raise InputError("--carla is for --backend carla")
        backends = JaxBackend(policy=args.policy, xla_cache_dir=args.xla_cache)
        chunk = args.chunk_size or 4
    workers = args.workers or (len(backends) if isinstance(backends, list) else os.cpu_count() or 1)
    config = PoolConfig(num_workers=workers, chunk_size=chunk, max_restarts=args.max_restarts,
                        max_attempts=args.max_attempts, task_timeout_s=args.task_timeout)
    store = ResultStore(args.results)
    try:
        with ray_session(args.address) as resources:
            print(f"ray: {resources.get('CPU', 0):g} CPUs; {workers} workers; {len(specs)} episodes -> {args.results}")
            pool = ScenarioPool(backends, config)
            try:  # the workers start only if something is left to run
                summary = pool.run(specs, store, show_progress=not args.no_progress)
            finally:
                pool.shutdown()
    except KeyboardInterrupt:
        print(f"interrupted: {len(store.ids())} episodes recorded in {args.results}; rerun the same command to "
              "continue", file=sys.stderr)
        return 130
    reports = summarise_records(store.records())
    print(f"recorded {summary.recorded} (already {summary.already_recorded}) of {summary.planned}; "
          f"retried chunks {summary.retried_chunks}; worker deaths {summary.worker_deaths}; "
          f"duplicates ignored {summary.duplicates}; failed {len(summary.failed)}; {summary.wall_s:.1f} s")
    print(_table(reports))
    for episode_id, error in sorted(summary.failed.items()):
        print(f"  failed {episode_id}: {error}")
    if args.json:
        write_json(args.json, {"meta": run_metadata(command="scale-out run", ray_resources=resources),
                               "summary": summary.to_json(), "reports": reports})
        print(f"results: {args.json}")
    return 0 if summary.complete else 1


def _status(args) -> int:
    import os

    from jax_drive.distributed.episodes import summarise_records
    from jax_drive.distributed.store import ResultStore

    if not os.path.isdir(args.results):
        raise InputError(f"no results directory {args.results}")
    store = ResultStore(args.results)
    planned = store.planned_ids()
    done = store.ids()
    reports = summarise_records(store.records())
    print(f"{len(done & set(planned))} of {len(planned)} planned episodes recorded in {args.results}")
    print(_table(reports))
    if args.json:
        write_json(args.json, {"meta": run_metadata(command="scale-out status"), "planned": len(planned),
                               "recorded": len(done & set(planned)), "reports": reports})
    return 0


def _carla_pool(args) -> int:
    require_min(0, ready_timeout=args.ready_timeout, max_restarts=args.max_restarts)
    from jax_drive.carla.server import ServerPool, carla_probe, server_specs, tcp_probe

    try:
        gpus = [int(g) for g in args.gpus.split(",") if g.strip()]
    except ValueError:
        raise InputError(f"--gpus wants comma-separated integers, got {args.gpus!r}") from None
    specs = server_specs(args.carla_root, args.servers, base_port=args.base_port, stride=args.port_stride,
                         tm_base_port=args.tm_base_port, gpus=gpus, render=args.render)
    pool = ServerPool(specs, probe=carla_probe if args.probe == "carla" else tcp_probe,
                      ready_timeout_s=args.ready_timeout, max_restarts=args.max_restarts)
    try:
        pool.start()
        for row in pool.table():
            print(row)
        if args.json:
            write_json(args.json, {"meta": run_metadata(command="scale-out carla-pool"), "servers": pool.describe()})
        if args.once:
            pool.detach()
            return 0
        print("supervising (Ctrl-C stops the servers)")
        pool.supervise(report=print)
    except KeyboardInterrupt:
        pass
    finally:
        pool.shutdown()
    return 0
