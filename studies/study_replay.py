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
import collections
import glob
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time

import numpy as np
import torch
from scipy import stats

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, repo)
import rlep  # noqa: E402
from machinery import data, fsdp, hub
from machinery.files import read_jsonl  # noqa: E402

# arm -> (label, folder suffix, part whose curve it is)
arms = {"A1": ("baseline, all prompts", "", "phase1"),
        "A2": ("baseline, pool's prompts", "-A2", "phase1"),
        "A3": ("RLEP (the paper)", "", "phase2"),
        "A4": ("RLEP, all prompts", "-A4", "phase2"),
        "A5": ("replays imitated (nll)", "-A5", "phase2")}
arm_a6 = ("RLEP, pool at T = 1.0", "-A6", "phase2")
# the family (docs/study-plan.md), each on the peak and on the final; --with_a6 adds A3 - A6
family = [("A3", "A2"), ("A4", "A1"), ("A3", "A5"), ("A3", "A1")]
alpha = 0.05  # family-wise, Holm
null_band = 2.0  # points: a Holm interval inside [-2, +2] that holds 0 is a null
mechanism_band = 5.0  # points of next-visit accuracy, the same rule for the mechanism
# a finished run whose config differs in one of these is set aside and run again
regime_keys = ("prompts_per_step", "n", "replay_m", "mini_batch_prompts", "epochs",
               "equal_updates", "clip_low", "clip_high", "clip_c", "lr", "temperature",
               "phase2_steps", "collect_step", "collect_k", "val_k", "val_every")
# seconds of each run on the project's machine (bf16, two optimizer steps a training step),
# until finished runs say better: docs/study-plan.md, "Expected time". -A7 and -A8 (--study
# dynamic) are guesses, no run has timed them: 1.6 x A2's and 1.6 x A5's, for the further rounds
# of generation that dynamic sampling draws
default_seconds = {"cpu-hard": {"": 600, "-A2": 180, "-A4": 190, "-A5": 190, "-A6": 400,
                                "-A7": 290, "-A8": 305},
                   "cpu": {"": 290, "-A2": 145, "-A4": 155, "-A5": 145, "-A6": 175,
                           "-A7": 230, "-A8": 230},
                   "tiny": {"": 20, "-A2": 15, "-A4": 15, "-A5": 15, "-A6": 15,
                            "-A7": 25, "-A8": 25}}

# --study dynamic (docs/study-plan-dynamic.md): A1, A3 and A5 as above on every seed; A7 and A8,
# DAPO's dynamic sampling (--dynamic_sampling), on the family's seeds only
dynamic_plan = "docs/study-plan-dynamic.md"
dynamic_arms = {"A1": arms["A1"], "A3": arms["A3"], "A5": arms["A5"],
                "A7": ("baseline, dynamic sampling", "-A7", "phase1"),
                "A8": ("RLEP, dynamic sampling", "-A8", "phase2")}
family_arms = ("A1", "A3", "A7", "A8")  # a seed of the family has all four
# replay against DAPO's remedy; what dynamic sampling adds to replay; what it buys the baseline
dynamic_family = [("A3", "A7"), ("A8", "A3"), ("A7", "A1")]
on_pool = ("A3", "A5", "A8")  # charged phase one up to the collection, and the collection
# The reproduction check: seed 1's numbers as published by the off-policy study (docs/studies.md,
# "Pools and rescues" of the off-policy study on cpu-hard, run at commit 7c0a0e0): the pool's
# prompts; per arm, the rescued visits of steps 1-6 and their share (%, whole) of the visits to
# pooled prompts in steps 1-3
offpolicy_seed1 = {"pool": 38, "A3": (18, 58), "A5": (15, 50)}


def study_arms(with_a6: bool) -> dict:
    return {**arms, "A6": arm_a6} if with_a6 else dict(arms)


def study_family(with_a6: bool) -> list:
    return family + [("A3", "A6")] if with_a6 else list(family)


def runs_of(out: str, seed: int, settings: list, cfg, with_a6: bool = False) -> list:
    """(folder, rlep.py flags) of a seed's runs, in the order they must run."""
    main = os.path.join(out, f"seed{seed}")
    pool = os.path.join(main, "collect", "pool.jsonl")
    runs = [(main, settings),
            (main + "-A2", settings + ["--phase", "1", "--phase1_prompts", "pool", "--pool", pool,
                                       "--phase1_steps", str(cfg.phase2_steps)]),
            (main + "-A4", settings + ["--phase", "2", "--pool", pool, "--phase2_prompts", "all"]),
            (main + "-A5", settings + ["--phase", "2", "--pool", pool, "--replay_loss", "nll"])]
    if with_a6:
        runs.append((main + "-A6", settings + ["--collect_temperature", "1.0"]))
    return runs


def dynamic_runs_of(out: str, seed: int, settings: list, family_seed: bool) -> list:
    """(folder, rlep.py flags) of a seed's runs in --study dynamic, in the order they must run:
    the main run (A1, A3) and A5 as runs_of's; on a seed of the family also A7 and A8."""
    main = os.path.join(out, f"seed{seed}")
    pooled = ["--phase", "2", "--pool", os.path.join(main, "collect", "pool.jsonl")]
    runs = [(main, settings), (main + "-A5", settings + pooled + ["--replay_loss", "nll"])]
    if family_seed:
        runs += [(main + "-A7", settings + ["--phase", "1", "--dynamic_sampling"]),
                 (main + "-A8", settings + pooled + ["--dynamic_sampling"])]
    return runs


def finished(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "timings.json"))


def run_config(folder: str) -> dict:
    path = os.path.join(folder, "config.json")
    return json.load(open(path)) if os.path.isfile(path) else {}


def run_dtype(folder: str):
    """The compute dtype a run trained in (its config.json), None before it started."""
    return run_config(folder).get("dtype")


def stale_reason(folder: str, dtype: str, cfg, dynamic: bool = None) -> str:
    """Why a started run cannot join the study ('' if it can): another dtype or regime.
    dynamic (--study dynamic): whether the arm asks for dynamic sampling; a run made without
    it (no such key) had none; with it, max_gen_rounds must be the study's too."""
    config = run_config(folder)
    if not config:
        return ""
    if config.get("dtype") != dtype:
        return f"not in {dtype}"
    differ = [k for k in regime_keys if config.get(k) != getattr(cfg, k)]
    if dynamic is not None and config.get("dynamic_sampling", False) != dynamic:
        differ.append("dynamic_sampling")
    if dynamic and config.get("max_gen_rounds") != getattr(cfg, "max_gen_rounds", None):
        differ.append("max_gen_rounds")
    return f"another regime ({', '.join(differ)})" if differ else ""


def set_aside_stale(runs: list, dtype: str, cfg, dynamic: bool = False):
    """Arms compare at one precision and in one regime: a run in another is renamed
    FOLDER.DTYPE (or FOLDER.old) and run again; if the seed's main run goes, so do the runs
    on its pool or its phase one (A6). dynamic: also check each run's dynamic sampling against
    its flags' (--study dynamic). A stale archived run stops it, before anything moves."""
    stale = {folder: stale_reason(folder, dtype, cfg,
                                  ("--dynamic_sampling" in flags) if dynamic else None)
             for folder, flags in runs}
    stale = {folder: why for folder, why in stale.items() if why}
    if runs[0][0] in stale:
        for folder, flags in runs[1:]:
            if ("--pool" in flags or folder.endswith("-A6")) and os.path.exists(folder):
                stale.setdefault(folder, "its pool is set aside")
    for folder, why in stale.items():
        if archived(folder):
            raise SystemExit(f"{folder}: {why}, and it is an archived run (--archive), never "
                             "set aside nor run again: run the study in its dtype and regime, "
                             "or move its seed's archive away")
    for folder, why in stale.items():
        aside = f"{folder}.{run_dtype(folder) or dtype}"
        while os.path.exists(aside):
            aside += ".old"
        print(f"{folder}: {why}, moved to {aside} to run again", flush=True)
        os.rename(folder, aside)
        if os.path.exists(folder + ".log"):
            os.rename(folder + ".log", aside + ".log")


def run(folder: str, flags: list, main_folder: str):
    if folder.endswith("-A6") and not os.path.exists(os.path.join(folder, "phase1")):
        # phase one is A3's: its checkpoint builds the second pool
        os.makedirs(folder, exist_ok=True)
        os.symlink(os.path.abspath(os.path.join(main_folder, "phase1")),
                   os.path.join(folder, "phase1"))
    resume = ["--resume"] if os.path.isfile(os.path.join(folder, "config.json")) else []
    command = [sys.executable, "rlep.py", "--out_dir", folder, *flags, *resume]
    print(" ".join(command), flush=True)
    with open(folder + ".log", "a") as log:
        # rlep.py writes no time: the report's evidence that the plan came first
        log.write(f"{started_mark}{utc(time.time())} on {machine()}\n")
        log.flush()
        done = subprocess.run(command, cwd=repo, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)} (see {folder}.log)")


def utc(seconds: float) -> str:
    """A time as ISO 8601 in UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


started_mark = "study_replay.py: run started at "  # the first line of a run's log


def machine(cpuinfo: str = "/proc/cpuinfo") -> str:
    """'CPU (bf16 KIND)' of this machine, for a run's start line: the first model name of
    cpuinfo (else platform.processor(), else 'unknown CPU'), and KIND 'native: amx' or
    'native: avx512_bf16' by its flags, else 'emulated' (slower than float32): runs of one seed
    on two machines differ in bf16's rounding and in time."""
    name, flags = "", []
    try:
        for line in open(cpuinfo, errors="replace"):
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not name:
                name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = value.split()
    except OSError:
        pass
    kind = ("native: amx" if "amx_bf16" in flags else
            "native: avx512_bf16" if "avx512_bf16" in flags else "emulated")
    return f"{name or platform.processor() or 'unknown CPU'} (bf16 {kind})"


