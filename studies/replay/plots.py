"""The figures, with matplotlib if it is installed: the forest of contrasts (the main figure),
the curves, and --study dynamic's accuracy against the responses generated (compute.png)."""
import math
import os

import numpy as np

from .intervals import null_band


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
