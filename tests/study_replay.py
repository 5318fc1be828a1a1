"""What replay buys, with its confounds separated: per seed, six arms of a CPU preset, all
validated on the same draws (seed, step, problem) over the same training steps.

    A1  baseline, all prompts     phase one of `python rlep.py` (folder seedS)
    A2  baseline, pool's prompts  --phase 1 --phase1_prompts pool --pool A3's pool (seedS-A2)
    A3  RLEP, as the paper        phase two of seedS: the pool's prompts, n fresh + m replayed
    A4  RLEP, all prompts         --phase 2 --phase2_prompts all --pool A3's pool (seedS-A4)
    A5  replays imitated          --phase 2 --replay_loss nll --pool A3's pool (seedS-A5)
    A6  RLEP, pool at T = 1.0     seedS's phase-one checkpoint, a second collection at
                                  --collect_temperature 1.0, then phase two (seedS-A6)

A run that finished (its timings.json) is reused, one cut short is resumed, so a stopped study
continues where it stopped; it prints its expected time at the start. A finished seed's
checkpoints are deleted (their metrics stay): five seeds would otherwise hold ~50 GB. Writes
results.json, table.md and study.png into --out_dir.

    python tests/study_replay.py --preset cpu-hard --seeds 1 2 3 4 5
    python tests/study_replay.py --preset cpu --seeds 1 2 3 4 5
    python tests/study_replay.py --preset cpu-hard --seeds 1 2 3 4 5 --report_only
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

# arm -> (label, folder suffix, part whose curve it is)
arms = {"A1": ("baseline, all prompts", "", "phase1"),
        "A2": ("baseline, pool's prompts", "-A2", "phase1"),
        "A3": ("RLEP (the paper)", "", "phase2"),
        "A4": ("RLEP, all prompts", "-A4", "phase2"),
        "A5": ("replays imitated (nll)", "-A5", "phase2"),
        "A6": ("RLEP, pool at T = 1.0", "-A6", "phase2")}
contrasts = [("A3", "A2"), ("A4", "A1"), ("A3", "A5"), ("A3", "A6"), ("A3", "A1")]
# seconds of each run on the project's machine (bf16), until finished runs say better
default_seconds = {"cpu-hard": {"": 480, "-A2": 150, "-A4": 160, "-A5": 150, "-A6": 370},
                   "cpu": {"": 260, "-A2": 130, "-A4": 140, "-A5": 130, "-A6": 160},
                   "tiny": {"": 20, "-A2": 15, "-A4": 15, "-A5": 15, "-A6": 15}}


def runs_of(out: str, seed: int, settings: list, cfg) -> list:
    """(folder, rlep.py flags) of a seed's five runs, in the order they must run."""
    main = os.path.join(out, f"seed{seed}")
    pool = os.path.join(main, "collect", "pool.jsonl")
    return [(main, settings),
            (main + "-A2", settings + ["--phase", "1", "--phase1_prompts", "pool", "--pool", pool,
                                       "--phase1_steps", str(cfg.phase2_steps)]),
            (main + "-A4", settings + ["--phase", "2", "--pool", pool, "--phase2_prompts", "all"]),
            (main + "-A5", settings + ["--phase", "2", "--pool", pool, "--replay_loss", "nll"]),
            (main + "-A6", settings + ["--collect_temperature", "1.0"])]


def finished(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "timings.json"))


def run_dtype(folder: str):
    """The compute dtype a run trained in (its config.json), None before it started."""
    path = os.path.join(folder, "config.json")
    return json.load(open(path)).get("dtype") if os.path.isfile(path) else None


def set_aside_other_dtype(runs: list, dtype: str):
    """Arms compare at one precision: a run in another dtype is renamed FOLDER.DTYPE (kept,
    not deleted) and run again; if the seed's main run goes, so do the runs on its pool."""
    stale = [folder for folder, _ in runs if run_dtype(folder) not in (None, dtype)]
    if runs[0][0] in stale:
        stale = [folder for folder, _ in runs if os.path.exists(folder)]
    for folder in stale:
        aside = f"{folder}.{run_dtype(folder) or dtype}"
        print(f"{folder}: not in {dtype}, moved to {aside} to run again", flush=True)
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


