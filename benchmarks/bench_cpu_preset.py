"""Where the embedded default's time goes on this machine: runs `python rlep.py` (the cpu preset,
both phases, the collection and the comparison) as a user would, with no environment variable set,
then prints the CPU and its flags, the compute dtype rlep.py chose and the linear-layer throughput
it measured for the choice, per part and per training step the seconds, the generated and trained
tokens per second, the training step's model GFLOP/s against that measured throughput, the run's
time table, its wall time and peak resident memory.

    # the whole default run
    python benchmarks/bench_cpu_preset.py --out_dir runs/bench
    # a part of it
    python benchmarks/bench_cpu_preset.py --out_dir runs/b -- --phase 1 --phase1_steps 2 \
        --val_every 0
    # a finished run folder (no wall time or memory)
    python benchmarks/bench_cpu_preset.py --summarize runs/cpu

To see an AVX2-only CPU's speed on a newer one, run it with `ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2` (torch, oneDNN and MKL then use AVX2 kernels
only: bf16 is emulated, and rlep.py measures float32 as the faster).

Model FLOPs of a training step: 6 x (decoder matmul weights x trained_tokens + LM head weights x
trained_response_tokens), forward and backward of the update passes (metrics.jsonl counts the rows'
real tokens; a shared prompt counts once); attention's own FLOPs and the π_θold passes of later
mini-batches are not counted (the cpu preset's second mini-batch has one: half the step's forward).
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
sys.path.insert(0, repo)


def cpu_line() -> str:
    info = open("/proc/cpuinfo").read() if os.path.isfile("/proc/cpuinfo") else ""
    lines = info.splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")
    isa = [f for f in wanted if f in flags]
    described = f"{model}, {os.cpu_count()} cores, flags: {' '.join(isa)}"
    emulated = os.environ.get("ATEN_CPU_CAPABILITY") or os.environ.get("ONEDNN_MAX_CPU_ISA")
    if emulated:
        described += f" (kernels limited to {emulated} by the environment)"
    return described


def model_weights(cfg: dict) -> tuple[int, int]:
    """(matmul weights of the decoder layers, LM head weights) of the run's model."""
    from machinery import hub
    from transformers import AutoConfig
    path = hub.model_folder(cfg["model_path"], os.path.join(repo, cfg["cache_dir"]), False)
    if not os.path.isdir(path):
        path = hub.model_folder(cfg["model_path"], cfg["cache_dir"], False)
    c = AutoConfig.from_pretrained(path)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    attention = c.hidden_size * head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    mlp = 3 * c.hidden_size * c.intermediate_size
    return c.num_hidden_layers * (attention + mlp), c.vocab_size * c.hidden_size


def summarize(out_dir: str):
    cfg = json.load(open(os.path.join(out_dir, "config.json")))
    timings_path = os.path.join(out_dir, "timings.json")
    timings = json.load(open(timings_path)) if os.path.isfile(timings_path) else {}
    measured = timings.get("linear_gflops", {})
    print(f"run: {out_dir} | preset {cfg['preset']} | dtype {cfg['dtype']} | "
          f"{cfg['prompts_per_step']} prompts x {cfg['n']} samples per step")
    if measured:
        shown = ", ".join(f"{k} {v:.0f}" for k, v in measured.items())
        print(f"linear layer (the model's MLP shape, forward + backward) measured by rlep.py at "
              f"start, GFLOP/s: {shown}")
    decoder, head = model_weights(cfg)
    for part in ("phase1", "phase2"):
        path = os.path.join(out_dir, part, "metrics.jsonl")
        if not os.path.isfile(path):
            continue
        rows = [r for r in map(json.loads, open(path)) if r["step"] > 0]
        if not rows:
            continue
        names = ("t_generation", "t_scoring", "t_training", "t_push")
        t = {name: np.array([r.get(name, 0.0) for r in rows]) for name in names}
        fresh = cfg["prompts_per_step"] * cfg["n"]
        # fresh response tokens generated
        generated = np.array([r["response_len"] * fresh for r in rows])
        trained = np.array([r.get("trained_tokens", 0) for r in rows])
        flops = 6 * (decoder * trained
                     + head * np.array([r.get("trained_response_tokens", 0) for r in rows]))
        print(f"{part}: {len(rows)} steps")
        for r, tokens, step_flops in zip(rows, generated, flops):
            gflops = step_flops / r["t_training"] / 1e9
            cells = " | ".join(f"{k[2:]} {r.get(k, 0.0):.1f} s" for k in names)
            print(f"  step {r['step']}: {cells} | generation {tokens / r['t_generation']:.0f} "
                  f"tokens/s | training {r.get('trained_tokens', 0) / r['t_training']:.0f} "
                  f"tokens/s, {gflops:.0f} GFLOP/s")
        gflops = flops.sum() / t["t_training"].sum() / 1e9
        ratios = " | ".join(f"{gflops / v:.2f} of {k}'s" for k, v in measured.items())
        print("  mean: " + " | ".join(f"{k[2:]} {v.mean():.1f} s" for k, v in t.items())
              + f" | generation {generated.sum() / t['t_generation'].sum():.0f} response tokens/s"
              f" | training {trained.sum() / t['t_training'].sum():.0f} tokens/s, "
              f"{gflops:.0f} model GFLOP/s = {ratios} measured linear throughput")
    if timings:
        total = timings["total_s"]
        parts = " | ".join(f"{k} {v:.0f} s ({100 * v / total:.0f} %)"
                           for k, v in timings["parts_s"].items())
        print(f"time table ({timings_path}): {parts} | total {total:.0f} s")


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
