"""The off-policy study's report (docs/study-plan.md): the curves, the family's contrasts, the
per-kind finals, the pools and rescues, the mechanism, the compute; table.md, results.json and
the figures."""
import os

import numpy as np

from machinery import data

from .arms import study_arms, study_family
from .compute import arm_costs, part_cost
from .intervals import contrasts_table, null_band, percent, points
from .mechanism import mechanism, mechanism_band
from .plots import plot
from .runner import curve, run_dtype
from .tables import (contrast_lines, curve_line, curves_prose, per_kind_finals, pools_lines,
                     provenance, write_report)


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
