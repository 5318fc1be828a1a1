"""What replay buys, with its confounds separated: per seed, five arms of a CPU preset, all
validated with the same seeds (seed, step, problem) over the same training steps. The plan, the
family of contrasts and the rules that word each interval: docs/study-plan.md.

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
aside and run again. It prints its expected time at the start. A finished seed's checkpoints
are deleted (their metrics stay).

    python tests/study_replay.py --preset cpu-hard --seeds 1 2 3 4 5 6 7 8 --dtype bfloat16 \
        --out_dir runs/study-cpu-hard-offpolicy
    python tests/study_replay.py --preset cpu-hard --seeds 1 2 3 4 5 6 7 8 --dtype bfloat16 \
        --out_dir runs/study-cpu-hard-offpolicy --report_only
    python tests/study_replay.py --preset tiny --seeds 1 2 --val_k 4   # the script, in minutes
"""
import argparse
import collections
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import torch

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, repo)
import rlep  # noqa: E402
import builtin  # noqa: E402
import data  # noqa: E402

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
# until finished runs say better: docs/study-plan.md, "Expected time"
default_seconds = {"cpu-hard": {"": 600, "-A2": 180, "-A4": 190, "-A5": 190, "-A6": 400},
                   "cpu": {"": 290, "-A2": 145, "-A4": 155, "-A5": 145, "-A6": 175},
                   "tiny": {"": 20, "-A2": 15, "-A4": 15, "-A5": 15, "-A6": 15}}


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


def finished(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "timings.json"))


def run_config(folder: str) -> dict:
    path = os.path.join(folder, "config.json")
    return json.load(open(path)) if os.path.isfile(path) else {}


def run_dtype(folder: str):
    """The compute dtype a run trained in (its config.json), None before it started."""
    return run_config(folder).get("dtype")


def stale_reason(folder: str, dtype: str, cfg) -> str:
    """Why a started run cannot join the study ('' if it can): another dtype or regime."""
    config = run_config(folder)
    if not config:
        return ""
    if config.get("dtype") != dtype:
        return f"not in {dtype}"
    differ = [k for k in regime_keys if config.get(k) != getattr(cfg, k)]
    return f"another regime ({', '.join(differ)})" if differ else ""


def set_aside_stale(runs: list, dtype: str, cfg):
    """Arms compare at one precision and in one regime: a run in another is renamed
    FOLDER.DTYPE (or FOLDER.old) and run again; if the seed's main run goes, so do the runs
    on its pool."""
    stale = {folder: stale_reason(folder, dtype, cfg) for folder, _ in runs}
    stale = {folder: why for folder, why in stale.items() if why}
    if runs[0][0] in stale:
        stale = {folder: stale.get(folder, "its pool is set aside") for folder, _ in runs
                 if os.path.exists(folder)}
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
        done = subprocess.run(command, cwd=repo, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)} (see {folder}.log)")


def expected_seconds(out: str, seeds: list, settings: list, cfg, with_a6: bool) -> float:
    """The runs still to do, each at the mean time of its finished kind (else the default)."""
    spent = collections.defaultdict(list)
    todo = []
    for seed in seeds:
        for folder, _ in runs_of(out, seed, settings, cfg, with_a6):
            kind = folder[len(os.path.join(out, f"seed{seed}")):]
            if finished(folder):
                spent[kind].append(json.load(open(os.path.join(folder, "timings.json")))["total_s"])
            else:
                todo.append(kind)
    default = default_seconds[cfg.preset]
    return sum(np.mean(spent[k]) if spent[k] else default[k] for k in todo)


def curve(folder: str, part: str, steps: int) -> tuple:
    """(steps, val_acc, metrics rows, {kind: val_acc}) of a part, up to `steps`."""
    rows = [r for r in data.read_jsonl(os.path.join(folder, part, "metrics.jsonl"))
            if r["step"] <= steps]
    points = [r for r in rows if "val_acc" in r]
    kinds = {k[len("val_acc/"):]: np.array([r[k] for r in points])
             for k in points[0] if k.startswith("val_acc/")}
    return (np.array([r["step"] for r in points]), np.array([r["val_acc"] for r in points]),
            rows, kinds)


# -----------------------------------------------------------------------------------------
# Intervals, p-values, Holm and the words (docs/study-plan.md); Student's t without scipy