def expected_seconds(out: str, seeds: list, settings: list, cfg) -> float:
    """The runs still to do, each at the mean time of its finished kind (else the default)."""
    spent = collections.defaultdict(list)
    todo = []
    for seed in seeds:
        for folder, _ in runs_of(out, seed, settings, cfg):
            kind = folder[len(os.path.join(out, f"seed{seed}")):]
            if finished(folder):
                spent[kind].append(json.load(open(os.path.join(folder, "timings.json")))["total_s"])
            else:
                todo.append(kind)
    default = default_seconds[cfg.preset]
    return sum(np.mean(spent[k]) if spent[k] else default[k] for k in todo)


def curve(folder: str, part: str, steps: int) -> tuple:
    """(steps, val_acc, metrics rows, {kind: val_acc}) of a part, up to `steps`."""
    rows = [r for r in rlep.read_jsonl(os.path.join(folder, part, "metrics.jsonl"))
            if r["step"] <= steps]
    points = [r for r in rows if "val_acc" in r]
    kinds = {k[len("val_acc/"):]: np.array([r[k] for r in points])
             for k in points[0] if k.startswith("val_acc/")}
    return (np.array([r["step"] for r in points]), np.array([r["val_acc"] for r in points]),
            rows, kinds)


def interval(values) -> str:
    """mean and a 95 % t-interval over seeds, in points."""
    values = np.asarray(values, dtype=float)
    # two-sided 95 % quantiles of Student's t, by degrees of freedom
    t95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}
    half = float("nan")
    if len(values) > 1:
        half = t95.get(len(values) - 1, 2.0) * values.std(ddof=1) / math.sqrt(len(values))
    mean = values.mean()
    return f"{100 * mean:+.1f} [{100 * (mean - half):+.1f}, {100 * (mean + half):+.1f}]"


def responses_until(rows: list, step: int, per_step: int) -> int:
    """Fresh responses generated by training steps 1..step (replays are reused, not made)."""
    return per_step * sum(1 for r in rows if 0 < r["step"] <= step)


def next_visits(rows: list, n: int) -> dict:
    """The fresh accuracy (of n samples) at a prompt's next visit, by what happened at the
    visit before: rescued, pooled and not rescued, all fresh wrong without replays."""
    last = {}
    found = collections.defaultdict(list)
    for r in rows:
        for visit in r.get("visits", []):
            before = last.get(visit["id"])
            if before is not None:
                accuracy = visit["fresh_correct"] / n
                if before["rescued"]:
                    found["rescued"].append(accuracy)
                elif before["replays"]:
                    found["pooled, not rescued"].append(accuracy)
                elif before["fresh_correct"] == 0:
                    found["all fresh wrong, no replay"].append(accuracy)
            last[visit["id"]] = visit
    return found