def expected_seconds(out: str, seed_runs: dict, preset: str) -> float:
    """The runs still to do, each at the mean time of its finished kind (else the default).
    seed_runs: seed -> its runs (runs_of, dynamic_runs_of)."""
    spent = collections.defaultdict(list)
    todo = []
    for seed, runs in seed_runs.items():
        for folder, _ in runs:
            kind = folder[len(os.path.join(out, f"seed{seed}")):]
            if finished(folder):
                spent[kind].append(json.load(open(os.path.join(folder, "timings.json")))["total_s"])
            else:
                todo.append(kind)
    default = default_seconds[preset]
    return sum(np.mean(spent[k]) if spent[k] else default[k] for k in todo)


def curve(folder: str, part: str, steps: int) -> tuple:
    """(steps, val_acc, metrics rows, {kind: val_acc}) of a part, up to `steps`."""
    rows = [r for r in read_jsonl(os.path.join(folder, part, "metrics.jsonl"))
            if r["step"] <= steps]
    points = [r for r in rows if "val_acc" in r]
    kinds = {k[len("val_acc/"):]: np.array([r[k] for r in points])
             for k in (points[0] if points else {}) if k.startswith("val_acc/")}
    return (np.array([r["step"] for r in points]), np.array([r["val_acc"] for r in points]),
            rows, kinds)


# -----------------------------------------------------------------------------------------
# Intervals, p-values, Holm and the words (docs/study-plan.md); Student's t from scipy.stats

# two-sided 95 % quantiles of Student's t by degrees of freedom, to two decimals: the table the
# plans state for the raw intervals (the committed reports used it); beyond it the exact quantile
t95_table = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def t95_bounds(values) -> tuple:
    """(mean, low, high): a 95 % t-interval over seeds, in the values' units."""
    values = np.asarray(values, dtype=float)
    half = float("nan")
    if len(values) > 1:
        df = len(values) - 1
        quantile = t95_table[df] if df in t95_table else stats.t.ppf(0.975, df)
        half = quantile * values.std(ddof=1) / math.sqrt(len(values))
    mean = values.mean()
    return mean, mean - half, mean + half


def interval(values) -> str:
    """mean and a 95 % t-interval over seeds, in points."""
    mean, low, high = t95_bounds(values)
    return f"{100 * mean:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"


