"""The report's pieces both studies share: the curves table and its prose, the contrasts table,
the per-kind finals, the pools and rescues, the provenance, and table.md with results.json."""
import json
import math
import os
import subprocess

import numpy as np

from machinery import data
from machinery.files import read_jsonl

from . import repo
from .intervals import interval, points
from .mechanism import rescues


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
                  "studies", plan)
    state = "as committed" if not changed else "with uncommitted changes"
    return f"plan {plan} at {commit}; code at {git('rev-parse', '--short', 'HEAD')} " \
           f"({state})"


def write_report(out: str, lines: list, results: dict):
    """table.md and results.json in out; the table on stdout."""
    table = "\n".join(lines)
    open(os.path.join(out, "table.md"), "w").write(table + "\n")
    json.dump(results, open(os.path.join(out, "results.json"), "w"), indent=1, default=float)
    print(table)