def report(out: str, seeds: list, cfg):
    per_step = cfg.prompts_per_step * cfg.n
    horizon = cfg.phase2_steps
    found = {}
    dtypes = set()
    for seed in seeds:
        for arm, (_, suffix, part) in arms.items():
            folder = os.path.join(out, f"seed{seed}{suffix}")
            found[seed, arm] = curve(folder, part, horizon)
            dtypes.add(run_dtype(folder))
    steps = found[seeds[0], "A1"][0]
    n_val = len(rlep.read_rows(cfg.val_file))
    lines = [f"Preset {cfg.preset}, compute dtype {' and '.join(sorted(dtypes))}: "
             f"validation avg@{cfg.val_k} on {n_val} held-out problems "
             f"every {cfg.val_every} steps; {len(seeds)} seeds ({', '.join(map(str, seeds))}); "
             "mean over seeds (sd over seeds), in %; peak: the best point after step 0 (step 0 "
             "is the same base model in every arm).", "",
             "| arm | " + " | ".join(f"step {s}" for s in steps) + " | peak | final |",
             "|---" * (len(steps) + 3) + "|"]
    results = {"preset": cfg.preset, "seeds": seeds, "steps": steps.tolist(), "arms": {}}
    for arm, (label, _, _) in arms.items():
        acc = np.array([found[s, arm][1] for s in seeds])  # (seeds, points)
        spread = acc.std(0, ddof=1) if len(seeds) > 1 else 0 * acc[0]
        cells = [f"{100 * m:.1f} ({100 * sd:.1f})" for m, sd in zip(acc.mean(0), spread)]
        lines.append(f"| {arm}: {label} | " + " | ".join(cells)
                     + f" | {100 * acc[:, 1:].max(1).mean():.1f} | {100 * acc[:, -1].mean():.1f} |")
        results["arms"][arm] = {"acc": acc.tolist()}
    lines += ["", "Paired differences (same seed, same validation draws), mean [95 % t-interval "
              "over seeds], points:", "", "| difference | peak | final |", "|---|---|---|"]
    for a, b in contrasts:
        pa, pb = np.array(results["arms"][a]["acc"]), np.array(results["arms"][b]["acc"])
        peaks = pa[:, 1:].max(1) - pb[:, 1:].max(1)
        lines.append(f"| {a} - {b} | {interval(peaks)} | "
                     f"{interval(pa[:, -1] - pb[:, -1])} |")
    kinds = sorted(found[seeds[0], "A1"][3])
    if kinds:
        lines += ["", "Final validation accuracy by kind (data_source), mean over seeds, %:", "",
                  "| arm | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 1) + "|"]
        for arm in arms:
            cells = [f"{100 * np.mean([found[s, arm][3][k][-1] for s in seeds]):.1f}"
                     for k in kinds]
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    # the pools and the rescues
    lines += ["", f"Per seed: the pools (prompts of the training set, collected at T = "
              f"{cfg.collect_temperature} and, for A6, 1.0), and the rescued visits of phase two "
              f"(steps 1-{horizon}; in brackets, of steps 1-3: their share of the visits to pooled "
              "prompts):", "", "| seed | pool | pool A6 | A3 | A4 | A5 | A6 |", "|---" * 7 + "|"]
    num_train = len(rlep.read_rows(cfg.train_file))
    for s in seeds:
        main = os.path.join(out, f"seed{s}")
        pools = [len(rlep.read_jsonl(os.path.join(f, "collect", "pool.jsonl")))
                 for f in (main, main + "-A6")]
        cells = [f"{pools[0]} of {num_train}", f"{pools[1]} of {num_train}"]
        for arm in ("A3", "A4", "A5", "A6"):
            rows = [r for r in found[s, arm][2] if r["step"] > 0]
            early = [r for r in rows if r["step"] <= 3]
            pooled = sum(v["replays"] > 0 for r in early for v in r["visits"])
            share = sum(r["rescued"] for r in early) / max(1, pooled)
            cells.append(f"{sum(r['rescued'] for r in rows)} ({100 * share:.0f} %)")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    # compute until A1's peak
    lines += ["", "Fresh responses generated until an arm first reaches A1's peak (the step in "
              "brackets); the replay arms also pay phase one up to the collection's checkpoint "
              "and the collection (K per training prompt); never: not reached within "
              f"{horizon} steps:", "", "| seed | " + " | ".join(arms) + " |",
              "|---" * (len(arms) + 1) + "|"]
    for s in seeds:
        main = os.path.join(out, f"seed{s}")
        target = found[s, "A1"][1][1:].max()
        before = responses_until(found[s, "A1"][2], cfg.collect_step, per_step)
        costs = []
        for arm in arms:
            st, acc, rows, _ = found[s, arm]
            hits = [int(x) for x, a in zip(st, acc) if x > 0 and a >= target]
            if not hits:
                costs.append("never")
                continue
            cost = responses_until(rows, hits[0], per_step)
            if arm in ("A3", "A4", "A5", "A6"):
                collection = os.path.join(main + ("-A6" if arm == "A6" else ""), "collect")
                tried = len(rlep.read_jsonl(os.path.join(collection, "progress.jsonl")))
                cost += before + tried * cfg.collect_k
            costs.append(f"{cost} ({hits[0]})")
        lines.append(f"| {s} | " + " | ".join(costs) + " |")
    # the mechanism: does a rescue change the next visit?
    mechanism = collections.defaultdict(list)
    for s in seeds:
        for arm in ("A3", "A2"):
            for kind, values in next_visits(found[s, arm][2], cfg.n).items():
                mechanism[f"{arm}: {kind}"] += values
    lines += ["", f"Fresh-sample accuracy at a prompt's next visit (within the {horizon} steps, "
              "all seeds pooled), by what happened at the visit before:", "",
              "| visit before | next visits | fresh accuracy at the next visit |", "|---|---|---|"]
    if not mechanism:
        lines.append("| (no prompt was visited twice within the steps) | 0 | |")
    for kind, values in sorted(mechanism.items()):
        se = np.std(values, ddof=1) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
        lines.append(f"| {kind} | {len(values)} | {100 * np.mean(values):.1f} % "
                     f"(SE {100 * se:.1f}) |")
    results["mechanism"] = dict(mechanism)
    table = "\n".join(lines)
    open(os.path.join(out, "table.md"), "w").write(table + "\n")
    json.dump(results, open(os.path.join(out, "results.json"), "w"), indent=1)
    print(table)
    plot(out, steps, results)


def plot(out: str, steps, results: dict):
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        return print("no plot: matplotlib is not installed")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    for i, (arm, (label, _, _)) in enumerate(arms.items()):
        acc = 100 * np.array(results["arms"][arm]["acc"])
        mean = acc.mean(0)
        sd = acc.std(0, ddof=1) if len(acc) > 1 else 0 * mean
        style = "--" if arm in ("A1", "A2") else "-"
        left.plot(steps, mean, style, marker=".", color=f"C{i}", label=f"{arm}: {label}")
        left.fill_between(steps, mean - sd, mean + sd, color=f"C{i}", alpha=0.1)
    left.set(xlabel="training step", ylabel=f"validation avg@k (%)",
             title=f"{results['preset']}: mean over {len(results['seeds'])} seeds, band ± 1 sd")
    left.legend(fontsize=8)
    kinds = sorted(results["mechanism"])
    means = [100 * np.mean(results["mechanism"][k]) for k in kinds]
    errors = [100 * np.std(results["mechanism"][k], ddof=1)
              / math.sqrt(len(results["mechanism"][k])) if len(results["mechanism"][k]) > 1
              else 0 for k in kinds]
    right.barh(range(len(kinds)), means, xerr=errors, color="C7")
    right.set_yticks(range(len(kinds)),
                     [f"{k} (n={len(results['mechanism'][k])})" for k in kinds], fontsize=8)
    right.set(xlabel="fresh accuracy at the next visit (%, ± 1 SE)",
              title="after a rescue, and without one")
    path = os.path.join(out, "study.png")
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def drop_checkpoints(out: str, seed: int):
    """A finished seed's step_NNNNNN folders (its metrics, pools and logs stay)."""
    for folder in glob.glob(os.path.join(out, f"seed{seed}*", "phase*", "step_*")):
        if not os.path.islink(os.path.dirname(folder)):
            shutil.rmtree(folder)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="cpu-hard", choices=["cpu", "cpu-hard", "tiny"],
                        help="tiny: a smoke run of the study in minutes")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--val_k", type=int, default=8)
    parser.add_argument("--val_every", type=int, default=2)
    parser.add_argument("--out_dir", default=None, help="default: runs/study-PRESET")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                        help="one compute dtype for every run (auto: measured once, here)")
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
        model_path = rlep.resolve_model(cfg.model_path, cfg.cache_dir, build=True)
        choice = rlep.resolve_dtype(args.dtype, torch.device("cpu"), model_path)
        print(f"every run in {choice.dtype} ({choice.why})", flush=True)
        settings += ["--dtype", choice.dtype]
        for seed in args.seeds:
            set_aside_other_dtype(runs_of(out, seed, settings, cfg), choice.dtype)
        expected = expected_seconds(out, args.seeds, settings, cfg)
        print(f"study {args.preset}, seeds {args.seeds}: expected {expected / 60:.0f} min "
              "more on this machine", flush=True)
        for seed in args.seeds:
            runs = runs_of(out, seed, [*settings, "--seed", str(seed)], cfg)
            for folder, flags in runs:
                if not finished(folder):
                    run(folder, flags, runs[0][0])
            drop_checkpoints(out, seed)
            print(f"seed {seed} done after {(time.time() - start) / 60:.0f} min", flush=True)
    report(out, args.seeds, cfg)
    print(f"study time {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
