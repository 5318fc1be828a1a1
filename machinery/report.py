"""A finished run's report: the paper's comparison of baseline and RLEP per validation metric
(peaks, when RLEP reaches the baseline's, finals), their curves, and where the time went
(timings.json adds a resumed run's processes)."""
import collections
import json
import os

from machinery.files import read_jsonl, write_atomic


def validation_curves(run_dir: str) -> tuple[str, dict]:
    """A run's name and {val_acc or val_acc/<source>: [phase one's curve, phase two's]} of its
    metrics.jsonl, by metric; a curve is [(step, value)], [] where the part has none. A run
    without any is bad input."""
    points = collections.defaultdict(lambda: ({}, {}))
    for i, part in enumerate(("phase1", "phase2")):
        for row in read_jsonl(os.path.join(run_dir, part, "metrics.jsonl")):
            for key, value in row.items():
                if key.startswith("val_acc") and value is not None:
                    points[key][i][row["step"]] = value
    if not points:
        raise ValueError(f"{run_dir}: no val_acc in phase1/metrics.jsonl or phase2/metrics.jsonl")
    return os.path.basename(os.path.normpath(run_dir)), {
        key: [sorted(part.items()) for part in parts] for key, parts in sorted(points.items())}


def comparison_rows(run_dirs: list[str]) -> list[list[str]]:
    """The paper's comparison per run and validation metric, a row each under the header: the
    peaks, when RLEP first reaches the baseline's, the finals. The rows the Markdown table and
    W&B's table are made of."""
    def cell(point):
        return "n/a" if point is None else f"{100 * point[1]:.1f} (step {point[0]})"

    def peak(curve):
        # the earliest of equal peaks
        return max(curve, key=lambda point: (point[1], -point[0]), default=None)

    rows = [["run", "metric", "baseline peak", "RLEP reaches it at", "RLEP peak",
             "baseline final", "RLEP final"]]
    for name, curves in map(validation_curves, run_dirs):
        for key, (base, ours) in curves.items():
            best = peak(base)
            reached = "n/a"
            if best and ours:
                reached = next((f"step {s}" for s, v in ours if v >= best[1]), "never")
            rows.append([name, key, cell(best), reached, cell(peak(ours)),
                         cell(base[-1] if base else None), cell(ours[-1] if ours else None)])
    return rows


def markdown(rows: list[list[str]]) -> str:
    """A table's rows, the header first, in Markdown."""
    head, *body = [f"| {' | '.join(row)} |" for row in rows]
    return "\n".join([head, "|---" * len(rows[0]) + "|", *body])


def comparison_table(run_dirs: list[str]) -> str:
    """comparison_rows in Markdown."""
    return markdown(comparison_rows(run_dirs))


def save_plot(path: str, panels: dict, ylabel: str) -> str:
    """panels: {title: [(label, steps, values, linestyle, colour index)]}, a subplot each.
    Returns the line to print."""
    try:
        # picks a file-only backend on machines without a display
        import matplotlib.pyplot as plt
    except ImportError:
        return f"no plot ({path}): matplotlib is not installed"
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4),
                             squeeze=False, layout="constrained")
    for ax, (title, lines) in zip(axes[0], panels.items()):
        for label, steps, values, style, colour in lines:
            ax.plot(steps, [100 * v for v in values], style, color=f"C{colour}", marker=".",
                    label=label)
        ax.set(title=title, xlabel="training step", ylabel=ylabel)
        ax.legend()
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)
    return f"plot: {path}"


def plot_comparison(run_dirs: list[str], path: str) -> str:
    """The runs' validation curves: a panel per metric, a colour per run, the baseline (phase
    one) dashed, RLEP (phase two) solid."""
    panels = collections.defaultdict(list)
    for i, (name, metrics) in enumerate(map(validation_curves, run_dirs)):
        for key, curves in metrics.items():
            for (label, style), curve in zip((("baseline", "--"), ("RLEP", "-")), curves):
                if curve:
                    steps, values = map(list, zip(*curve))
                    panels[key].append((f"{name} {label}", steps, values, style, i))
    return save_plot(path, dict(sorted(panels.items())),
                     "validation avg@k (%)")


def final_report(out_dir: str, compare: bool, total: float, spent: dict, gflops) -> list:
    """Rank 0's end of rlep.py: with `compare`, the comparison table (printed, its rows
    returned; else []) and curves.png; the time table, seconds per activity; timings.json, where
    a resumed run's processes add up."""
    table = []
    if compare:
        table = comparison_rows([out_dir])
        print(markdown(table))
        print(plot_comparison([out_dir], os.path.join(out_dir, "curves.png")))
    print(f"time: {total:.0f} s | "
          + " | ".join(f"{k} {v:.0f} s ({100 * v / total:.0f} %)" for k, v in spent.items()))
    # timings.json: added to a resumed run's earlier processes' (counted in "processes")
    path = os.path.join(out_dir, "timings.json")
    earlier = (read_jsonl(path) or [{}])[0]  # one line
    parts = collections.Counter(earlier.get("parts_s"))  # None: empty
    parts.update(spent)
    write_atomic(path, json.dumps({"total_s": earlier.get("total_s", 0) + total, "parts_s": parts,
                                   "processes": earlier.get("processes", 1 if earlier else 0) + 1,
                                   "linear_gflops": gflops}))
    return table
