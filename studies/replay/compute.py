"""Compute, in generated responses (docs/study-plan.md, "Fair compute"): each arm's cost and
charges, the curves against the responses generated from π_θ0 and their differences at equal
responses, and the metering of generation (--study dynamic)."""
import os

import numpy as np

from machinery.files import read_jsonl

from .intervals import t95_bounds


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


def mean_range(values) -> str:
    """'mean (min-max)' of some counts."""
    return f"{np.mean(values):,.1f} ({span(values)})"
