"""What replay buys, with its confounds separated: per seed, five arms of a CPU preset, all
validated with the same seeds (seed, step, problem) over the same training steps. The plan, the
family of contrasts and the rules that word each interval: docs/study-plan.md. Needs scipy (its
t distribution) besides rlep.py's requirements.

    A1  baseline, all prompts     phase one of `python rlep.py` (folder seedS)
    A2  baseline, pool's prompts  --phase 1 --phase1_prompts pool --pool A3's pool (seedS-A2)
    A3  RLEP, as the paper        phase two of seedS: the pool's prompts, n fresh + m replayed
    A4  RLEP, all prompts         --phase 2 --phase2_prompts all --pool A3's pool (seedS-A4)
    A5  replays imitated          --phase 2 --replay_loss nll --pool A3's pool (seedS-A5)
    A6  RLEP, pool at T = 1.0     with --with_a6 only: seedS's phase-one checkpoint, a second
                                  collection at --collect_temperature 1.0, phase two (seedS-A6)

The report: per arm the curve, peak and final; the paired contrasts (peak and final) with raw
95 % t-intervals and Holm-adjusted ones over the family, each worded by the plan's rule; the
mechanism on matched prompts; per-kind finals; the compute every arm needs; forest.png (the
main figure) and curves.png. A run that finished (its timings.json) is reused, one cut short is
resumed, so a stopped study continues where it stopped; a run in another dtype or regime is set
aside and run again. It prints its expected time at the start. A finished run's checkpoints
are deleted (its metrics stay).

    python studies/study_replay.py --preset cpu-hard --seeds 1 2 3 4 5 6 7 8 --dtype bfloat16 \
        --out_dir runs/study-cpu-hard-offpolicy
    python studies/study_replay.py --preset cpu-hard --seeds 1 2 3 4 5 6 7 8 --dtype bfloat16 \
        --out_dir runs/study-cpu-hard-offpolicy --report_only
    python studies/study_replay.py --preset tiny --seeds 1 2 --val_k 4   # the script, in minutes

--study dynamic (docs/study-plan-dynamic.md): replay against DAPO's dynamic sampling. Per seed
of --seeds, A1, A3 (seedS) and A5 (seedS-A5) as above; on the seeds of --family_seeds also

    A7  baseline, dynamic sampling  --phase 1 --dynamic_sampling (seedS-A7)
    A8  RLEP, dynamic sampling      --phase 2 --pool A3's pool --dynamic_sampling (seedS-A8)

The family: A3 - A7, A8 - A3, A7 - A1 on the peak and the final (Holm over the 6); A3 - A5 over
every seed (Holm over its 2) and seed 1 against the off-policy study's published pool and
rescues; the curves against the responses generated from π_θ0 (compute.png) and their
differences at equal responses (raw); the metering of generation; each arm's first start
against the plan's commit; forest.png, curves.png, compute.png.

    python studies/study_replay.py --study dynamic --preset cpu-hard --seeds 1 2 3 4 5 6 7 8 9 \
        10 11 12 13 14 15 16 --dtype float32 --out_dir runs/study-dynamic
    python studies/study_replay.py --study dynamic --preset cpu-hard --seeds 1 2 3 4 5 6 7 8 9 \
        10 11 12 13 14 15 16 --dtype float32 --out_dir runs/study-dynamic --report_only

Across sittings (--archive DIR): runs/ is not kept, so each run, as soon as it has finished, is
written into DIR as one JSON document under its name (DIR/seedS.json, DIR/seedS-A5.json, ...),
reduced to what the report reads: config.json, timings.json, every part's metrics rows, the
collection's progress (each row's id and tokens) and pool, the first start line of FOLDER.log,
and the mark (what it is, its pool's form). The pool stays whole (its answer texts; "pool":
"full") while a run on it (--pool: A5, A8) is not archived, so that a later sitting runs that
arm from it; once every one is, it becomes each prompt's id and its count of verified answers
("pool": "reduced"): the one replacement the archive allows, derived from the full pool there.
Some 36-60 kB a seed on cpu-hard (more while its pool is full). Each document is written under
a temporary name and renamed in, so a stop leaves no run half there. At the start
(--report_only too), the archived runs of the seeds asked for that --out_dir lacks are written
into it as run folders marked archived (FOLDER/archived.json); an archived run counts as
finished and is never run nor resumed, the others run as usual (an arm on an archived pool
reads it there). A run still to do on a reduced pool stops the study (leave the seed out, or
move its archive away), and so do an archived run in another dtype or regime, and a run in
--out_dir that the archive holds otherwise (nothing is moved). The default DIR:
docs/runs/study-dynamic with --study dynamic --preset cpu-hard (the plan's), else none (a smoke
run on tiny keeps its archive out of the repository unless given one); --no-archive or
--archive '' turns it off. After each sitting, commit it:

    git add docs/runs/study-dynamic && git commit -m "study-dynamic: runs ... archived"

and the next sitting, from a fresh clone, runs the same command: the archived runs are read
back, the others run, and the report is made from both. A run's start line names its machine
(the CPU, and whether its bf16 is native or emulated); the report lists each kind of run's
machines, and the seeds whose runs ran on more than one.
"""
import argparse
import os
import sys
import time

import torch

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, repo)
import rlep  # noqa: E402
from machinery import fsdp, hub  # noqa: E402
from replay import runner  # noqa: E402
from replay.archiving import (check_archived, default_archive, restore_archived,  # noqa: E402
                              settle_finished)
