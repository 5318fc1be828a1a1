"""Benchmark the training side of rlep.py's paper preset on one accelerator: memory, tokens/s and MFU.

    python tests/bench_train_step.py --model 7b                        # on a GPU: micro-batches 1, 2 and 4
    python tests/bench_train_step.py --model 7b --budget_only          # the per-phase memory budget, no compute
    OMP_NUM_THREADS=1 python tests/bench_train_step.py --model tiny    # CPU smoke run, seconds

A randomly initialised Qwen2 model with the shape of Qwen2.5-Math-1.5B or -7B (configs written here, nothing
downloaded) is set up as rlep.train sets it up: fp32 master weights, train mode, gradient checkpointing
(use_reentrant=False), one rlep.TokenLogProbs(model, temperature) for the whole run, AdamW from
rlep.make_optimizer, autocast in Config.dtype (bf16) without its weight cache, on CPU too. No DDP wrapper, as in
rlep. For each micro-batch size the benchmark runs what one micro-batch goes through in rlep.ppo_update, stage by
stage: the old-log-prob pass (no_grad); a mini-batch of two forward + policy_loss + backward passes, the first
creating the gradients (they are None between mini-batches), the second accumulating into them; then gradient
clipping, the optimizer step and zero_grad(set_to_none=True). So the gradients exist once, and only during the
update, and the peaks include them.

One process stands in for one of the 8 ranks, with no process group: ZeRO-1 is emulated by giving AdamW only the
parameters that ZeroRedundancyOptimizer would give its most loaded rank (--zero1_ranks 8), so optimizer state and
step time are one rank's share. Not measured here: rlep's gradient all-reduce (one in-place all_reduce per
parameter, once per mini-batch, before clipping), ZeRO-1's parameter broadcast after the step, vLLM (its memory
is in --budget_only, as estimates and from gpu_memory_utilization).

Model FLOPs per sequence of S real tokens, R of them predicted response tokens (padding is not counted):
    forward = 2 * N_layers * S + 2 * V * H * R + 4 * n_layers * d_attn * S^2
N_layers: the matmul weights of the decoder layers; the LM head runs on response tokens only (TokenLogProbs);
attention is counted in full (not halved for causality), as Megatron and verl count it. Training (forward +
backward) is 3 x forward; the recomputation of gradient checkpointing is not counted (MFU, not HFU).
"MFU verl" counts as verl's flops_counter does: embedding and LM head as matmuls over all S tokens.
"""
import argparse
import os
import sys
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, repo_root)
import rlep  # noqa: E402

# Qwen2.5-Math shapes (their config.json files); tiny is for the CPU smoke run (head_dim 32, as vLLM needs)
model_shapes = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=2048, tie_word_embeddings=True),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}
gib = 2 ** 30


def build_model(name: str, device, attn_implementation: str):
    config = Qwen2Config(**model_shapes[name], max_position_embeddings=4096, rope_theta=10000.0,
                         rms_norm_eps=1e-6, use_cache=False)
    with torch.device(device):  # initialise on the device: a 7B model in fp32 is 30 GB of host memory otherwise
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attn_implementation)


def parameter_counts(model) -> dict:
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    attn_out = (config.num_attention_heads + 2 * config.num_key_value_heads + config.num_attention_heads) * head_dim
    per_layer = config.hidden_size * attn_out + 3 * config.hidden_size * config.intermediate_size  # q k v o, MLP
    embedding = config.vocab_size * config.hidden_size
    return {"total": sum(p.numel() for p in model.parameters()), "layer_matmuls": config.num_hidden_layers * per_layer,
            "embedding": embedding, "lm_head": 0 if config.tie_word_embeddings else embedding}


def forward_flops(config, seq_lens, response_lens, verl_count=False) -> float:
    """Model FLOPs of one forward pass over sequences with these real and predicted-response token counts."""
    head_dim = config.hidden_size // config.num_attention_heads
    attn_out = (2 * config.num_attention_heads + 2 * config.num_key_value_heads) * head_dim
    layer_matmuls = config.num_hidden_layers * (config.hidden_size * attn_out
                                                + 3 * config.hidden_size * config.intermediate_size)
    vocab_matmul = config.vocab_size * config.hidden_size
    attention = 4 * config.num_hidden_layers * config.num_attention_heads * head_dim * sum(s * s for s in seq_lens)
    if verl_count:  # verl: embedding + LM head as two matmuls over every token
        return 2 * (layer_matmuls + 2 * vocab_matmul) * sum(seq_lens) + attention
    return 2 * layer_matmuls * sum(seq_lens) + 2 * vocab_matmul * sum(response_lens) + attention


