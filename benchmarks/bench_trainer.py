"""The first hour on a GPU: the trainer side of the gpu and node presets on one GPU, measured
against their estimates. It needs torch and transformers only (no vLLM, no network, nothing
downloaded): random weights of Qwen2.5-Math-1.5B's shapes (bench_train_step.build_policy, which
is rlep.build_policy with from_config), a step's groups of synthetic responses with the lengths
the time table assumes (prompts of 250 tokens on average, responses of 1,000, 5 % at L_max), and
rlep.ppo_update itself: the planner's micro-batches at the preset's --micro_batch_tokens, pi_old,
the loss, clip and AdamW, in bf16 under autocast as a run.

Per preset, one GPU's share of a training step: the gpu preset's whole step (64 prompts x 8, 8
updates, micro-batches of 16,384 tokens); the node preset's one rank's share (256 / 8 = 32
prompts x 8, 8 updates, micro-batches of 32,768 tokens; whole weights here, where a node rank
holds an FSDP2 shard). A warm-up step (AdamW's state, the kernels), then --steps timed ones.
Each preset prints its step time, tokens/s, MFU and peak memory beside the estimate:
bench_train_step's time table (training at 30 % MFU, the same count of FLOPs: (8 + 2 (k - 1) / k)
x P a token, k updates) and its budget for one process (the update phase, less the CUDA context
and vLLM asleep, which torch's allocator does not count). Generation is not measured (no vLLM).

    python benchmarks/bench_trainer.py                 # a GPU: both presets, ~5 minutes (est.)
    python benchmarks/bench_trainer.py --peak_tflops 790    # an H200's measured dense bf16
    OMP_NUM_THREADS=1 python benchmarks/bench_trainer.py --smoke   # CPU: tiny shapes, seconds

--smoke runs the same code on the CPU with bench_train_step's tiny shapes, a quarter of the
prompts, lengths and micro-batches a 32nd: it proves the script, not the estimates
(tests/test_benchmarks.py runs it)."""
import argparse
import gc
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from transformers import AutoModelForCausalLM  # noqa: E402

import bench_train_step as bench  # noqa: E402
from machinery import ranks  # noqa: E402
import rlep  # noqa: E402

gib = 2 ** 30
# a node rank's share of a step: the node's 8 GPUs
node_ranks = 8


