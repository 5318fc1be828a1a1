"""Intervals, p-values, Holm and the words (docs/study-plan.md); Student's t from scipy.stats:
the family's contrasts on the peak and the final, each worded by the plan's rule."""
import math

import numpy as np
from scipy import stats

# two-sided 95 % quantiles of Student's t by degrees of freedom, to two decimals: the table the
# plans state for the raw intervals (the committed reports used it); beyond it the exact quantile
t95_table = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}
alpha = 0.05  # family-wise, Holm
null_band = 2.0  # points: a Holm interval inside [-2, +2] that holds 0 is a null


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
