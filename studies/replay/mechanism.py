"""The mechanism: a prompt's next visit, on matched prompts (docs/study-plan.md); the planned
comparator; the rescued visits."""
import collections

import numpy as np

from .intervals import t95_bounds, word

mechanism_band = 5.0  # points of next-visit accuracy, the same rule for the mechanism


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


def rescues(rows: list) -> tuple:
    """(rescued visits of the training steps, their share of the visits to pooled prompts in
    steps 1-3): a cell of the "Pools and rescues" table."""
    rows = [r for r in rows if r["step"] > 0]
    early = [r for r in rows if r["step"] <= 3]
    pooled = sum(v["replays"] > 0 for r in early for v in r["visits"])
    share = sum(r["rescued"] for r in early) / max(1, pooled)
    return sum(r["rescued"] for r in rows), share
