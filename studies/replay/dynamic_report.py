"""The dynamic-sampling study's report (--study dynamic, docs/study-plan-dynamic.md): compute on
the x-axis, the metering, the seed-1 check, the plan's time against the runs', the machines."""
import collections
import os
import subprocess

import numpy as np

from machinery import data
from machinery.files import read_jsonl

from . import repo
from .arms import dynamic_arms, dynamic_family, dynamic_plan, family_arms, on_pool
from .compute import arm_costs, compute_axis, equal_compute_table, mean_range, metering, span
from .intervals import alpha, contrasts_table, null_band, points
from .mechanism import rescues
from .plots import plot_dynamic
from .runner import curve, run_dtype, run_machine, run_started, utc
from .tables import (contrast_lines, curve_line, curves_prose, per_kind_finals, pools_lines,
                     provenance, write_report)

# The reproduction check: seed 1's numbers as published by the off-policy study (docs/studies.md,
# "Pools and rescues" of the off-policy study on cpu-hard, run at commit 7c0a0e0): the pool's
# prompts; per arm, the rescued visits of steps 1-6 and their share (%, whole) of the visits to
# pooled prompts in steps 1-3
offpolicy_seed1 = {"pool": 38, "A3": (18, 58), "A5": (15, 50)}


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
