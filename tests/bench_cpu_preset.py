"""Where the embedded default's time goes on this machine: runs `python rlep.py` (the cpu preset,
both phases, the collection and the comparison) as a user would, with no environment variable set,
then prints the CPU, the compute dtype rlep.py chose, seconds per training step split by part,
generation and training throughput, the run's time table, its wall time and peak resident memory.

    # the whole default run (README: ~10 min, 2 cores)
    python tests/bench_cpu_preset.py
    # a part of it
    python tests/bench_cpu_preset.py --out_dir runs/b -- --phase 1 --phase1_steps 2 --val_every 0
    # a finished run folder (no wall time or memory)
    python tests/bench_cpu_preset.py --summarize runs/cpu

To see an AVX2-only CPU's speed on a newer one, run it with `ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2` (torch, oneDNN and MKL then use AVX2 kernels
only; rlep.py then picks float32). Older runs (before t_generation was named so) are read too:
t_generate and t_train.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_line() -> str:
    info = open("/proc/cpuinfo").read() if os.path.isfile("/proc/cpuinfo") else ""
    lines = info.splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    described = f"{model}, {os.cpu_count()} cores, {' '.join(isa)}"
    emulated = os.environ.get("ATEN_CPU_CAPABILITY") or os.environ.get("ONEDNN_MAX_CPU_ISA")
    if emulated:
        described += f" (limited to {emulated} by the environment)"
    return described


def summarize(out_dir: str):
    cfg = json.load(open(os.path.join(out_dir, "config.json")))
    print(f"run: {out_dir} | preset {cfg['preset']} | dtype {cfg['dtype']} | "
          f"{cfg['prompts_per_step']} prompts x {cfg['n']} samples per step")
    for part in ("phase1", "phase2"):
        path = os.path.join(out_dir, part, "metrics.jsonl")
        if not os.path.isfile(path):
            continue
        rows = [r for r in map(json.loads, open(path)) if r["step"] > 0]
        if not rows:
            continue
        # each timing under its current name, or its old one
        names = (("t_generation", "t_generate"), ("t_scoring", "t_score"),
                 ("t_training", "t_train"), ("t_push", "t_sync"))
        t = {name: np.array([r.get(name, r.get(old, 0.0)) for r in rows]) for name, old in names}
        fresh = cfg["prompts_per_step"] * cfg["n"]
        # fresh + replayed sequences trained on
        samples = np.array([fresh / (1 - r.get("replay_frac", 0.0)) for r in rows])
        # fresh response tokens generated
        tokens = np.array([r["response_len"] * fresh for r in rows])
        per_step = " | ".join(f"{k[2:]} {v.mean():.1f} s" for k, v in t.items())
        print(f"{part}: {len(rows)} steps | per step: {per_step}"
              f" | generation {tokens.sum() / t['t_generation'].sum():.0f} response tokens/s"
              f" | training {samples.sum() / t['t_training'].sum():.2f} sequences/s, "
              f"{tokens.sum() / t['t_training'].sum():.0f} fresh response tokens/s")
    timings = os.path.join(out_dir, "timings.json")
    if os.path.isfile(timings):
        table = json.load(open(timings))
        total = table["total_s"]
        parts = " | ".join(f"{k} {v:.0f} s ({100 * v / total:.0f} %)"
                           for k, v in table["parts_s"].items())
        print(f"time table ({out_dir}/timings.json): {parts} | total {total:.0f} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out_dir", default="runs/bench-cpu")
    parser.add_argument("--summarize", metavar="RUN_DIR",
                        help="only summarize a finished run folder")
    parser.add_argument("rlep_args", nargs="*", help="extra rlep.py flags, after --")
    args = parser.parse_args()
    print(f"cpu: {cpu_line()}")
    if args.summarize:
        return summarize(args.summarize)
    command = [sys.executable, os.path.join(repo, "rlep.py"), "--out_dir", args.out_dir,
               *args.rlep_args]
    print("command:", " ".join(command), flush=True)
    start = time.time()
    done = subprocess.run(command, cwd=repo)
    wall = time.time() - start
    if done.returncode != 0:
        raise SystemExit(f"rlep.py failed with exit code {done.returncode}")
    summarize(args.out_dir)
    peak_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2 ** 20  # KiB on Linux
    print(f"wall time {wall:.0f} s ({wall / 60:.1f} min) | peak resident memory {peak_gib:.1f} GiB")


if __name__ == "__main__":
    main()