def step_groups(cfg, prompts: int, vocab: int, scale: int, seed: int = 0) -> dict:
    """A step's groups, {position: n samples}: random tokens, prompts of 250 / scale tokens on
    average, responses of 1,000 / scale, 5 % of them at L_max (the time table's lengths), a
    random advantage each."""
    rng = np.random.default_rng(seed)
    prompt_mean, response_mean = 250 // scale, 1000 // scale
    longest = cfg.max_response_len
    # the others' mean, so that all average response_mean
    rest = int((response_mean - 0.05 * longest) / 0.95)
    groups = {}
    for position in range(prompts):
        prompt = rng.integers(1, vocab, int(rng.integers(prompt_mean // 2, 3 * prompt_mean // 2)))
        group = []
        for _ in range(cfg.n):
            length = int(rng.integers(rest // 8, 15 * rest // 8))
            if rng.random() < 0.05:
                length = longest
            group.append(rlep.Sample(prompt.tolist(), rng.integers(1, vocab, length).tolist(),
                                     False, 0.0, advantage=float(rng.standard_normal())))
        groups[position] = group
    return groups


def estimates(name, tokens, updates, peak_tflops):
    """The estimate's training seconds for `tokens` at 30 % MFU, and its update-phase GiB for one
    process at the preset's micro-batch (less the CUDA context and vLLM asleep)."""
    cfg = rlep.Config(**rlep.presets[name], preset=name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(bench.model_config("1.5b"), dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    flops = (8 + 2 * (updates - 1) / updates) * params * tokens
    seconds = flops / (0.30 * peak_tflops * 1e12)
    terms, info = bench.budget(model, 1, 79.6, cfg)
    update = bench.phases(terms, info, cfg.gpu_memory_utilization, cfg.micro_batch_tokens)[4]
    return seconds, update[2] - terms["ctx"][1] - terms["VS"][1]


def measure(name, args, device):
    """One GPU's share of a step of preset `name`, timed: a line of what it measured, one of
    the estimate."""
    cfg = rlep.Config(**rlep.presets[name], preset=name)
    share = node_ranks if name == "node" else 1
    prompts = cfg.prompts_per_step // share
    updates = cfg.prompts_per_step // cfg.mini_batch_prompts
    scale = 32 if args.smoke else 1
    if args.smoke:
        prompts //= 4
        cfg.max_prompt_len //= scale
        cfg.max_response_len //= scale
        cfg.micro_batch_tokens //= scale
    shapes = "tiny" if args.smoke else "1.5b"
    cfg.dtype = args.dtype
    if args.dtype == "auto":  # as rlep.py on a GPU; a CPU's smoke run in float32
        cfg.dtype = "bfloat16" if device.type == "cuda" else "float32"
    torch.manual_seed(0)
    policy, optimizer = bench.build_policy(shapes, cfg, device)
    params = sum(p.numel() for p in policy.parameters())
    vocab = policy.model.config.vocab_size
    d = ranks.Dist(False, 0, 1, device, True)
    sequences_per_update = prompts * cfg.n // updates
    times, peaks, tokens = [], [], 0
    for step in range(1 + args.steps):  # the first is the warm-up
        groups = step_groups(cfg, prompts, vocab, scale, seed=step)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        stats, _ = rlep.ppo_update(policy, optimizer, groups, sequences_per_update, cfg, d, 0,
                                   seed=step)
        if device.type == "cuda":
            torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_allocated() / gib)
        if step:
            times.append(time.perf_counter() - start)
            tokens = stats["trained_tokens"]
    seconds = float(np.median(times))
    flops = (8 + 2 * (updates - 1) / updates) * params * tokens
    mfu = f"{flops / seconds / (args.peak_tflops * 1e12):.1%}" if device.type == "cuda" else "-"
    peak = f"{max(peaks):.1f} GiB" if peaks else "- (CPU)"
    whose = "a node rank's share" if share > 1 else "the whole step"
    print(f"{name} preset, {whose} on one {device.type.upper()}: {prompts} prompts x {cfg.n}, "
          f"{updates} updates, micro-batches of {cfg.micro_batch_tokens:,} tokens, "
          f"{tokens:,} tokens a step, {params / 1e6:,.1f} M params, {cfg.dtype}")
    print(f"  measured: {seconds:.2f} s a step (median of {len(times)}), "
          f"{tokens / seconds:,.0f} tokens/s, MFU {mfu} (FLOPs counted as the estimate's), "
          f"peak {peak}")
    est_seconds, est_gib = estimates(name, tokens, updates, args.peak_tflops)
    print(f"  estimate: {est_seconds:.2f} s a step at MFU 30 % of {args.peak_tflops:g} TFLOP/s, "
          f"peak {est_gib:.1f} GiB (bench_train_step's update phase, one process, less the "
          "CUDA context and vLLM asleep)" + (" -- an H100's figures, not this CPU's"
                                              if args.smoke else ""))
    del policy, optimizer
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"seconds": seconds, "tokens": tokens, "estimate_s": est_seconds}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["gpu", "node"], choices=["gpu", "node"])
    parser.add_argument("--steps", type=int, default=2, help="timed steps after the warm-up")
    parser.add_argument("--smoke", action="store_true",
                        help="the CPU's check of the script: tiny shapes, seconds")
    parser.add_argument("--peak_tflops", type=float, default=989.0,
                        help="dense bf16 peak for MFU: an H100 SXM's 989 (its datasheet)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                        help="auto: bf16 on a GPU (as rlep.py), float32 on a CPU")
    args = parser.parse_args(argv)
    device = torch.device("cpu")
    if torch.cuda.is_available() and not args.smoke:
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
        print(f"device {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    return {name: measure(name, args, device) for name in args.presets}


if __name__ == "__main__":
    main()
