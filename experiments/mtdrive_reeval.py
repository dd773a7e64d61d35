"""Evaluates finished MTDrive runs again on a larger held-out set.

A small held-out set (the cpu-demo's 3 sets x 5 scenes) makes standard errors as large as
the effects they judge. This loads each run's final SFT policy and last mtGRPO checkpoint,
evaluates them greedily on ``--eval-scenes`` scenes per held-out set (same generator and
keys, so each set starts with the run's own scenes and the run's own evaluation is
reproduced when ``--eval-scenes`` is its number), and writes a ``results.json`` of the
run's schema that ``experiments/mtdrive_seeds.py`` summarises like any run:

    python experiments/mtdrive_reeval.py runs/study_s{0,1,2} --eval-scenes 16 --out-root runs/reeval16
    python experiments/mtdrive_seeds.py runs/reeval16/study_s{0,1,2} --json OUT

Each re-evaluation has its own journal (``<out-root>/<run name>/``; default ``<run>/reeval_<N>``),
one stage per policy, so ``--resume`` continues a killed one. Exit status: 0 done, 2 bad
usage or input.
"""

from __future__ import annotations

import argparse
import os
import sys

from jax_drive.names import MTDRIVE_POLICIES
from jax_drive.runinfo import check_output, output_dir, require_min, run_main


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run directories of experiments/mtdrive.py / jax-drive train")
    parser.add_argument("--eval-scenes", type=int, required=True, help="held-out scenes per evaluation seed")
    parser.add_argument("--evaluate", nargs="+", default=["sft", "rl"], metavar="STAGE", choices=MTDRIVE_POLICIES,
                        help=f"policies to evaluate: {', '.join(MTDRIVE_POLICIES)} (default: sft rl)")
    parser.add_argument("--out-root", default=None, type=output_dir,
                        help="write each re-evaluation to OUT_ROOT/<run name> (default: <run>/reeval_<N>)")
    parser.add_argument("--resume", action="store_true", help="continue re-evaluations that were stopped")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    args = parser.parse_args(argv)
    require_min(1, eval_scenes=args.eval_scenes)
    for run in args.runs:
        if args.out_root is None:
            check_output(os.path.join(run, f"reeval_{args.eval_scenes}"), "the re-evaluation directory",
                         directory=True)

    from jax_drive.pipelines.journal import RunDirError
    from jax_drive.pipelines.mtdrive import reevaluate
    from jax_drive.pipelines.mtdrive.plots import write_plots
    from jax_drive.pipelines.mtdrive.report import results_table, write_results

    names = [os.path.basename(os.path.normpath(run)) for run in args.runs]
    if args.out_root is not None and len(set(names)) < len(names):
        parser.error(f"runs with the same name {names} would share a directory under --out-root")
    for run, name in zip(args.runs, names):
        out = (os.path.join(args.out_root, name) if args.out_root is not None
               else os.path.join(run, f"reeval_{args.eval_scenes}"))
        try:
            results = reevaluate(run, out, args.eval_scenes, evaluate=args.evaluate, resume=args.resume,
                                 progress=not args.no_progress)
        except (ValueError, FileNotFoundError) as error:
            parser.error(str(error))
        except RunDirError as error:
            parser.error(f"{error} (--resume continues it)")
        write_results(results, os.path.join(out, "results.json"))
        write_plots(results, os.path.join(out, ""))
        print(f"{run} ({args.eval_scenes} scenes per held-out set):")
        print(results_table(results))
        print(f"wrote {os.path.join(out, 'results.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