def paired_test(values) -> dict:
    """mean, standard error and two-sided t-test p-value of per-seed differences (all equal:
    p 0, or 1 if they are 0, where scipy's ttest_1samp would give nan)."""
    values = np.asarray(values, dtype=float)
    n = len(values)
    mean = float(values.mean())
    se = float(values.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    if n < 2:
        p = float("nan")
    elif se == 0:
        p = 0.0 if mean != 0 else 1.0
    else:
        p = float(2 * stats.t.sf(abs(mean) / se, n - 1))
    return {"n": n, "mean": mean, "se": se, "p": p}


def holm(p_values: list, alpha: float = alpha) -> list[dict]:
    """Holm's step-down over the family, per contrast in the given order: the level of its
    interval, its adjusted p-value, rejected or not (scipy.stats has no Holm, and the level of
    each interval is the plan's, not a library's). Sorted by p, rank i (0-based) of m is
    tested at alpha / (m - i) while every rank before it was rejected; the first rank not
    rejected and all after it keep that rank's level, so an interval excludes 0 exactly
    where Holm rejects."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    out = [None] * m
    running, stopped = 0.0, None
    for rank, i in enumerate(order):
        level = alpha / (m - rank)
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        rejected = stopped is None and p_values[i] <= level
        if not rejected and stopped is None:
            stopped = level
        out[i] = {"level": level if rejected else stopped, "p_holm": running,
                  "rejected": rejected, "rank": rank + 1}
    return out


def level_bounds(test: dict, level: float) -> tuple:
    """(low, high) of a t-interval at two-sided level `level` (alpha), from paired_test."""
    if test["n"] < 2:
        return float("nan"), float("nan")
    half = stats.t.ppf(1 - level / 2, test["n"] - 1) * test["se"]
    return test["mean"] - half, test["mean"] + half


def excludes_zero(low: float, high: float) -> bool:
    return low > 0 or high < 0


def word(low: float, high: float, band: float, raw: tuple = None) -> str:
    """The plan's rule: a difference if the interval excludes 0; a null if it holds 0 and
    lies inside [-band, +band]; else uninformative (noting a raw interval that alone
    excludes 0)."""
    if math.isnan(low) or math.isnan(high):
        return "no interval"
    if excludes_zero(low, high):
        return f"a difference ({'+' if low > 0 else '-'})"
    if -band <= low and high <= band:
        return f"a null (inside ±{band:.1f})"
    if raw is not None and excludes_zero(*raw):
        return "uninformative (raw interval excludes 0; not after Holm)"
    return "uninformative"


def points(mean: float, low: float, high: float) -> str:
    return f"{mean:+.1f} [{low:+.1f}, {high:+.1f}]"


def percent(summary: dict) -> str:
    """An over_seeds mean as a percentage, '-' without values."""
    return f"{summary['mean']:.1f} %" if "mean" in summary else "-"


def contrasts_table(acc: dict, pairs: list) -> list[dict]:
    """Every contrast of the family on the peak and the final, in points: raw 95 % and Holm
    intervals and the word. acc: arm -> (seeds, points) validation accuracy."""
    rows = []
    for a, b in pairs:
        for measure in ("peak", "final"):
            if measure == "peak":
                diff = acc[a][:, 1:].max(1) - acc[b][:, 1:].max(1)
            else:
                diff = acc[a][:, -1] - acc[b][:, -1]
            diff = 100 * diff
            rows.append({"contrast": f"{a} - {b}", "measure": measure, "values": diff.tolist(),
                         "raw": t95_bounds(diff)[1:], **paired_test(diff)})
    for row, holm_row in zip(rows, holm([r["p"] for r in rows])):
        row.update(holm_row)
        row["holm"] = level_bounds(row, row["level"])
        row["word"] = word(*row["holm"], null_band, raw=row["raw"])
    return rows


# -----------------------------------------------------------------------------------------
# The mechanism: a prompt's next visit, on matched prompts (docs/study-plan.md)

def visit_table(rows: list) -> dict:
    """{(step, prompt id): visit} of a part's metrics rows, training steps only."""
    return {(r["step"], v["id"]): v for r in rows if r["step"] > 0 for v in r.get("visits", [])}


def next_steps(table: dict) -> dict:
    """{(step, prompt id): the step of the prompt's next visit, or None}."""
    by_id = collections.defaultdict(list)
    for step, prompt in table:
        by_id[prompt].append(step)
    following = {}
    for prompt, steps in by_id.items():
        steps.sort()
        for here, then in zip(steps, steps[1:] + [None]):
            following[here, prompt] = then
    return following


def matched_next_visits(rows_a: list, rows_b: list, n: int) -> dict:
    """Visits whose n fresh samples were all wrong in both arms (same step, same prompt):
    per such visit with a next visit in both, that visit's fresh accuracy a - b. Also
    'rescued' (of the matched visits, rescued in arm a) and 'unmatched' (next visits at
    different steps: the visit orders differ, which they must not)."""
    a, b = visit_table(rows_a), visit_table(rows_b)
    next_a, next_b = next_steps(a), next_steps(b)
    found = {"differences": [], "a": [], "b": [], "rescued": 0, "matched": 0, "unmatched": 0}
    for key, visit in sorted(a.items()):
        if visit["fresh_correct"] or key not in b or b[key]["fresh_correct"]:
            continue
        found["matched"] += 1
        found["rescued"] += bool(visit["rescued"])
        then_a, then_b = next_a[key], next_b[key]
        if then_a is None or then_b is None:
            continue
        if then_a != then_b:
            found["unmatched"] += 1
            continue
        acc_a = a[then_a, key[1]]["fresh_correct"] / n
        acc_b = b[then_b, key[1]]["fresh_correct"] / n
        found["a"].append(acc_a)
        found["b"].append(acc_b)
        found["differences"].append(acc_a - acc_b)
    return found


def rescue_comparator(rows: list, n: int) -> dict:
    """The comparator planned before: next-visit fresh accuracy after a rescued visit and
    after a pooled visit that was not rescued, in one arm."""
    table = visit_table(rows)
    following = next_steps(table)
    found = {"rescued": [], "not rescued": []}
    for key, visit in sorted(table.items()):
        then = following[key]
        if not visit["replays"] or then is None:
            continue
        kind = "rescued" if visit["rescued"] else "not rescued"
        found[kind].append(table[then, key[1]]["fresh_correct"] / n)
    return found


def over_seeds(per_seed: list, band: float) -> dict:
    """Per-seed means (in points; seeds without values left out), their raw 95 % t-interval
    and the word."""
    values = [100 * float(np.mean(v)) for v in per_seed if len(v)]
    out = {"seeds": len(values), "values": values}
    if len(values) > 1:
        mean, low, high = t95_bounds(values)
        out.update(mean=mean, raw=(low, high), word=word(low, high, band))
    elif values:
        out.update(mean=values[0], raw=(float("nan"),) * 2, word="no interval")
    return out


def mechanism(found: dict, seeds: list, n: int) -> dict:
    """The matched mechanism (A3 - A2, A5 - A2) and the planned comparator, per seed and
    over seeds. found: (seed, arm) -> curve(...)."""
    out = {}
    for a, b in (("A3", "A2"), ("A5", "A2")):
        per_seed = [matched_next_visits(found[s, a][2], found[s, b][2], n) for s in seeds]
        out[f"{a} - {b}"] = {
            **over_seeds([m["differences"] for m in per_seed], mechanism_band),
            "pairs": [len(m["differences"]) for m in per_seed],
            "matched": [m["matched"] for m in per_seed],
            "rescued": [m["rescued"] for m in per_seed],
            "unmatched": sum(m["unmatched"] for m in per_seed),
            a: over_seeds([m["a"] for m in per_seed], mechanism_band),
            b: over_seeds([m["b"] for m in per_seed], mechanism_band)}
    per_seed = [rescue_comparator(found[s, "A3"][2], n) for s in seeds]
    both = [(c["rescued"], c["not rescued"]) for c in per_seed
            if c["rescued"] and c["not rescued"]]
    out["A3: rescued - not rescued"] = {
        **over_seeds([[np.mean(r) - np.mean(u)] for r, u in both], mechanism_band),
        "rescued": over_seeds([c["rescued"] for c in per_seed], mechanism_band),
        "not rescued": over_seeds([c["not rescued"] for c in per_seed], mechanism_band),
        "visits": [(len(c["rescued"]), len(c["not rescued"])) for c in per_seed]}
    return out


# -----------------------------------------------------------------------------------------
# Compute, in generated responses (docs/study-plan.md, "Fair compute")

def generated(row: dict, n: int) -> int:
    """A training step's fresh responses from π_θ: its gen_responses; a run made before dynamic
    sampling was metered generated n a visit."""
    return row.get("gen_responses", len(row["visits"]) * n)


def part_cost(rows: list, n: int, until: int) -> dict:
    """Generated responses and tokens of training steps 1..until, and sequences trained (the
    fresh of the visits trained, and their replays)."""
    rows = [r for r in rows if 0 < r["step"] <= until]
    fresh = [generated(r, n) for r in rows]
    return {"responses": sum(fresh),
            "tokens": sum(r["response_len"] * f for r, f in zip(rows, fresh)),
            "trained": sum(len(r["visits"]) * n + sum(v["replays"] for v in r["visits"])
                           for r in rows)}


def arm_costs(out: str, seed: int, found: dict, cfg, arm_names, pooled=None) -> dict:
    """Per arm: (phase one up to the collection, collection, own training) responses, the
    generated tokens and the sequences trained; the arms in `pooled` use the pool (default:
    every arm but A1)."""
    main = os.path.join(out, f"seed{seed}")
    before = part_cost(found[seed, "A1"][2], cfg.n, cfg.collect_step)
    costs = {}
    for arm in arm_names:
        own = part_cost(found[seed, arm][2], cfg.n, cfg.phase2_steps)
        charged = {"before": 0, "collection": 0, "tokens": own["tokens"]}
        if (arm != "A1") if pooled is None else (arm in pooled):
            collection = os.path.join(main + ("-A6" if arm == "A6" else ""), "collect")
            tried = read_jsonl(os.path.join(collection, "progress.jsonl"))
            charged = {"before": before["responses"], "collection": len(tried) * cfg.collect_k,
                       "tokens": own["tokens"] + before["tokens"]
                       + sum(t.get("tokens", 0) for t in tried)}
        costs[arm] = {**charged, "own": own["responses"], "trained": own["trained"],
                      "total": charged["before"] + charged["collection"] + own["responses"]}
    return costs


def noise(p: float, samples: int) -> float:
    """One point's sampling noise, in points, at accuracy p over `samples` samples."""
    return 100 * math.sqrt(max(p * (1 - p), 0.0) / samples)


def curve_line(name: str, acc, per_point: int) -> str:
    """A curves-table row: mean (sd) over seeds at each point, the peak, the final and one
    point's noise. acc: (seeds, points) validation accuracy."""
    spread = acc.std(0, ddof=1) if len(acc) > 1 else 0 * acc[0]
    cells = [f"{100 * m:.1f} ({100 * sd:.1f})" for m, sd in zip(acc.mean(0), spread)]
    final = acc[:, -1].mean()
    return (f"| {name} | " + " | ".join(cells) + f" | {100 * acc[:, 1:].max(1).mean():.1f} | "
            f"{100 * final:.1f} | ±{noise(final, per_point):.1f} |")


def curves_prose(cfg, dtypes: set, n_val: int, seeds_said: str) -> str:
    """The sentence above a curves table: the validation, the seeds, what the cells are."""
    return (f"Preset {cfg.preset}, compute dtype {' and '.join(sorted(dtypes))}: validation "
            f"avg@{cfg.val_k} on {n_val} held-out problems every {cfg.val_every} steps "
            f"({n_val * cfg.val_k} samples a point); {seeds_said}; mean over seeds (sd over "
            "seeds), in %; peak: the best point after step 0; noise: one point's sampling noise "
            "at the final's mean, sqrt(p (1 - p) / samples).")


def contrast_lines(rows: list) -> list[str]:
    """contrasts_table's rows as a markdown table."""
    lines = ["| contrast | measure | mean [raw 95 %] | p | Holm rank, level | Holm interval "
             "| Holm p | word |", "|---" * 8 + "|"]
    for r in rows:
        lines.append(f"| {r['contrast']} | {r['measure']} | {points(r['mean'], *r['raw'])} | "
                     f"{r['p']:.4f} | {r['rank']}, {r['level']:.4f} | "
                     f"{points(r['mean'], *r['holm'])} | {r['p_holm']:.4f} | {r['word']} |")
    return lines


def per_kind_finals(found: dict, seeds: list, names, pairs: list, per_point: int,
                    avg: str) -> tuple:
    """(lines, {arm: {kind: finals over seeds}}): the final per kind (data_source), mean over
    seeds with one point's noise, and the pairs' final differences per kind with raw 95 %
    t-intervals (exploratory). No kinds: ([], {})."""
    kinds = sorted(found[seeds[0], "A1"][3])
    if not kinds:
        return [], {}
    by_kind = {arm: {k: np.array([found[s, arm][3][k][-1] for s in seeds]) for k in kinds}
               for arm in names}
    per_kind = per_point / len(kinds)
    lines = ["", f"Final {avg} by kind (data_source), mean over seeds, % (± one point's "
             f"sampling noise, {per_kind:.0f} samples a kind):", "",
             "| arm | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 1) + "|"]
    for arm in names:
        means = [by_kind[arm][k].mean() for k in kinds]
        cells = [f"{100 * m:.1f} (±{noise(m, per_kind):.1f})" for m in means]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines += ["", "Per kind, the final's paired contrasts, raw 95 % t-intervals in points: "
              "exploratory (not in the family, no correction, no causal reading):", "",
              "| contrast | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 1) + "|"]
    for a, b in pairs:
        cells = [interval(by_kind[a][k] - by_kind[b][k]) for k in kinds]
        lines.append(f"| {a} - {b} | " + " | ".join(cells) + " |")
    return lines, {arm: {k: v.tolist() for k, v in d.items()} for arm, d in by_kind.items()}


def rescues(rows: list) -> tuple:
    """(rescued visits of the training steps, their share of the visits to pooled prompts in
    steps 1-3): a cell of the "Pools and rescues" table."""
    rows = [r for r in rows if r["step"] > 0]
    early = [r for r in rows if r["step"] <= 3]
    pooled = sum(v["replays"] > 0 for r in early for v in r["visits"])
    share = sum(r["rescued"] for r in early) / max(1, pooled)
    return sum(r["rescued"] for r in rows), share


def pools_lines(out: str, found: dict, seeds: list, replay_arms: list, cfg) -> list[str]:
    """The "Pools and rescues" table: per seed the pool's prompts and, per arm on the pool, the
    rescued visits of the training steps with their share (rescues()); '-' for an arm a seed
    lacks."""
    num_train = len(data.read_rows(cfg.train_file))
    lines = ["", f"Per seed: the pool (prompts of the {num_train} training prompts with at least "
             f"{cfg.min_successes} verified answers of K = {cfg.collect_k}), and the rescued "
             f"visits of steps 1-{cfg.phase2_steps} (in brackets, of steps 1-3: their share of "
             "the visits to pooled prompts):", "",
             "| seed | pool | " + " | ".join(replay_arms) + " |",
             "|---" * (len(replay_arms) + 2) + "|"]
    for s in seeds:
        main = os.path.join(out, f"seed{s}")
        cells = [f"{len(read_jsonl(os.path.join(main, 'collect', 'pool.jsonl')))}"]
        for arm in replay_arms:
            if (s, arm) not in found:
                cells.append("-")
                continue
            rescued, share = rescues(found[s, arm][2])
            cells.append(f"{rescued} ({100 * share:.0f} %)")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return lines


def provenance(plan: str = "docs/study-plan.md") -> str:
    """The plan's commit and the code's, for the report."""
    def git(*args):
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else "?"
    commit = git("log", "-1", "--format=%h %cs", "--", plan) or "uncommitted"
    changed = git("status", "--porcelain", "--", "rlep.py", "machinery", "verify.py",
                  "studies/study_replay.py", plan)
    state = "as committed" if not changed else "with uncommitted changes"
    return f"plan {plan} at {commit}; code at {git('rev-parse', '--short', 'HEAD')} " \
           f"({state})"


# -----------------------------------------------------------------------------------------
# The report

def write_report(out: str, lines: list, results: dict):
    """table.md and results.json in out; the table on stdout."""
    table = "\n".join(lines)
    open(os.path.join(out, "table.md"), "w").write(table + "\n")
    json.dump(results, open(os.path.join(out, "results.json"), "w"), indent=1, default=float)
    print(table)


def report(out: str, seeds: list, cfg, with_a6: bool = False) -> dict:
    names = study_arms(with_a6)
    horizon = cfg.phase2_steps
    found = {}
    dtypes = set()
    for seed in seeds:
        for arm, (_, suffix, part) in names.items():
            folder = os.path.join(out, f"seed{seed}{suffix}")
            found[seed, arm] = curve(folder, part, horizon)
            dtypes.add(str(run_dtype(folder)))
    steps = found[seeds[0], "A1"][0]
    n_val = len(data.read_rows(cfg.val_file))
    per_point = n_val * cfg.val_k
    avg = f"avg@{cfg.val_k}"
    acc = {arm: np.array([found[s, arm][1] for s in seeds]) for arm in names}  # (seeds, points)
    lines = [provenance(), "",
             curves_prose(cfg, dtypes, n_val, f"{len(seeds)} seeds ({', '.join(map(str, seeds))})"),
             "",
             "| arm | " + " | ".join(f"step {s}" for s in steps)
             + " | peak | final | noise |", "|---" * (len(steps) + 4) + "|"]
    results = {"preset": cfg.preset, "seeds": seeds, "steps": steps.tolist(), "val_k": cfg.val_k,
               "provenance": lines[0], "arms": {}}
    for arm, (label, _, _) in names.items():
        lines.append(curve_line(f"{arm}: {label}", acc[arm], per_point))
        results["arms"][arm] = {"acc": acc[arm].tolist()}
    gap = max(100 * abs(acc[a][i, 0] - acc[b][i, 0]) for i in range(len(seeds))
              for a in names for b in names)
    lines += ["", f"Step 0 is the base model in every arm: the largest step-0 gap between two "
              f"arms of one seed is {gap:.1f} points (bf16 kernels on a CPU do not round alike "
              "in every process; float32 runs agree)."]
    # the family
    rows = contrasts_table(acc, study_family(with_a6))
    results["contrasts"] = rows
    lines += ["", f"Paired contrasts (same seed, same validation seeds), mean over seeds in "
              f"points; raw 95 % t-interval; Holm: the interval at the contrast's Holm level "
              f"over the family of {len(rows)} (family-wise 0.05); the word from the Holm "
              f"interval: a difference if it excludes 0, a null if it holds 0 inside "
              f"±{null_band:.1f}, else uninformative:", "",
              *contrast_lines(rows)]
    # per kind: finals, noise, the contrasts' raw intervals (exploratory)
    kind_lines, by_kind = per_kind_finals(found, seeds, names, study_family(with_a6), per_point,
                                          avg)
    if by_kind:
        lines += kind_lines
        results["kinds"] = by_kind
    # the pools and the rescues
    lines += pools_lines(out, found, seeds, [arm for arm in names if names[arm][2] == "phase2"],
                         cfg)
    # the mechanism
    mech = mechanism(found, seeds, cfg.n)
    results["mechanism"] = mech
    lines += ["", f"The mechanism on matched prompts: visits (same step, same prompt) whose "
              f"{cfg.n} fresh samples were all wrong in both arms; the next visit's fresh "
              "accuracy, arm minus A2, averaged within a seed; mean over the seeds with a pair "
              f"and raw 95 % t-interval, points (not in the family; a null inside "
              f"±{mechanism_band:.0f}):", "",
              "| contrast | matched visits (with a next visit) by seed | of them rescued | "
              "arm | A2 | difference [raw 95 %] | seeds | word |", "|---" * 8 + "|"]
    for name in ("A3 - A2", "A5 - A2"):
        m = mech[name]
        a = name.split(" - ")[0]
        pairs = ", ".join(f"{k} ({p})" for k, p in zip(m["matched"], m["pairs"]))
        diff = points(m["mean"], *m["raw"]) if "mean" in m else "none"
        lines.append(f"| {name} | {pairs} | {sum(m['rescued'])} | {percent(m[a])} | "
                     f"{percent(m['A2'])} | {diff} | {m['seeds']} | {m.get('word', 'no pair')} |")
        if m["unmatched"]:
            lines.append(f"| {name}: {m['unmatched']} next visits at different steps in the "
                         "two arms (left out; the visit orders should agree) | | | | | | | |")
    c = mech["A3: rescued - not rescued"]
    diff = points(c["mean"], *c["raw"]) if "mean" in c else "none"
    lines += ["", "The comparator as planned before (A3 alone; not-rescued prompts are those "
              "whose fresh samples already succeeded, easier by selection: not a causal "
              f"comparison): next-visit fresh accuracy after a rescue {percent(c['rescued'])}, "
              f"after a pooled visit not rescued {percent(c['not rescued'])} (means over seeds); "
              f"the difference per seed, over {c['seeds']} seeds: {diff} points, "
              f"{c.get('word', 'no interval')}; next visits (rescued, not) by seed: "
              + ", ".join(f"{r}/{u}" for r, u in c["visits"]) + "."]
    # compute
    costs = {s: arm_costs(out, s, found, cfg, names) for s in seeds}
    results["costs"] = costs
    lines += ["", "Compute every arm needs, from π_θ0, in generated responses (mean over seeds): "
              "the arms on the pool are charged phase one up to the collection's checkpoint "
              f"(step {cfg.collect_step}) and the collection (K = {cfg.collect_k} a training "
              "prompt); replays are reused, not generated:", "",
              "| arm | phase one to the collection | collection | own training | total "
              "responses | generated tokens | sequences trained |", "|---" * 7 + "|"]
    for arm in names:
        cell = {k: np.mean([costs[s][arm][k] for s in seeds]) for k in costs[seeds[0]][arm]}
        lines.append(f"| {arm} | {cell['before']:,.0f} | {cell['collection']:,.0f} | "
                     f"{cell['own']:,.0f} | {cell['total']:,.0f} | {cell['tokens']:,.0f} | "
                     f"{cell['trained']:,.0f} |")
    lines += ["", f"With the collection at step {cfg.collect_step} and a horizon of {horizon} "
              "steps, every arm on the pool costs more than A1 before it trains a step: this "
              "comparison cannot show a compute advantage at this horizon.", "",
              "Responses to first reach A1's peak (the step in brackets), charged as above; "
              f"never: not within {horizon} steps:", "",
              "| seed | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for s in seeds:
        target = found[s, "A1"][1][1:].max()
        cells = []
        for arm in names:
            st, a_, rows_, _ = found[s, arm]
            hits = [int(x) for x, v in zip(st, a_) if x > 0 and v >= target]
            if not hits:
                cells.append("never")
                continue
            own = part_cost(rows_, cfg.n, hits[0])["responses"]
            charged = costs[s][arm]["before"] + costs[s][arm]["collection"]
            cells.append(f"{charged + own:,} ({hits[0]})")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    write_report(out, lines, results)
    plot(out, steps, results, names)
    return results


def pyplot():
    """matplotlib's pyplot on the Agg backend, or None (said) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: matplotlib is not installed")
        return None
    return plt


def plot(out: str, steps, results: dict, names: dict):
    """forest.png (the main figure: the family's paired contrasts, the matched mechanism)
    and curves.png."""
    plt = pyplot()
    if plt is None:
        return
    rows = results["contrasts"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 0.45 * len(rows) + 2),
                                      layout="constrained", width_ratios=[3, 2])
    forest_panel(left, rows, f"avg@{results['val_k']}",
                 f"{results['preset']}: paired contrasts over {len(results['seeds'])} seeds")
    mech = results["mechanism"]
    shown = [(k, v) for k, v in mech.items() if "mean" in v]
    ys = np.arange(len(shown))[::-1]
    right.axvline(0, color="k", lw=1)
    for y, (name, m) in zip(ys, shown):
        if not any(math.isnan(x) for x in m["raw"]):
            right.plot(m["raw"], [y, y], color="C2", lw=5, alpha=0.6, solid_capstyle="butt")
        right.plot([m["mean"]], [y], "o", color="k", ms=4)
    right.set_yticks(ys, [f"{k}\n({m['seeds']} seeds)" for k, m in shown], fontsize=8)
    if not shown:
        right.text(0.5, 0.5, "no matched visit had a next visit", ha="center",
                   transform=right.transAxes)
    # room for the bars' ends and the labels inside the canvas
    right.margins(x=0.08)
    right.set(xlabel="next-visit fresh accuracy,\ndifference in points (raw 95 %)",
              title="the mechanism: matched prompts,\nand the planned comparator")
    path = os.path.join(out, "forest.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    curves_figure(out, steps, results, names, f"mean over {len(results['seeds'])} seeds")
    print(f"plots: {path} (main), {os.path.join(out, 'curves.png')}")


def forest_panel(ax, rows: list, avg: str, title: str):
    """contrasts_table's rows on one axis: raw 95 % (thick) and Holm (thin) intervals, red where
    Holm rejects, the mean, zero and the null band."""
    ys = np.arange(len(rows))[::-1]
    ax.axvspan(-null_band, null_band, color="C7", alpha=0.15, lw=0,
               label=f"null band ±{null_band:.0f}")
    ax.axvline(0, color="k", lw=1)
    for y, r in zip(ys, rows):
        color = "C3" if r["rejected"] else "C0"
        ax.plot(r["holm"], [y, y], color=color, lw=1.5)
        ax.plot(r["raw"], [y, y], color=color, lw=5, alpha=0.6, solid_capstyle="butt")
        ax.plot([r["mean"]], [y], "o", color="k", ms=4)
    ax.set_yticks(ys, [f"{r['contrast']}, {r['measure']}" for r in rows])
    ax.plot([], [], color="C0", lw=5, alpha=0.6, label="raw 95 % t-interval")
    ax.plot([], [], color="C0", lw=1.5, label="Holm-adjusted interval")
    ax.plot([], [], color="C3", lw=1.5, label="Holm: excludes 0")
    ax.set(xlabel=f"difference in {avg} points", title=title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=4)


def curves_figure(out: str, steps, results: dict, names: dict, over: str):
    """curves.png: each arm's validation accuracy by training step, its mean over seeds."""
    import matplotlib.pyplot as plt
    avg = f"avg@{results['val_k']}"
    fig, ax = plt.subplots(figsize=(6.5, 4), layout="constrained")
    for i, (arm, (label, _, _)) in enumerate(names.items()):
        mean = 100 * np.array(results["arms"][arm]["acc"]).mean(0)
        style = "--" if arm in ("A1", "A2", "A7") else "-"
        ax.plot(steps, mean, style, marker=".", color=f"C{i}", label=f"{arm}: {label}")
    ax.set_xticks(steps)
    ax.set(xlabel="training step", ylabel=f"{avg} (%)",
           title=f"{results['preset']}: {over} (the contrasts: forest.png)")
    ax.legend(fontsize=8)
    fig.savefig(os.path.join(out, "curves.png"), dpi=120)
    plt.close(fig)


# -----------------------------------------------------------------------------------------
# The dynamic-sampling study (--study dynamic, docs/study-plan-dynamic.md): compute on the
# x-axis, the metering, the seed-1 check, the plan's time against the runs'

def compute_axis(rows: list, val_steps, n: int, charge: int) -> np.ndarray:
    """At each validation step s, the responses generated from π_θ0 up to s: the charge (phase
    one to the collection and the collection, for an arm on the pool) and the arm's own
    generation in steps 1..s."""
    own = {r["step"]: generated(r, n) for r in rows if r["step"] > 0}
    return np.array([charge + sum(v for step, v in own.items() if step <= s) for s in val_steps])


def equal_compute(xa, ya, xb, yb) -> dict:
    """a - b in points at x* = the smaller of the two curves' last x, each curve linear in x
    between its points; None where the curves do not overlap (x* before one of them starts)."""
    x_star = min(xa[-1], xb[-1])
    if x_star < max(xa[0], xb[0]):
        return None
    diff = np.interp(x_star, xa, ya) - np.interp(x_star, xb, yb)
    return {"x": float(x_star), "diff": 100 * float(diff)}


def span(values) -> str:
    """'4,480' or '4,480-4,608': the range of some response counts."""
    low, high = min(values), max(values)
    return f"{low:,.0f}" if low == high else f"{low:,.0f}-{high:,.0f}"


def equal_compute_table(xs: dict, acc: dict, pairs: list, seeds: list) -> list[dict]:
    """Per pair, over the seeds whose curves overlap: the differences at equal generated
    responses, their mean and raw 95 % t-interval (no correction); where no seed's overlap, the
    sentence that says where the curves lie. xs, acc: (seed, arm) -> x, accuracy."""
    rows = []
    for a, b in pairs:
        found = {s: equal_compute(xs[s, a], acc[s, a], xs[s, b], acc[s, b]) for s in seeds}
        found = {s: f for s, f in found.items() if f is not None}
        row = {"contrast": f"{a} - {b}", "seeds": list(found),
               "values": [f["diff"] for f in found.values()],
               "x": [f["x"] for f in found.values()]}
        if len(found) > 1:
            row["mean"], *row["raw"] = t95_bounds(row["values"])
        elif found:
            row.update(mean=row["values"][0], raw=[float("nan")] * 2)
        else:
            late, early = (a, b) if np.mean([xs[s, a][0] for s in seeds]) > np.mean(
                [xs[s, b][0] for s in seeds]) else (b, a)
            row["apart"] = (f"{late}'s curve starts at {span([xs[s, late][0] for s in seeds])} "
                            f"responses, after {early}'s ends at "
                            f"{span([xs[s, early][-1] for s in seeds])}")
        rows.append(row)
    return rows


def metering(rows: list, n: int, charge: int) -> dict:
    """A run's generation over its training steps: responses (with the charge), rounds,
    prompts generated, groups kept, steps capped; a run before dynamic sampling had one round
    a step and kept every visit."""
    rows = [r for r in rows if r["step"] > 0]
    return {"responses": charge + sum(generated(r, n) for r in rows),
            "rounds": sum(r.get("gen_rounds", 1) for r in rows),
            "prompts": sum(r.get("gen_prompts", len(r["visits"])) for r in rows),
            "kept": sum(r.get("kept_groups", len(r["visits"])) for r in rows),
            "capped": sum(bool(r.get("gen_capped", False)) for r in rows)}


def seed1_check(pool_size: int, measured: dict, reference: dict = offpolicy_seed1) -> str:
    """The seed-1 reproduction: 'reproduces to the digit', or each value that differs.
    measured: arm -> (rescued, share as rescues() gives it)."""
    found = {"pool": pool_size,
             **{arm: (rescued, int(f"{100 * share:.0f}")) for arm, (rescued, share)
                in measured.items()}}
    differ = []
    if found["pool"] != reference["pool"]:
        differ.append(f"pool {found['pool']} prompts, published {reference['pool']}")
    for arm in ("A3", "A5"):
        (rescued, share), (ref_rescued, ref_share) = found[arm], reference[arm]
        if rescued != ref_rescued:
            differ.append(f"{arm} rescued {rescued}, published {ref_rescued}")
        if share != ref_share:
            differ.append(f"{arm}'s share {share} %, published {ref_share} %")
    return "reproduces to the digit" if not differ else "differs: " + "; ".join(differ)


def first_start(folder: str) -> str:
    """What follows started_mark on the first start line of FOLDER.log: 'TIME on MACHINE'
    (machine()), or 'TIME' in a log from before the machine was logged; '' without one."""
    if os.path.isfile(folder + ".log"):
        for line in open(folder + ".log", errors="replace"):
            if line.startswith(started_mark):
                return line[len(started_mark):].rstrip("\n")
    return ""


def run_machine(folder: str) -> str:
    """The machine of a run's first start (machine()), '' if its log does not say."""
    return first_start(folder).partition(" on ")[2].strip()


def run_started(folder: str) -> tuple:
    """(UTC time, how it is known) of a run's first start: study_replay.py's line in its log;
    else the earliest modification time of its config.json and metrics.jsonl files, a time of
    their last write, so later than the start (rlep.py writes no time)."""
    logged = first_start(folder)
    if logged:
        return logged.split(" on ", 1)[0].strip(), "logged"
    paths = [os.path.join(folder, "config.json"), *glob.glob(os.path.join(folder, "*",
                                                                          "metrics.jsonl"))]
    times = [os.path.getmtime(p) for p in paths if os.path.isfile(p)]
    return (utc(min(times)), "file mtime (last write)") if times else ("-", "not started")


def plan_times(plan: str) -> tuple:
    """The UTC times of the plan's first and newest commits, ('', '') if it has none."""
    done = subprocess.run(["git", "log", "--format=%ct", "--", plan], cwd=repo,
                          capture_output=True, text=True)
    stamps = done.stdout.split() if done.returncode == 0 else []
    return (utc(int(stamps[-1])), utc(int(stamps[0]))) if stamps else ("", "")


def came_after(when: str, how: str, committed: str) -> str:
    """Whether a run started after a commit: a logged start says; a last write after the commit
    does not."""
    if not committed or how == "not started":
        return "-"
    if when <= committed:
        return "NO"
    return "yes" if how == "logged" else "not shown (a last write)"


def load_dynamic(out: str, seeds: list, family_seeds: list, horizon: int) -> dict:
    """(seed, arm) -> curve(...) of each run of --study dynamic that trained to the horizon."""
    found = {}
    for seed in seeds:
        for arm, (_, suffix, part) in dynamic_arms.items():
            if arm in ("A7", "A8") and seed not in family_seeds:
                continue
            folder = os.path.join(out, f"seed{seed}{suffix}")
            if os.path.isfile(os.path.join(folder, part, "metrics.jsonl")):
                got = curve(folder, part, horizon)
                if got[2] and got[2][-1]["step"] == horizon and len(got[0]):
                    found[seed, arm] = got
    return found


def mean_range(values) -> str:
    """'mean (min-max)' of some counts."""
    return f"{np.mean(values):,.1f} ({span(values)})"


def report_dynamic(out: str, seeds: list, family_seeds: list, cfg) -> dict:
    """--study dynamic's table.md, results.json, forest.png, curves.png and compute.png
    (docs/study-plan-dynamic.md)."""
    horizon = cfg.phase2_steps
    found = load_dynamic(out, seeds, family_seeds, horizon)
    family_at = [s for s in seeds if s in family_seeds
                 and all((s, arm) in found for arm in family_arms)]
    both = [s for s in seeds if (s, "A3") in found and (s, "A5") in found]
    if not family_at and not both:
        raise SystemExit(f"{out}: no seed has A1, A3, A7 and A8, nor A3 and A5, to the horizon")
    steps = found[(family_at or both)[0], "A3"][0]
    n_val = len(data.read_rows(cfg.val_file))
    per_point = n_val * cfg.val_k
    avg = f"avg@{cfg.val_k}"
    dtypes = {str(run_dtype(os.path.join(out, f"seed{s}{dynamic_arms[arm][1]}")))
              for s, arm in found}
    names = {arm: dynamic_arms[arm] for arm in dynamic_arms if any(a == arm for _, a in found)}
    said = (f"the family's seeds (A1, A3, A7 and A8 each trained to step {horizon}): "
            f"{', '.join(map(str, family_at)) or 'none'}; A3 and A5's: "
            f"{', '.join(map(str, both)) or 'none'}")
    lines = [provenance(dynamic_plan), "", curves_prose(cfg, dtypes, n_val, said), "",
             "| arm | seeds | " + " | ".join(f"step {s}" for s in steps)
             + " | peak | final | noise |", "|---" * (len(steps) + 5) + "|"]
    results = {"study": "dynamic", "preset": cfg.preset, "seeds": seeds,
               "family_seeds": family_at, "a3_a5_seeds": both, "steps": steps.tolist(),
               "val_k": cfg.val_k, "provenance": lines[0], "arms": {}}
    # the curves: every arm over the family's seeds; A1, A3 and A5 also over all their seeds
    acc = {key: c[1] for key, c in found.items()}
    for arm, (label, _, _) in names.items():
        mine = [s for s in seeds if (s, arm) in found]
        groups = [("family", family_at)] if family_at and set(family_at) <= set(mine) else []
        if mine != family_at:
            groups.append(("all", mine))
        for which, group in groups:
            table = np.array([acc[s, arm] for s in group])
            row = curve_line(f"{arm}: {label}", table, per_point)
            lines.append(row.replace(" | ", f" | {len(group)} ({which}) | ", 1))
        if groups[0][0] == "family":
            results["arms"][arm] = {"acc": [acc[s, arm].tolist() for s in family_at]}
    gap = max(100 * abs(acc[s, a][0] - acc[s, b][0]) for s, a in found for b in names
              if (s, b) in found)
    lines += ["", f"Step 0 is the base model in every arm: the largest step-0 gap between two "
              f"arms of one seed is {gap:.1f} points."]
    # the family
    if family_at:
        by_arm = {arm: np.array([acc[s, arm] for s in family_at]) for arm in family_arms}
        rows = contrasts_table(by_arm, dynamic_family)
        results["contrasts"] = rows
        lines += ["", f"The family: paired contrasts (same seed, same validation seeds) over the "
                  f"{len(family_at)} seeds, mean in points; raw 95 % t-interval; Holm: the "
                  f"interval at the contrast's Holm level over the family of {len(rows)} "
                  f"(family-wise {alpha}); the word from the Holm interval: a difference if it "
                  f"excludes 0, a null if it holds 0 inside ±{null_band:.1f}, else "
                  "uninformative:", "", *contrast_lines(rows)]
    # A3 - A5 on every seed, and seed 1 against the off-policy study
    if both:
        rows = contrasts_table({arm: np.array([acc[s, arm] for s in both])
                                for arm in ("A3", "A5")}, [("A3", "A5")])
        results["a3_a5"] = rows
        lines += ["", f"A3 - A5 over the {len(both)} seeds with both (its own Holm over the "
                  f"{len(rows)}, peak and final; worded by the same rule):", "",
                  *contrast_lines(rows)]
    lines += seed1_lines(out, found, cfg, results) if 1 in both else [
        "", "Seed 1 against the off-policy study: seed 1 has no A3 and A5 here."]
    lines += pools_lines(out, found, both, ["A3", "A5", "A8"], cfg)
    if family_at:
        lines += dynamic_family_sections(out, found, family_at, cfg, names, per_point, avg,
                                         results)
    lines += start_lines(out, seeds, family_seeds, names, results)
    lines += machine_lines(out, seeds, family_seeds, names, results)
    write_report(out, lines, results)
    plot_dynamic(out, steps, results, names)
    return results


def seed1_lines(out: str, found: dict, cfg, results: dict) -> list[str]:
    """Seed 1's pool and rescues beside the off-policy study's published ones, and the check
    (on cpu-hard, the preset they are of)."""
    horizon = cfg.phase2_steps
    pool = os.path.join(out, "seed1", "collect", "pool.jsonl")
    measured = {arm: rescues(found[1, arm][2]) for arm in ("A3", "A5")}
    pool_size = len(read_jsonl(pool))
    check = seed1_check(pool_size, measured) if cfg.preset == "cpu-hard" else \
        f"not checked: the published numbers are preset cpu-hard's, these {cfg.preset}'s"
    results["seed1"] = {"pool": pool_size, **{a: [r, 100 * f] for a, (r, f) in
                                               measured.items()}, "check": check}
    ref = offpolicy_seed1
    return ["", "Seed 1 against the off-policy study's published numbers (docs/studies.md, "
            "\"Pools and rescues\", at 7c0a0e0): the pool's prompts, the rescued visits "
            f"of steps 1-{horizon} (their share of the visits to pooled prompts in steps "
            "1-3):", "",
            "| seed 1 | pool | A3 | A5 |", "|---|---|---|---|",
            f"| here | {pool_size} | "
            + " | ".join(f"{r} ({100 * f:.0f} %)" for r, f in measured.values()) + " |",
            f"| published | {ref['pool']} | {ref['A3'][0]} ({ref['A3'][1]} %) | "
            f"{ref['A5'][0]} ({ref['A5'][1]} %) |", "", f"Seed 1: {check}."]


def dynamic_family_sections(out: str, found: dict, family_at: list, cfg, names: dict,
                            per_point: int, avg: str, results: dict) -> list[str]:
    """The family's per-kind finals, the curves at equal generated responses and the
    metering, over the family's seeds."""
    fam_names = {arm: names[arm] for arm in family_arms}
    lines, by_kind = per_kind_finals(found, family_at, fam_names, dynamic_family, per_point,
                                     avg)
    results["kinds"] = by_kind
    # compute: responses generated from π_θ0 up to each validation step
    xs, meters = {}, collections.defaultdict(list)
    arms_here = [arm for arm in names if all((s, arm) in found for s in family_at)]
    for s in family_at:
        costs = arm_costs(out, s, found, cfg, arms_here, pooled=on_pool)
        for arm in arms_here:
            charge = costs[arm]["before"] + costs[arm]["collection"]
            xs[s, arm] = compute_axis(found[s, arm][2], found[s, arm][0], cfg.n, charge)
            meters[arm].append(metering(found[s, arm][2], cfg.n, charge))
    acc = {(s, arm): found[s, arm][1] for s, arm in xs}
    rows = equal_compute_table(xs, acc, dynamic_family, family_at)
    results["x"] = {arm: [xs[s, arm].tolist() for s in family_at] for arm in arms_here}
    results["equal_compute"] = rows
    lines += ["", f"At equal generated responses, raw, uncorrected (not in the family): x is "
              "the responses generated from π_θ0 up to a validation step (an arm on the pool is "
              f"charged phase one up to step {cfg.collect_step} and the collection, K = "
              f"{cfg.collect_k} a prompt tried); per seed, x* = the smaller of the two curves' "
              "last x, each curve linear in x between its points, a - b at x* in points, where "
              "the curves overlap; mean and raw 95 % t-interval over those seeds:", "",
              "| contrast | seeds that overlap | x* (responses) | mean [raw 95 %] |",
              "|---|---|---|---|"]
    for r in rows:
        if "apart" in r:
            lines.append(f"| {r['contrast']} | none | - | no overlap: {r['apart']} |")
            continue
        shown = points(r["mean"], *r["raw"]) if len(r["values"]) > 1 else \
            f"{r['mean']:+.1f} (one seed: no interval)"
        lines.append(f"| {r['contrast']} | {len(r['seeds'])} of {len(family_at)} | "
                     f"{span(r['x'])} | {shown} |")
    results["metering"] = dict(meters)
    lines += ["", f"Metering over the family's {len(family_at)} seeds, mean (min-max) over "
              f"seeds, of the {cfg.phase2_steps} training steps: generated responses in total "
              "(with the charges above), generation rounds, prompts generated, groups kept, "
              "steps capped at --max_gen_rounds (a run without dynamic sampling: one round a "
              "step, every group kept):", "",
              "| arm | responses, charged | rounds | prompts generated | groups kept | "
              "steps capped |", "|---" * 6 + "|"]
    for arm in arms_here:
        cells = [mean_range([m[k] for m in meters[arm]])
                 for k in ("responses", "rounds", "prompts", "kept", "capped")]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines


def start_lines(out: str, seeds: list, family_seeds: list, names: dict,
                results: dict) -> list[str]:
    """Each arm's first run's start against the plan's commit: the plan must come first."""
    first, newest = plan_times(dynamic_plan)
    committed = f"first at {first}, last at {newest}" if first else "never (uncommitted)"
    lines = ["", f"The plan's commits against each arm's first run: {dynamic_plan} committed "
             f"{committed}; a run's start as study_replay.py logged it (the first line of "
             "FOLDER.log), else, for a run started otherwise, the earliest modification time of "
             "its config.json and metrics.jsonl (a last write: rlep.py writes no time, so that "
             "time is later than the start and cannot show the plan came first):", "",
             "| arm | first run | started (UTC) | from | after the plan's first commit | "
             "after its last |", "|---" * 6 + "|"]
    results["starts"] = {}
    for arm, (_, suffix, _) in names.items():
        own = [s for s in seeds if arm not in ("A7", "A8") or s in family_seeds]
        starts = sorted((run_started(os.path.join(out, f"seed{s}{suffix}")), s) for s in own)
        started = [(t, s) for t, s in starts if t[1] != "not started"]
        if not started:
            continue
        (when, how), seed = started[0]
        results["starts"][arm] = {"folder": f"seed{seed}{suffix}", "time": when, "from": how}
        lines.append(f"| {arm} | seed{seed}{suffix} | {when} | {how} | "
                     f"{came_after(when, how, first)} | {came_after(when, how, newest)} |")
    return lines


def machine_lines(out: str, seeds: list, family_seeds: list, names: dict,
                  results: dict) -> list[str]:
    """The machines that ran each kind of run (a run's: its first start's, as logged), and the
    seeds whose runs ran on more than one: with a per-run archive a seed's runs may span
    sittings, and bf16 rounds (and times) differently where it is emulated."""
    kinds = {}  # folder suffix -> its arms (the main run's: A1 and A3)
    for arm, (_, suffix, _) in names.items():
        kinds.setdefault(suffix, []).append(arm)
    lines = ["", "The machines that ran the runs (each run's first start, as FOLDER.log logged "
             "it; 'not logged': a run started before the machine was):", "",
             "| runs | arms | of them | machines (runs) |", "|---" * 4 + "|"]
    results["machines"] = {}
    per_seed = collections.defaultdict(set)
    for suffix, arms_of in kinds.items():
        own = [s for s in seeds if arms_of[0] not in ("A7", "A8") or s in family_seeds]
        count = collections.Counter()
        for s in own:
            folder = os.path.join(out, f"seed{s}{suffix}")
            if os.path.isdir(folder):
                where = run_machine(folder)
                count[where or "not logged"] += 1
                if where:
                    per_seed[s].add(where)
        results["machines"][f"seedS{suffix}"] = dict(sorted(count.items()))
        lines.append(f"| seedS{suffix} | {', '.join(arms_of)} | {sum(count.values())} | "
                     + "; ".join(f"{m}: {c}" for m, c in sorted(count.items())) + " |")
    mixed = sorted(s for s, where in per_seed.items() if len(where) > 1)
    results["seeds_on_several_machines"] = mixed
    lines += ["", f"Seeds whose runs ran on more than one machine: {len(mixed)} of the "
              f"{len(per_seed)} with a logged machine"
              + (f" (seeds {', '.join(map(str, mixed))})." if mixed else ".")]
    return lines


def plot_dynamic(out: str, steps, results: dict, names: dict):
    """forest.png (the family's 6 contrasts and A3 - A5's 2), curves.png and compute.png
    (accuracy against the responses generated from π_θ0)."""
    plt = pyplot()
    if plt is None:
        return
    avg = f"avg@{results['val_k']}"
    family_rows, a3_a5 = results.get("contrasts", []), results.get("a3_a5", [])
    rows = family_rows + a3_a5
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 2), layout="constrained")
    forest_panel(ax, rows, avg, f"{results['preset']}: the family over "
                 f"{len(results['family_seeds'])} seeds (Holm over {len(family_rows)}); "
                 f"A3 - A5 over {len(results['a3_a5_seeds'])} (Holm over {len(a3_a5)})")
    if family_rows and a3_a5:
        ax.axhline(len(a3_a5) - 0.5, color="k", lw=0.8, ls=":")
    fig.savefig(os.path.join(out, "forest.png"), dpi=120)
    plt.close(fig)
    if not results["family_seeds"]:
        return print(f"plots: {os.path.join(out, 'forest.png')}")
    curves_figure(out, steps, results, {a: names[a] for a in names if a in results["arms"]},
                  f"mean over the family's {len(results['family_seeds'])} seeds")
    fig, (mean_ax, seed_ax) = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained",
                                           sharey=True)
    for i, (arm, (label, _, _)) in enumerate(names.items()):
        if arm not in results.get("x", {}):
            continue
        x, y = np.array(results["x"][arm]), 100 * np.array(results["arms"][arm]["acc"])
        style = "--" if arm in ("A1", "A7") else "-"
        mean_ax.plot(x.mean(0), y.mean(0), style, marker="o", ms=4, color=f"C{i}",
                     label=f"{arm}: {label}")
        for xs, ys in zip(x, y):
            seed_ax.plot(xs, ys, style, marker=".", ms=3, lw=0.7, alpha=0.6, color=f"C{i}")
    mean_ax.set(xlabel="responses generated from π_θ0 (mean over seeds at each step)",
                ylabel=f"{avg} (%)", title=f"{results['preset']}: mean over the family's "
                f"{len(results['family_seeds'])} seeds, a marker a validation step")
    seed_ax.set(xlabel="responses generated from π_θ0", title="each seed")
    mean_ax.legend(fontsize=8)
    fig.savefig(os.path.join(out, "compute.png"), dpi=120)
    plt.close(fig)
    print(f"plots: {os.path.join(out, 'forest.png')} (main), compute.png, curves.png in {out}")


def drop_checkpoints(out: str, seed: int):
    """A finished seed's step_NNNNNN folders (its metrics, pools and logs stay)."""
    # seedS and seedS-*, not seed(S)0 (with 16 seeds, seed1's would match seed10-seed16)
    steps = [glob.glob(os.path.join(out, f"seed{seed}{more}", "phase*", "step_*"))
             for more in ("", "-*")]
    for folder in steps[0] + steps[1]:
        if not os.path.islink(os.path.dirname(folder)):
            shutil.rmtree(folder)


def drop_run_checkpoints(folder: str, runs: list):
    """A finished run's step_NNNNNN folders (its metrics, pool and log stay), but the main
    run's phase one while an A6 of its seed, which collects from that checkpoint, is
    unfinished."""
    keep = folder == runs[0][0] and any(f.endswith("-A6") and not finished(f) for f, _ in runs)
    for step in glob.glob(os.path.join(folder, "phase*", "step_*")):
        part = os.path.dirname(step)
        if not os.path.islink(part) and not (keep and os.path.basename(part) == "phase1"):
            shutil.rmtree(step)


# -----------------------------------------------------------------------------------------
# The archive (--archive DIR): each finished run, reduced to what the report reads, kept in
# the repository as one JSON document so that a study continues across sittings (the module's
# docstring)

default_archive = "docs/runs/study-dynamic"  # --study dynamic --preset cpu-hard's, in the repo
archive_mark = "archived.json"  # in every restored run folder: an archived copy, never resumed


def archived(folder: str) -> bool:
    """Whether a run folder is an archived copy (restore_archived's): finished, never run or
    resumed."""
    return os.path.isfile(os.path.join(folder, archive_mark))


def archived_pool(folder: str) -> str:
    """The form of an archived copy's collect/pool.jsonl, by its mark: 'full' (the answer
    texts, for an arm still to run on it), 'reduced', or '' without a pool."""
    return json.load(open(os.path.join(folder, archive_mark))).get("pool", "")


def document_path(archive: str, name: str) -> str:
    """The path of run `name`'s document in the archive."""
    return os.path.join(archive, f"{name}.json")


def pool_users(folder: str, runs: list) -> list:
    """The folders of the runs that read folder's pool (--pool FOLDER/collect/pool.jsonl)."""
    pool = os.path.join(folder, "collect", "pool.jsonl")
    return [f for f, flags in runs if any(a == "--pool" and b == pool
                                          for a, b in zip(flags, flags[1:]))]


def jsonl_bytes(rows: list) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def reduced_pool(rows: list) -> list:
    """A pool's rows as each prompt's id and count of verified answers: no answer texts."""
    return [{"id": r["id"], "answers": len(r["responses"])} for r in rows]


def document(files: dict, pool: str, log: str) -> dict:
    """An archived run: the mark (what it is; its pool's form, none without a pool), the first
    start line of its log, and its files by path in the run folder: a JSON file as its object,
    a JSONL file as its rows."""
    return {"archived_by": "study_replay.py --archive", **({"pool": pool} if pool else {}),
            "note": "the report's files only: the progress without its answers, the pool with "
                    "them while an arm on it is not archived ('full'), else without "
                    "('reduced'); an archived run counts as finished and is never run or "
                    "resumed", "log": log, "files": files}


def run_document(folder: str, full_pool: bool) -> dict:
    """A finished run's document: config.json, timings.json and every part's metrics.jsonl as
    they are; the collection's progress.jsonl as its rows' id and tokens, its pool.jsonl as it
    is if full_pool (an arm on it still to archive), else reduced (reduced_pool); the first
    start line of FOLDER.log. A part that is a link (A6's phase one, the main run's) is left
    out."""
    files = {name: json.load(open(os.path.join(folder, name)))
             for name in ("config.json", "timings.json")}
    for path in sorted(glob.glob(os.path.join(folder, "*", "metrics.jsonl"))):
        if not os.path.islink(os.path.dirname(path)):
            files[os.path.relpath(path, folder)] = read_jsonl(path)
    progress, pool = (os.path.join(folder, "collect", f) for f in ("progress.jsonl", "pool.jsonl"))
    if os.path.isfile(progress):
        files["collect/progress.jsonl"] = [{"id": r["id"], "tokens": r.get("tokens", 0)}
                                           for r in read_jsonl(progress)]
    if os.path.isfile(pool):
        rows = read_jsonl(pool)
        files["collect/pool.jsonl"] = rows if full_pool else reduced_pool(rows)
    form = ("full" if full_pool else "reduced") if os.path.isfile(pool) else ""
    logged = first_start(folder)
    return document(files, form, f"{started_mark}{logged}\n" if logged else "")


def document_bytes(doc: dict) -> bytes:
    """A document as JSON laid out for reading and for git's diffs: a field or a file a line,
    and a JSONL file's rows a line each."""
    def laid_out(value):
        if not isinstance(value, list):
            return json.dumps(value)
        return "[" + ",".join(f"\n   {json.dumps(row)}" for row in value) + "]"
    fields = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in doc.items() if k != "files"]
    files = [f"  {json.dumps(path)}: {laid_out(v)}" for path, v in doc["files"].items()]
    return ("{" + ",\n ".join(fields + ['"files": {\n' + ",\n".join(files) + "}"])
            + "}\n").encode()


def restored_files(doc: dict, name: str) -> dict:
    """{path: bytes} of an archived run as run folder `name`: its files as rlep.py writes
    their rows (a JSONL row a line), its mark (archive_mark: the document less its files and
    log) and NAME.log, its start line."""
    files = {f"{name}/{path}": jsonl_bytes(value) if path.endswith(".jsonl")
             else json.dumps(value).encode() for path, value in doc["files"].items()}
    mark = {k: v for k, v in doc.items() if k not in ("log", "files")}
    files[f"{name}/{archive_mark}"] = json.dumps(mark, indent=1).encode() + b"\n"
    if doc["log"]:
        files[f"{name}.log"] = doc["log"].encode()
    return files


def seed_names(archive: str, seed: int) -> list:
    """The names of seed S's archived runs: seedS and seedS-* (not seedS0)."""
    names = sorted(os.path.basename(p)[:-len(".json")]
                   for p in glob.glob(os.path.join(archive, f"seed{seed}-*.json")))
    main = f"seed{seed}"
    return ([main] if os.path.isfile(document_path(archive, main)) else []) + names


def temporary(name: str) -> str:
    """The name a file or folder is written under before it is renamed to `name`."""
    return f".{name}.tmp"


def archived_alike(folder: str, path: str) -> bool:
    """Whether the document at path holds this finished run as archive_runs makes it (the
    archive was made from it), its pool full or reduced."""
    content = open(path, "rb").read()
    return any(content == document_bytes(run_document(folder, full)) for full in (True, False))


def move_in(source: str, name: str, target: str):
    """Rename run folder `name` and its log from source into target, the folder last: a run is
    there once its folder is, and a log there without its folder is a stopped move's, replaced
    (the callers make sure the folder is not there). If the folder's rename fails, the log goes
    back (the run is not there), and the error is raised."""
    moved = []
    try:
        for item in (name + ".log", name):
            if os.path.exists(os.path.join(source, item)):
                os.rename(os.path.join(source, item), os.path.join(target, item))
                moved.append(item)
    except BaseException:
        for item in reversed(moved):
            os.rename(os.path.join(target, item), os.path.join(source, item))
        raise


def write_in(target: str, name: str, fill):
    """Make run folder `name` (and its log) in target: fill(temporary) writes them into a
    temporary folder in target, which is then renamed in (move_in), so no half run is ever
    there."""
    folder = os.path.join(target, temporary(name))
    shutil.rmtree(folder, ignore_errors=True)  # a stopped write's
    os.makedirs(folder)
    try:
        fill(folder)
        move_in(folder, name, target)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_files(folder: str, files: dict):
    for path, content in files.items():
        os.makedirs(os.path.dirname(os.path.join(folder, path)), exist_ok=True)
        open(os.path.join(folder, path), "wb").write(content)


def replace_file(path: str, content: bytes):
    """Write a file anew: to a temporary name beside it, then renamed over it (os.replace), so a
    stop leaves the old file or the new one (and at worst the temporary, which seed_names
    skips and the next write replaces)."""
    new = os.path.join(os.path.dirname(path), temporary(os.path.basename(path)))
    open(new, "wb").write(content)
    os.replace(new, path)


def archive_runs(out: str, archive: str, seed: int, runs: list) -> int:
    """Each finished run of the seed that the archive lacks, as its document (run_document),
    into archive as NAME.json (replace_file), in the runs' order; then the pools no run still
    needs, reduced (reduce_pool). A pool is archived full while a run on it is not archived: a
    later sitting runs that arm from it. A restored run (an archived copy) is not written
    again; a run in the archive already must be archived alike, else it stops (nothing is
    replaced). Returns the bytes written."""
    written = 0
    for folder, _ in runs:
        name = os.path.basename(folder)
        path = document_path(archive, name)
        if not finished(folder) or archived(folder):
            continue
        if os.path.isfile(path):
            if not archived_alike(folder, path):
                raise SystemExit(f"{path}: archived otherwise than {folder}; an archived run is "
                                 "never replaced: move it away to archive this one")
            continue
        waiting = [os.path.basename(f) for f in pool_users(folder, runs)
                   if not os.path.isfile(document_path(archive, os.path.basename(f)))]
        content = document_bytes(run_document(folder, full_pool=bool(waiting)))
        os.makedirs(archive, exist_ok=True)
        replace_file(path, content)
        written += len(content)
        full = f", its pool in full for {', '.join(waiting)}" if waiting else ""
        print(f"{name} archived in {archive}: {len(content) / 1000:.1f} kB{full} (commit it: "
              f"git add {archive})", flush=True)
    for folder, _ in runs:
        reduce_pool(archive, folder, runs)
    return written


def reduce_pool(archive: str, folder: str, runs: list) -> bool:
    """The one replacement the archive allows: once every run on a run's pool is archived, the
    pool of its document, full until then, becomes reduced_pool's form, derived from the full
    pool there, and its mark says so; the document is replaced whole (replace_file), so a
    stop leaves it full, for the next call. Whether it reduced the pool."""
    name = os.path.basename(folder)
    path = document_path(archive, name)
    users = [os.path.basename(f) for f in pool_users(folder, runs)]
    if not all(os.path.isfile(document_path(archive, run)) for run in [name, *users]):
        return False
    doc = json.load(open(path))
    if doc.get("pool") != "full":
        return False
    rows = doc["files"]["collect/pool.jsonl"]
    if not all("responses" in r for r in rows):
        raise SystemExit(f"{path}: its pool is marked full but lacks answer texts, left as it is")
    doc["files"]["collect/pool.jsonl"], doc["pool"] = reduced_pool(rows), "reduced"
    replace_file(path, document_bytes(doc))
    print(f"{path}: its pool reduced to each prompt's id and count of answers, every run on it "
          f"archived ({', '.join(users)}; commit it: git add {archive})", flush=True)
    return True


def restore_archived(out: str, archive: str, seeds: list) -> list:
    """Each requested seed's archived runs that out lacks, written into out as run folders
    (restored_files, write_in: archived copies, never run or resumed); the names restored. A
    run folder or log in out of a run the archive holds stops it before anything is written
    (never replaced), unless it is an archived copy, or the finished run that the archive was
    made from (archived_alike)."""
    restored = []
    for seed in seeds:
        for name in seed_names(archive, seed):
            here = os.path.join(out, name)
            if archived(here):
                continue
            if os.path.exists(here) or os.path.exists(here + ".log"):
                if finished(here) and archived_alike(here, document_path(archive, name)):
                    continue
                raise SystemExit(f"{here}: {name} is archived in {archive}, and out_dir holds "
                                 "another run of it: move it (and its log) away")
            restored.append(name)
    for name in restored:
        files = restored_files(json.load(open(document_path(archive, name))), name)
        write_in(out, name, lambda folder: write_files(folder, files))
    if restored:
        print(f"{', '.join(restored)} from the archive {archive}: finished, never run again",
              flush=True)
    return restored


def check_archived(seed: int, runs: list, archive: str):
    """An archived run is never run again, so a run still to do must not need what the archive
    lacks: a run on the main run's pool needs it full (it is reduced once every run on it is
    archived), A6 the main run's phase one (never archived). And a run on the pool that is
    archived needs its main run archived: run again, it could make another pool."""
    main = runs[0][0]
    users = pool_users(main, runs)
    if not archived(main):
        for folder in users:
            if archived(folder):
                raise SystemExit(f"seed {seed}: {os.path.basename(folder)} is archived "
                                 f"({archive or 'restored'}) without its pool's run "
                                 f"{os.path.basename(main)}, which would run again: leave seed "
                                 f"{seed} out or move its archive away")
        return
    for folder, _ in runs[1:]:
        if archived(folder):
            continue
        arm = folder[len(main) + 1:]
        if folder in users and archived_pool(main) == "reduced":
            lacks = "its pool reduced (no answer texts)"
        elif folder.endswith("-A6"):
            lacks = "no phase-one checkpoint"
        else:
            continue
        raise SystemExit(f"seed {seed}: archived ({archive or 'restored'}) with {lacks}, "
                         f"without arm {arm} ({os.path.basename(folder)}), which cannot run "
                         f"from it: leave seed {seed} out or move its archive away")


def settle_finished(out: str, archive: str, seed: int, runs: list):
    """The seed's finished runs: their checkpoints dropped (drop_run_checkpoints), and, with an
    archive, each archived that is not yet (archive_runs)."""
    for folder, _ in runs:
        if finished(folder) and not archived(folder):
            drop_run_checkpoints(folder, runs)
    if archive:
        archive_runs(out, archive, seed, runs)


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
                    run(folder, flags, runs[0][0])
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
