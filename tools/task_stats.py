"""The statistics a replay setting is chosen by (docs/studies.md: "Where replay can act"):
how often the base model solves each training problem, by kind, and, for a finished run, how
much of the training set its pool covers and how often phase two's fresh samples all fail on a
pooled prompt while a replay is right (a rescue).

    # the base model: k samples at T = 1.0 for every training problem, by data_source
    python tools/task_stats.py --preset cpu-hard --k 8
    # a run folder: the pool's coverage and the rescues of phase two's first steps
    python tools/task_stats.py --run_dir runs/calibrate --steps 3
"""
import argparse
import collections
import json
import os
import sys

import numpy as np

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, repo)
import rlep  # noqa: E402  (sets vLLM's environment before torch is imported)
from machinery import data, files, fsdp, hub, ranks


def base_model_table(cfg: rlep.Config, k: int):
    """Per kind: mean and median per-problem accuracy, share of problems with 0 and >= 2 of k
    right; the base model samples as in training (T = cfg.temperature)."""
    from transformers import AutoTokenizer
    d = ranks.setup_distributed()
    model_path = hub.model_folder(cfg.model_path, cfg.cache_dir)
    cfg.dtype = fsdp.resolve_dtype(cfg.dtype, d.device, model_path).dtype
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    rows = data.read_rows(cfg.train_file)
    engine = rlep.build_engine(cfg, model_path, d)
    end_id = rlep.end_token_id(tokenizer, cfg.stop_token)
    records = rlep.sample_and_grade(engine, tokenizer, rows, k, cfg, [end_id], d,
                                    (cfg.seed, "task_stats"))
    engine.shutdown()
    by_kind = collections.defaultdict(list)
    for row, record in zip(rows, records):
        by_kind[row.get("data_source", "all")].append(np.mean(record["correct"]))
    by_kind["all"] = [a for kind in list(by_kind) for a in by_kind[kind]]
    print(f"base model {cfg.model_path}, {k} samples at T = {cfg.temperature} for each of "
          f"{len(rows)} training problems ({cfg.train_file}); per-problem accuracy:")
    print(f"| problems | n | mean | median | 0 of {k} right | >= 2 of {k} right |")
    print("|---|---|---|---|---|---|")
    for kind, accuracy in by_kind.items():
        accuracy = np.array(accuracy)
        print(f"| {kind} | {len(accuracy)} | {100 * accuracy.mean():.1f} % | "
              f"{100 * np.median(accuracy):.1f} % | {100 * np.mean(accuracy == 0):.0f} % | "
              f"{100 * np.mean(accuracy >= 2 / k - 1e-9):.0f} % |")


def run_table(run_dir: str, steps: int):
    """The pool's coverage of the training prompts (by kind) and phase two's rescues per step."""
    cfg = json.load(open(os.path.join(run_dir, "config.json")))
    rows = data.read_rows(cfg["train_file"])
    pool = {row["id"] for row in files.read_jsonl(os.path.join(run_dir, "collect", "pool.jsonl"))}
    kinds = collections.defaultdict(lambda: [0, 0])
    for row in rows:
        kind = kinds[row.get("data_source", "all")]
        kind[0] += row["id"] in pool
        kind[1] += 1
    covered = " | ".join(f"{k} {p} of {n}" for k, (p, n) in kinds.items())
    print(f"{run_dir}: the pool (K = {cfg['collect_k']} at T = {cfg['collect_temperature']}, "
          f">= {cfg['min_successes']} verified, phase-one step {cfg['collect_step']}) covers "
          f"{len(pool)} of {len(rows)} training prompts ({100 * len(pool) / len(rows):.0f} %): "
          f"{covered}")
    metrics = [r for r in files.read_jsonl(os.path.join(run_dir, "phase2", "metrics.jsonl"))
               if 0 < r["step"] <= steps]
    rescued = sum(r["rescued"] for r in metrics)
    pooled = sum(v["replays"] > 0 for r in metrics for v in r["visits"])
    for r in metrics:
        print(f"  phase two step {r['step']}: rescued {r['rescued']} of "
              f"{sum(v['replays'] > 0 for v in r['visits'])} visits to pooled prompts")
    print(f"  steps 1-{steps}: {rescued} of {pooled} visits rescued "
          f"({100 * rescued / max(1, pooled):.0f} %)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="cpu-hard")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--run_dir", help="summarize this finished run instead")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    if args.run_dir:
        return run_table(args.run_dir, args.steps)
    base_model_table(rlep.parse_config(["--preset", args.preset]), args.k)


if __name__ == "__main__":
    main()