def t95_bounds(values) -> tuple:
    """(mean, low, high): a 95 % t-interval over seeds, in the values' units."""
    values = np.asarray(values, dtype=float)
    # two-sided 95 % quantiles of Student's t, by degrees of freedom (the audited table, as the
    # plan states); beyond it the exact quantile
    t95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}
    half = float("nan")
    if len(values) > 1:
        df = len(values) - 1
        quantile = t95[df] if df in t95 else t_quantile(0.975, df)
        half = quantile * values.std(ddof=1) / math.sqrt(len(values))
    mean = values.mean()
    return mean, mean - half, mean + half


def interval(values) -> str:
    """mean and a 95 % t-interval over seeds, in points."""
    mean, low, high = t95_bounds(values)
    return f"{100 * mean:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"


def t_central(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer df, in closed form (Abramowitz and Stegun
    26.7.3 and 26.7.4): θ = atan(t / sqrt(df)), a finite series in cos²θ."""
    theta = math.atan(abs(t) / math.sqrt(df))
    sin, cos2 = math.sin(theta), math.cos(theta) ** 2
    if df == 1:
        return 2 * theta / math.pi
    term = total = 1.0
    for k in range(2 if df % 2 == 0 else 3, df - 1, 2):
        term *= cos2 * (k - 1) / k
        total += term
    if df % 2 == 0:
        return sin * total
    return 2 / math.pi * (theta + sin * math.cos(theta) * total)


def t_quantile(q: float, df: int) -> float:
    """The q-quantile of Student's t (q > 0.5), by bisection on t_central."""
    low, high = 0.0, 1e7
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_central(mid, df) < 2 * q - 1 else (low, mid)
    return (low + high) / 2


def paired_test(values) -> dict:
    """mean, standard error and two-sided t-test p-value of per-seed differences."""
    values = np.asarray(values, dtype=float)
    n = len(values)
    mean = float(values.mean())
    se = float(values.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    if n < 2:
        p = float("nan")
    elif se == 0:
        p = 0.0 if mean != 0 else 1.0
    else:
        p = 1 - t_central(mean / se, n - 1)
    return {"n": n, "mean": mean, "se": se, "p": p}


def holm(p_values: list, alpha: float = alpha) -> list[dict]:
    """Holm's step-down over the family, per contrast in the given order: the level of its
    interval, its adjusted p-value, rejected or not. Sorted by p, rank i (0-based) of m is
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
    half = t_quantile(1 - level / 2, test["n"] - 1) * test["se"]
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

def part_cost(rows: list, n: int, until: int) -> dict:
    """Generated responses and tokens of training steps 1..until, and sequences trained."""
    rows = [r for r in rows if 0 < r["step"] <= until]
    fresh = [len(r["visits"]) * n for r in rows]
    return {"responses": sum(fresh),
            "tokens": sum(r["response_len"] * f for r, f in zip(rows, fresh)),
            "trained": sum(f + sum(v["replays"] for v in r["visits"])
                           for r, f in zip(rows, fresh))}


def arm_costs(out: str, seed: int, found: dict, cfg, arm_names) -> dict:
    """Per arm: (phase one up to the collection, collection, own training) responses, the
    generated tokens and the sequences trained; every arm but A1 uses the pool."""
    main = os.path.join(out, f"seed{seed}")
    before = part_cost(found[seed, "A1"][2], cfg.n, cfg.collect_step)
    costs = {}
    for arm in arm_names:
        own = part_cost(found[seed, arm][2], cfg.n, cfg.phase2_steps)
        charged = {"before": 0, "collection": 0, "tokens": own["tokens"]}
        if arm != "A1":
            collection = os.path.join(main + ("-A6" if arm == "A6" else ""), "collect")
            tried = data.read_jsonl(os.path.join(collection, "progress.jsonl"))
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


def provenance() -> str:
    """The plan's commit and the code's, for the report."""
    def git(*args):
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else "?"
    plan = git("log", "-1", "--format=%h %cs", "--", "docs/study-plan.md") or "uncommitted"
    changed = git("status", "--porcelain", "--", "rlep.py", "data.py", "builtin.py", "verify.py",
                  "tests/study_replay.py", "docs/study-plan.md")
    state = "as committed" if not changed else "with uncommitted changes"
    return f"plan docs/study-plan.md at {plan}; code at {git('rev-parse', '--short', 'HEAD')} " \
           f"({state})"


# -----------------------------------------------------------------------------------------
# The report

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
             f"Preset {cfg.preset}, compute dtype {' and '.join(sorted(dtypes))}: validation "
             f"{avg} on {n_val} held-out problems every {cfg.val_every} steps ({per_point} "
             f"samples a point); {len(seeds)} seeds ({', '.join(map(str, seeds))}); mean over "
             "seeds (sd over seeds), in %; peak: the best point after step 0; noise: one "
             "point's sampling noise at the final's mean, sqrt(p (1 - p) / samples).", "",
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
    replay_arms = [arm for arm in names if names[arm][2] == "phase2"]
    num_train = len(data.read_rows(cfg.train_file))
    lines += ["", f"Per seed: the pool (prompts of the {num_train} training prompts with at least "
              f"{cfg.min_successes} verified answers of K = {cfg.collect_k}), and the rescued "
              f"visits of steps 1-{horizon} (in brackets, of steps 1-3: their share of the "
              "visits to pooled prompts):", "",
              "| seed | pool | " + " | ".join(replay_arms) + " |",
              "|---" * (len(replay_arms) + 2) + "|"]
    for s in seeds:
        main = os.path.join(out, f"seed{s}")
        cells = [f"{len(data.read_jsonl(os.path.join(main, 'collect', 'pool.jsonl')))}"]
        for arm in replay_arms:
            rescued, share = rescues(found[s, arm][2])
            cells.append(f"{rescued} ({100 * share:.0f} %)")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
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
    table = "\n".join(lines)
    open(os.path.join(out, "table.md"), "w").write(table + "\n")
    json.dump(results, open(os.path.join(out, "results.json"), "w"), indent=1, default=float)
    print(table)
    plot(out, steps, results, names)
    return results


def plot(out: str, steps, results: dict, names: dict):
    """forest.png (the main figure: the family's paired contrasts, the matched mechanism)
    and curves.png."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return print("no plot: matplotlib is not installed")
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


def drop_checkpoints(out: str, seed: int):
    """A finished seed's step_NNNNNN folders (its metrics, pools and logs stay)."""
    for folder in glob.glob(os.path.join(out, f"seed{seed}*", "phase*", "step_*")):
        if not os.path.islink(os.path.dirname(folder)):
            shutil.rmtree(folder)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="cpu-hard", choices=["cpu", "cpu-hard", "tiny"],
                        help="tiny: a smoke run of the study in minutes")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(1, 9)))
    parser.add_argument("--val_k", type=int, default=8)
    parser.add_argument("--val_every", type=int, default=2)
    parser.add_argument("--out_dir", default=None, help="default: runs/study-PRESET")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                        help="one compute dtype for every run (auto: measured once, here); "
                             "the plan pins bfloat16")
    parser.add_argument("--with_a6", action="store_true",
                        help="also A6, the pool at T = 1.0 (dropped by the plan)")
    parser.add_argument("--report_only", action="store_true")
    args = parser.parse_args()
    out = args.out_dir or os.path.join("runs", f"study-{args.preset}")
    os.makedirs(out, exist_ok=True)
    settings = ["--preset", args.preset, "--val_k", str(args.val_k),
                "--val_every", str(args.val_every)]
    cfg = rlep.parse_config(settings)
    start = time.time()
    if not args.report_only:
        # rlep.py measures the dtype per run; a busy machine could flip one run's choice
        model_path = builtin.resolve_model(cfg.model_path, cfg.cache_dir, build=True)
        choice = builtin.resolve_dtype(args.dtype, torch.device("cpu"), model_path)
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
            set_aside_stale(runs_of(out, seed, settings, cfg, args.with_a6), choice.dtype, cfg)
        expected = expected_seconds(out, args.seeds, settings, cfg, args.with_a6)
        hours = f" ({expected / 3600:.1f} h)" if expected >= 3600 else ""
        print(f"study {args.preset}, seeds {args.seeds}: expected {expected / 60:.0f} min{hours} "
              "more (finished runs' times, else the project machine's solo)", flush=True)
        for seed in args.seeds:
            runs = runs_of(out, seed, [*settings, "--seed", str(seed)], cfg, args.with_a6)
            for folder, flags in runs:
                if not finished(folder):
                    run(folder, flags, runs[0][0])
            drop_checkpoints(out, seed)
            print(f"seed {seed} done after {(time.time() - start) / 60:.0f} min", flush=True)
    report(out, args.seeds, cfg, args.with_a6)
    print(f"study time {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