def zero1_share(model, ranks: int) -> list:
    """The parameters ZeroRedundancyOptimizer gives its most loaded rank: sorted by size, largest first, each
    to the rank with the fewest elements so far (torch's _partition_parameters)."""
    params = sorted(model.parameters(), key=lambda p: p.numel(), reverse=True)
    per_rank, sizes = [[] for _ in range(ranks)], [0] * ranks
    for p in params:
        rank = sizes.index(min(sizes))
        per_rank[rank].append(p)
        sizes[rank] += p.numel()
    return per_rank[sizes.index(max(sizes))]


def make_batch(micro_batch_size, prompt_len, response_len, vocab_size, device, seed=0) -> dict:
    """A micro-batch as rlep.collate builds it: the first row has the full prompt_len + response_len tokens (the
    shape that sets peak memory), the others random shorter prompts and responses, right-padded to the longest."""
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(micro_batch_size):
        p = prompt_len if i == 0 else int(rng.integers(prompt_len // 4, prompt_len + 1))
        c = response_len if i == 0 else int(rng.integers(response_len // 4, response_len + 1))
        samples.append(rlep.Sample(prompt_ids=rng.integers(1, vocab_size, p).tolist(),
                                   completion_ids=rng.integers(1, vocab_size, c).tolist(), text="", correct=False,
                                   reward=0.0, advantage=float(rng.standard_normal())))
    return rlep.collate(samples, pad_id=0, device=device)


def billions(n: int) -> str:
    return f"{n / 1e9:.3f} B" if n >= 1e8 else f"{n / 1e6:.3f} M"


def fmt(value, width: int, spec: str) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:{width}{spec}}"


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed_stage(device, fn):
    """(seconds, peak GiB allocated during the stage or None on CPU) of fn()."""
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    fn()
    synchronize(device)
    seconds = time.perf_counter() - start
    return seconds, (torch.cuda.max_memory_allocated() / gib if device.type == "cuda" else None)


def allocated_gib(device):
    return torch.cuda.memory_allocated() / gib if device.type == "cuda" else None


def train_step(policy, optimizer, batch, cfg, autocast):
    """One micro-batch through every stage of rlep.ppo_update: {stage: (seconds, peak GiB)}. The update is a
    mini-batch of two copies of the micro-batch: the first backward creates the gradients, the second adds to them."""
    device = batch["input_ids"].device
    mask = batch["completion_mask"][:, 1:]
    num_tokens = 2 * mask.sum().item()  # N: the response tokens of the whole (two micro-batch) mini-batch

    def old_logprobs():
        with torch.no_grad(), autocast:
            batch["old_logprobs"] = policy(batch["input_ids"], batch["attention_mask"], batch["completion_mask"])

    def forward_backward():
        with autocast:
            logprobs = policy(batch["input_ids"], batch["attention_mask"], batch["completion_mask"])
            loss, metrics = rlep.policy_loss(logprobs, batch["old_logprobs"], batch["advantages"], mask,
                                             cfg.clip_low, cfg.clip_high, cfg.clip_c, num_tokens=num_tokens)
            loss.backward()
        # same weights, same micro-batch: ppo_update relies on the two passes agreeing (first ratio exactly 1)
        if abs(metrics["ratio_mean"] - 1) > 1e-3:
            print(f"warning: old-logp and update passes disagree, ratio_mean {metrics['ratio_mean']:.5f}")

    def optimizer_step():  # rlep all-reduces the gradients here first: not measured (one rank)
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip).item()
        assert np.isfinite(grad_norm), f"gradient norm {grad_norm}"
        optimizer.step()
        policy.zero_grad(set_to_none=True)  # all grads, as ZeroRedundancyOptimizer.zero_grad (AdamW has a share)

    assert all(p.grad is None for p in policy.parameters()), "a mini-batch starts without gradients, as in rlep"
    return {"old-logp": timed_stage(device, old_logprobs),
            "fwd+bwd 1st": timed_stage(device, forward_backward),
            "fwd+bwd": timed_stage(device, forward_backward),
            "clip+step": timed_stage(device, optimizer_step)}


def print_budget(model, counts, shard_params, ranks, gpu_gib):
    """The per-GPU memory of each phase of a training step of rlep.py as written (no DDP: the gradients exist once,
    from a mini-batch's first backward to its zero_grad), from the model's shapes; the activation and overhead
    figures are estimates (est.), which the GPU run of this script measures."""
    cfg, config = rlep.Config(), model.config
    weights, grads, moments = 4 * counts["total"] / gib, 4 * counts["total"] / gib, 8 * shard_params / gib
    adamw_temporaries = moments / 2  # est.: foreach AdamW's sqrt(exp_avg_sq), one fp32 copy of the shard
    vllm_awake, vllm_weights = cfg.gpu_memory_utilization * gpu_gib, 2 * counts["total"] / gib
    context, vllm_asleep = 1.5, 1.5  # est.: CUDA context + NCCL; what vLLM keeps asleep (CUDA graphs, buffers)
    chunk = 1024 * config.vocab_size * 4 / gib  # one LM-head chunk of fp32 logits
    head_working_set = 4 * chunk  # est.: logits, / T, log_softmax, and their gradient at once
    seq_len = cfg.max_prompt_len + cfg.max_response_len
    saved_inputs = 4 * config.hidden_size * config.num_hidden_layers * seq_len / gib  # fp32 residual per layer
    layer_working_set = (32 * config.hidden_size + 12 * config.intermediate_size) * seq_len / gib  # est.

    def activations(micro_batch_size):  # est., rows padded to the full length
        return micro_batch_size * (saved_inputs + layer_working_set) + head_working_set

    print(f"per-GPU budget, {billions(counts['total'])} params, {ranks} ranks, {gpu_gib:.1f} GiB card, "
          f"sequences of {seq_len} tokens; GiB; est. = estimate, the rest is computed from the shapes")
    items = [("fp32 master weights", weights),
             ("fp32 grads, one copy: from a mini-batch's first backward to its zero_grad(set_to_none)", grads),
             (f"AdamW moments, ZeRO-1 share of the most loaded of {ranks} ranks", moments),
             ("AdamW temporaries in the step: one fp32 copy of that share (est.)", adamw_temporaries),
             (f"vLLM awake: {cfg.gpu_memory_utilization} x {gpu_gib:.1f} (bf16 weights {vllm_weights:.1f}, "
              f"KV cache + workspace {vllm_awake - vllm_weights:.1f})", vllm_awake),
             ("vLLM asleep (level 2) (est.)", vllm_asleep), ("CUDA context + NCCL (est.)", context),
             (f"LM-head chunk: 1024 tokens x {config.vocab_size} fp32 = {chunk:.2f}, x 4 working set (est.)",
              head_working_set),
             (f"activations per {seq_len}-token row: fp32 layer inputs {saved_inputs:.2f} + one layer's "
              f"recompute {layer_working_set:.2f} (est.)", saved_inputs + layer_working_set)]
    for name, size in items:
        print(f"  {name:100s} {size:6.1f}")
    trainer = weights + moments + context  # always there; grads are None outside the update
    asleep = trainer + vllm_asleep
    phases = [("generation + weight push: weights + moments + ctx + vLLM awake (grads None)", trainer + vllm_awake),
              (f"old-logp pass, mbs {cfg.micro_batch_size}: weights + moments + ctx + asleep + head + mbs x one "
               f"layer (est.)", asleep + head_working_set + cfg.micro_batch_size * layer_working_set)]
    for micro_batch_size in (1, 2, 4):
        default = " (rlep's)" if micro_batch_size == cfg.micro_batch_size else ""
        phases.append((f"update fwd+bwd, mbs {micro_batch_size}{default}: weights + grads + moments + ctx + asleep "
                       f"+ act. (est.)", asleep + grads + activations(micro_batch_size)))
    phases += [("gradient all-reduce (in place): weights + grads + moments + ctx + asleep", asleep + grads),
               ("clip + optimizer step: weights + grads + moments + ctx + asleep + AdamW temporaries (est.)",
                asleep + grads + adamw_temporaries)]
    print(f"per phase (fits if at most {gpu_gib:.1f}):")
    for name, size in phases:
        print(f"  {name:100s} {size:6.1f}  {'fits' if size <= gpu_gib else 'DOES NOT FIT'}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(model_shapes), default="7b")
    parser.add_argument("--micro_batch_sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--prompt_len", type=int, default=None, help="default 1024 (the paper's); tiny: 128")
    parser.add_argument("--response_len", type=int, default=None, help="default 3072 (the paper's); tiny: 384")
    parser.add_argument("--steps", type=int, default=3, help="timed repetitions per micro-batch size (after a warm-up)")
    parser.add_argument("--device", default="auto", help="auto, cuda or cpu")
    parser.add_argument("--dtype", default=rlep.Config.dtype, help="autocast dtype, as rlep's --dtype; float32: off")
    parser.add_argument("--peak_tflops", type=float, default=None,
                        help="the chip's dense bf16 peak; default 989 (H100/H200 SXM) on CUDA, none on CPU")
    parser.add_argument("--zero1_ranks", type=int, default=8, help="emulate one rank of ZeRO-1 over this many")
    parser.add_argument("--sequences_per_update", type=int, default=None,
                        help="sequences per rank per optimizer step (default: the paper's 64 x 16 / 8 = 128)")
    parser.add_argument("--autocast_cache", action=argparse.BooleanOptionalAction, default=False,
                        help="autocast's cache of bf16 weight copies (off in rlep.ppo_update: 13 GiB for 7B)")
    parser.add_argument("--attn_implementation", default="sdpa")
    parser.add_argument("--gpu_gib", type=float, default=79.6, help="usable memory of the budget's GPU (H100 80 GB)")
    parser.add_argument("--budget_only", action="store_true", help="print the per-phase budget (meta device), stop")
    args = parser.parse_args(argv)

    cfg = rlep.Config()  # the paper's hyperparameters: lengths, clip range, grad clip, lr, weight decay
    scale = 8 if args.model == "tiny" else 1  # the CPU smoke run keeps attention's S^2 small
    prompt_len = args.prompt_len or cfg.max_prompt_len // scale
    response_len = args.response_len or cfg.max_response_len // scale
    sequences_per_update = args.sequences_per_update or cfg.mini_batch_prompts * cfg.n // args.zero1_ranks
    if args.budget_only:
        model = build_model(args.model, "meta", args.attn_implementation)
        shard_params = sum(p.numel() for p in zero1_share(model, args.zero1_ranks))
        print_budget(model, parameter_counts(model), shard_params, args.zero1_ranks, args.gpu_gib)
        return
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    if device.type == "cuda":
        device = torch.device("cuda", device.index or 0)
        torch.cuda.set_device(device)
    peak_tflops = args.peak_tflops or (989.0 if device.type == "cuda" else None)
    autocast = torch.autocast(device.type, dtype=getattr(torch, args.dtype), enabled=args.dtype != "float32",
                              cache_enabled=args.autocast_cache)  # as rlep.ppo_update

    torch.manual_seed(0)
    start = time.perf_counter()
    model = build_model(args.model, device, args.attn_implementation)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()  # as rlep.train: transformers checkpoints only in train mode
    policy = rlep.TokenLogProbs(model, cfg.temperature)  # as rlep.train: built once, no DDP wrapper
    shard = zero1_share(model, args.zero1_ranks)
    optimizer = rlep.make_optimizer(torch.nn.ParameterList(shard), cfg, rlep.Dist(False, 0, 1, device, True))
    synchronize(device)
    counts = parameter_counts(model)
    shard_params = sum(p.numel() for p in shard)
    print(f"model {args.model}: {billions(counts['total'])} params (layer matmuls {billions(counts['layer_matmuls'])}, "
          f"embedding {billions(counts['embedding'])}, untied LM head {billions(counts['lm_head'])})"
          f", built in {time.perf_counter() - start:.1f} s")
    precision = (f"{args.dtype} autocast (cache {'on' if args.autocast_cache else 'off'})"
                 if args.dtype != "float32" else "fp32")
    print(f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, {precision}, "
          f"gradient checkpointing {'on' if model.training and model.is_gradient_checkpointing else 'OFF'}, "
          f"no DDP (grads accumulate locally), attention {args.attn_implementation}, torch {torch.__version__}")
    print(f"AdamW on one ZeRO-1 rank of {args.zero1_ranks}: {billions(shard_params)} params "
          f"(moments {8 * shard_params / gib:.2f} GiB, created at the first step)")

    header = (f"{'mbs':>3} {'tokens real/padded':>18} {'stage':>12} {'time s':>8} {'tokens/s':>9} {'TFLOP/s':>8} "
              f"{'MFU %':>6} {'MFU verl %':>10} {'peak GiB':>9}")
    print(header)
    print("-" * len(header))
    memory_lines = []
    for micro_batch_size in args.micro_batch_sizes:
        batch = make_batch(micro_batch_size, prompt_len, response_len, model.config.vocab_size, device)
        seq_lens = batch["attention_mask"].sum(1).tolist()
        response_lens = batch["completion_mask"][:, 1:].sum(1).tolist()
        forward = forward_flops(model.config, seq_lens, response_lens)
        forward_verl = forward_flops(model.config, seq_lens, response_lens, verl_count=True)
        try:
            train_step(policy, optimizer, batch, cfg, autocast)  # warm-up; creates AdamW's moments
            runs = [train_step(policy, optimizer, batch, cfg, autocast) for _ in range(args.steps)]
        except torch.OutOfMemoryError:
            runs = None
            policy.zero_grad(set_to_none=True)
        if runs is None:
            print(f"{micro_batch_size:>3} out of memory")
            batch.clear()
            torch.cuda.empty_cache()
            continue
        if device.type == "cuda":
            memory_lines.append(f"mbs {micro_batch_size}: allocated {allocated_gib(device):.2f} GiB between steps "
                                f"(weights + moments; grads None)")
        stages = {name: (float(np.median([r[name][0] for r in runs])),
                         None if runs[0][name][1] is None else max(r[name][1] for r in runs)) for name in runs[0]}
        micro_batches = max(1, sequences_per_update // micro_batch_size)
        peaks = [peak for _, peak in stages.values()]
        update = (stages["fwd+bwd 1st"][0] + (micro_batches - 1) * stages["fwd+bwd"][0]
                  + stages["clip+step"][0]) / micro_batches
        step = (stages["old-logp"][0] + update, None if peaks[0] is None else max(peaks))
        rows = [("old-logp", stages["old-logp"], forward, None),
                ("fwd+bwd 1st", stages["fwd+bwd 1st"], 3 * forward, 3 * forward_verl),
                ("fwd+bwd", stages["fwd+bwd"], 3 * forward, 3 * forward_verl),
                ("clip+step", stages["clip+step"], None, None),
                (f"step/{micro_batches}", step, 4 * forward, 4 * forward_verl)]
        tokens = f"{sum(seq_lens)}/{batch['input_ids'].numel()}"
        for name, (seconds, peak), flops, flops_verl in rows:
            tflops = flops / seconds / 1e12 if flops else None
            mfu = 100 * tflops / peak_tflops if flops and peak_tflops else None
            mfu_verl = 100 * flops_verl / seconds / 1e12 / peak_tflops if flops_verl and peak_tflops else None
            print(f"{micro_batch_size:>3} {tokens:>18} {name:>12} {seconds:8.3f} "
                  f"{fmt(sum(seq_lens) / seconds if flops else None, 9, '.0f')} {fmt(tflops, 8, '.1f')} "
                  f"{fmt(mfu, 6, '.1f')} {fmt(mfu_verl, 10, '.1f')} {fmt(peak, 9, '.2f')}")
            tokens = ""
    print(f"fwd+bwd 1st: creates the grads (None between mini-batches); fwd+bwd: adds to them; clip+step: clip, "
          f"step, zero_grad(set_to_none), without rlep's all-reduce before it; step/K: old-logp + (fwd+bwd 1st + "
          f"(K - 1) fwd+bwd + clip+step) / K, K = {sequences_per_update} sequences per rank per update / mbs; "
          f"peak TFLOP/s {peak_tflops or 'n/a'}")
    for line in memory_lines:
        print(line)


if __name__ == "__main__":
    main()