from replay.arms import dynamic_runs_of, runs_of  # noqa: E402
from replay.dynamic_report import report_dynamic  # noqa: E402
from replay.offpolicy_report import report  # noqa: E402
from replay.runner import (archived, drop_checkpoints, expected_seconds, finished,  # noqa: E402
                           set_aside_stale)


def seed_runs(args, out: str, seed: int, settings: list, cfg) -> list:
    """The seed's runs of the study asked for (runs_of, dynamic_runs_of)."""
    if args.study == "dynamic":
        return dynamic_runs_of(out, seed, settings, seed in args.family_seeds)
    return runs_of(out, seed, settings, cfg, args.with_a6)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", default="offpolicy", choices=["offpolicy", "dynamic"],
                        help="offpolicy: A1-A5 (docs/study-plan.md); dynamic: A1, A3, A5, and "
                             "A7, A8 with dynamic sampling (docs/study-plan-dynamic.md)")
    parser.add_argument("--family_seeds", type=int, nargs="+", default=list(range(1, 9)),
                        help="--study dynamic: the seeds that also run A7 and A8, the family's")
    parser.add_argument("--preset", default="cpu-hard", choices=["cpu", "cpu-hard", "tiny"],
                        help="tiny: a smoke run of the study in minutes")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(1, 9)))
    parser.add_argument("--val_k", type=int, default=8)
    parser.add_argument("--val_every", type=int, default=2)
    parser.add_argument("--out_dir", default=None,
                        help="default: runs/study-PRESET (--study dynamic: "
                             "runs/study-dynamic-PRESET)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                        help="one compute dtype for every run (auto: measured once, here); "
                             "the plans pin bfloat16 (off-policy) and float32 (dynamic)")
    parser.add_argument("--with_a6", action="store_true",
                        help="also A6, the pool at T = 1.0 (dropped by the plan)")
    parser.add_argument("--report_only", action="store_true")
    parser.add_argument("--archive", default=None,
                        help="each finished run, reduced, kept here (commit it) and read "
                             f"back in a later sitting; default: {default_archive} with --study "
                             "dynamic --preset cpu-hard, else none; '' or --no-archive: none")
    parser.add_argument("--no-archive", dest="archive", action="store_const", const="")
    args = parser.parse_args()
    dynamic = args.study == "dynamic"
    name = f"study-dynamic-{args.preset}" if dynamic else f"study-{args.preset}"
    out = args.out_dir or os.path.join("runs", name)
    archive = args.archive
    if archive is None and dynamic and args.preset == "cpu-hard":
        archive = os.path.join(repo, default_archive)
    if dynamic and not args.report_only and not hasattr(rlep.Config, "dynamic_sampling"):
        raise SystemExit("--study dynamic: this rlep.py has no --dynamic_sampling")
    os.makedirs(out, exist_ok=True)
    if archive:
        restore_archived(out, archive, args.seeds)
    settings = ["--preset", args.preset, "--val_k", str(args.val_k),
                "--val_every", str(args.val_every)]
    cfg = rlep.parse_config(settings)
    start = time.time()
    if not args.report_only:
        # rlep.py measures the dtype per run; a busy machine could flip one run's choice
        model_path = hub.model_folder(cfg.model_path, cfg.cache_dir, build=True)
        choice = fsdp.resolve_dtype(args.dtype, torch.device("cpu"), model_path)
        speeds = ", ".join(f"{k} {v:.0f}" for k, v in choice.gflops.items())
        why = choice.why if "measured" in choice.why else f"{choice.why}; GFLOP/s here: {speeds}"
        print(f"every run in {choice.dtype} ({why})", flush=True)
        if choice.dtype == "bfloat16" and choice.gflops.get("bfloat16", 1) < choice.gflops.get(
                "float32", 0):
            print("bf16 looks emulated here (slower than float32): the runs stay in bf16 for "
                  "comparability, and take several times the estimate below", flush=True)
        settings += ["--dtype", choice.dtype]
        cfg = rlep.parse_config(settings)
        for seed in args.seeds:
            check_archived(seed, seed_runs(args, out, seed, settings, cfg), archive)
        for seed in args.seeds:
            set_aside_stale(seed_runs(args, out, seed, settings, cfg), choice.dtype, cfg,
                            dynamic)
        for seed in args.seeds:  # the runs that finished here before
            settle_finished(out, archive, seed, seed_runs(args, out, seed, settings, cfg))
        expected = expected_seconds(out, {s: seed_runs(args, out, s, settings, cfg)
                                          for s in args.seeds}, cfg.preset)
        hours = f" ({expected / 3600:.1f} h)" if expected >= 3600 else ""
        print(f"study {args.preset}, seeds {args.seeds}: expected {expected / 60:.0f} min{hours} "
              "more (finished runs' times, else the project machine's solo)", flush=True)
        for seed in args.seeds:
            runs = seed_runs(args, out, seed, [*settings, "--seed", str(seed)], cfg)
            for folder, flags in runs:
                if not finished(folder) and not archived(folder):
                    runner.run(folder, flags, runs[0][0])
                settle_finished(out, archive, seed, runs)  # each run as soon as it finished
            drop_checkpoints(out, seed)
            print(f"seed {seed} done after {(time.time() - start) / 60:.0f} min", flush=True)
    if dynamic:
        report_dynamic(out, args.seeds, args.family_seeds, cfg)
    else:
        report(out, args.seeds, cfg, args.with_a6)
    print(f"study time {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
