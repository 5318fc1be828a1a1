"""
RLEP, Reinforcement Learning with Experience Replay for LLM Reasoning (arXiv 2507.07451).

Phase one trains a GRPO/DAPO baseline from the base model, then samples many answers per
training prompt from one of its checkpoints and keeps the verified correct ones: the experience
pool. Phase two restarts from the base model; every prompt's group holds n fresh rollouts plus m
replayed successes from the pool, and the advantage is standardised over all n + m of them.
Replays give a learning signal on prompts the current policy cannot solve yet. `# RLEP:` tags
each line where the paper's method differs from DAPO (grep RLEP).

Run:
    python rlep.py                  # preset cpu: SmolLM2-135M on arithmetic, CPU only
    python rlep.py --preset tiny    # a tiny Qwen2 taught the answer format, a minute (the tests')
    python rlep.py --preset gpu     # one 80 GB GPU, 1.5B, an afternoon (docs/gpu.md)
    torchrun --standalone --nproc_per_node=8 rlep.py --preset node    # one node, an evening
Every Config field is a flag (`--lr 2e-6`); `--phase 2 --pool FILE` runs one part;
`--resume` continues a run; README.md has the paper's 64-GPU command (--preset paper).

Symbols: B prompts a step, each a group of n fresh rollouts + m replays, G = n + m; T the
temperature; N a mini-batch's response tokens on all ranks; W ranks; shapes: S samples, L a
length, R a micro-batch's rows.

Deviations from the paper (and its verl code):
1. torchrun and FSDP2 (weights, gradients, AdamW state sharded) with one in-process vLLM engine
   per rank, not Ray; a bf16 run gathers bf16 weights, as verl's default.
2. The loss is the exact token mean over each mini-batch; verl's per-micro-batch mean weighs
   long responses less.
3. The collection code was never published: ours keeps prompts with >= `min_successes` verified
   answers of K.
4. The tiny and cpu presets grade with verify.py's equivalence checker; the node and paper
   presets with the paper's rule.
5. A prompt with fewer than m pooled answers replays all it has; verl pads with empty responses
   scored -1.
6. Training prompts are de-duplicated and shuffled per epoch; the paper's file repeats each one
   ~100 times.
7. Mini-batches are runs of the step's shuffled prompts, whole groups, their rows dealt to the
   ranks by tokens; verl's are ranges of a token-balanced order.
8. A pool given with --pool replays only the answers the run's rule verifies; the authors' code
   replays every candidate, re-scored.
9. An update no longer finite stops the run before a push or save; verl skips it and goes on.
Controls the paper lacks, tagged `# control:`, off by default (docs/studies.md):
`--phase1_prompts pool`, `--phase2_prompts all`, `--replay_loss nll`, `--equal_updates`,
`--dynamic_sampling` (DAPO's, as verl's filter_groups: at --max_gen_rounds, where verl stops the
run, the step is filled with dropped groups).
"""
import os

if __name__ == "__main__":
    # Ctrl-C and SIGTERM from the first line: the imports below take seconds
    from machinery import interrupts
    interrupts.catch_stops()

# The engine lives in this process: a push passes tensors by reference.
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
# GiB; left unset, vLLM-CPU reserves 90 % of the RAM.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# Quiet by default: VLLM_LOGGING_LEVEL=INFO shows vLLM's log.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import argparse
import collections
import contextlib
import gc
import hashlib
import importlib.util
import math
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from tqdm import tqdm

import verify
# the support beside the method, a module each (machinery/): a call names where it goes
from machinery import (RunStopped, UserError, checkpoints, data, files, fsdp, hub, interrupts,
                       metrics, planner, preflight, ranks, report, vllm_engine)


# ---------------------------------------------------------------------------
# Config: the defaults are the paper's run (docs/paper.md); the default preset: cpu

dapo_template = (
    "Solve the following math problem step by step. The last line of your response should "
    "be of the form Answer: $Answer (without quotes) where $Answer is the answer to the "
    "problem.\n\n{problem}\n\nRemember to put your answer on its own line after \"Answer:\".")

# The paper's data on the hub (hf://datasets/ORG/NAME/PATH, huggingface_hub's convention): fetched
# once into its cache (hub.local_file)
dapo_train = "hf://datasets/BytedTsinghua-SIA/DAPO-Math-17k/data/dapo-math-17k.parquet"
rlep_val = "hf://datasets/Kwai-Klear/RLEP_dataset/dapo_format_aime2024_aime2025_amc2023.parquet"


@dataclass
class Config:
    # --- data and model
    model_path: str = "Qwen/Qwen2.5-Math-7B"  # π_θ0, where both phases start: a folder or hub name
    train_file: str = dapo_train  # D: DAPO parquet, {problem, answer} .jsonl; local or hf://
    train_prompts: int = 0  # a fixed subset of D: this many prompts, by their ids' hash; 0: all
    val_file: str = rlep_val  # as D: AIME-2024, AIME-2025, AMC-2023; avg@k per data source
    prompt_template: str = dapo_template  # for plain {"problem", "answer"} rows
    out_dir: str = "runs/paper"  # config, a folder per part, checkpoints, metrics

    # --- rollouts
    prompts_per_step: int = 512  # B, prompts per training step
    n: int = 16  # n, fresh rollouts per prompt
    temperature: float = 1.0  # T; the trainer's log-probs use logits / T
    top_p: float = 1.0  # the rollouts' nucleus
    max_prompt_len: int = 1024  # longer prompts are cut from the left
    max_response_len: int = 3072  # L_max, response tokens, the final EOS included
    stop_token: str = ""  # "": responses end at EOS, as the authors'; else here too
    overlong_buffer: int = 512  # L_cache, DAPO's soft overlong window
    overlong_factor: float = 1.0  # the overlong penalty at L_max
    dynamic_sampling: bool = False  # control: drop groups all right or all wrong, refill to B
    max_gen_rounds: int = 10  # control: rounds a step at most; then dropped groups fill it

    # --- optimisation
    lr: float = 1e-6  # η, AdamW's learning rate
    weight_decay: float = 0.1  # λ, AdamW's weight decay
    warmup_steps: int = 10  # linear warm-up, in training steps
    grad_clip: float = 1.0  # the global gradient-norm clip
    mini_batch_prompts: int = 64  # an optimizer step: this x n sequences
    epochs: int = 1  # PPO epochs over each step's batch
    clip_low: float = 0.2  # ε_low: the ratio clipped below at 1 - this
    clip_high: float = 0.28  # ε_high: above at 1 + this (DAPO's clip-higher)
    clip_c: float = 10.0  # c: where Â < 0, the token loss is at most -c Â
    micro_batch_size: int = 8  # sequences per forward (memory, not math)
    micro_batch_tokens: int = 16384  # padded tokens a forward, longest first; 0: by the size
    share_prompts: bool = False  # a prompt once per row, then its responses

    # --- phase one: the baseline, then the experience collection
    phase1_steps: int = 400  # training steps of phase one
    phase1_prompts: str = "all"  # {all, pool}: control "pool": the baseline on the pool's prompts
    collect_step: int = 400  # RLEP: the phase-one checkpoint that builds the pool
    collect_k: int = 64  # RLEP: K, samples per prompt in the collection
    collect_temperature: float = 0.7  # RLEP: the collection's T
    collect_top_p: float = 0.95  # RLEP: the collection's nucleus
    min_successes: int = 2  # RLEP: verified answers a pooled prompt needs
    collect_chunk: int = 4096  # the collection's sequences a rank a generate call; 0: B prompts

    # --- phase two: replay
    phase2_steps: int = 400  # RLEP: training steps of phase two
    replay_m: int = 2  # RLEP: m, replayed successes per group of n
    equal_updates: bool = False  # control: mini-batches count n + m
    phase2_prompts: str = "pool"  # {pool, all}: RLEP: the pool's prompts; control: all
    replay_loss: str = "group"  # {group, nll}: RLEP: replays get the group's Â; control: imitated
    replay_coef: float = 1.0  # control: "nll" weighs a replay token as one with Â = 1
    pool: str = ""  # RLEP: phase two from this pool (pool.jsonl, or a DAPO parquet with candidates)

    # --- evaluation
    val_every: int = 5  # validate every this many steps (and at 0); 0: never
    val_k: int = 32  # samples per validation problem (avg@k)
    verify_mode: str = "dapo"  # {dapo, equivalence}: the paper's rule, or verify.py's

    # --- system
    phase: str = "all"  # {all, 1, collect, 2}: the parts to run
    resume: bool = False  # continue the run in out_dir
    override: bool = False  # --resume with changed values: take them (config.json records it)
    seed: int = 1  # every random draw derives from it: see seed_for
    dtype: str = "auto"  # {auto, float32, bfloat16}: auto: GPU bf16, CPU measured
    gradient_checkpointing: bool = True  # memory for compute
    gpu_memory_utilization: float = 0.55  # vLLM's share (docs/gpu.md: Memory budget)
    timeout_minutes: int = 180  # a collective waits this long for a slow rank
    save_every: int = 20  # checkpoint every this many steps, at a part's end and at collect_step
    keep_checkpoints: int = 2  # this many newest of a part (+ collect_step's); 0: all
    log_samples: int = 2  # completions per step in samples.jsonl
    progress: bool = True  # tqdm bars on rank 0 for long generation
    cache_dir: str = ".cache/rlep"  # where built-in models are made
    preset: str = "cpu"  # {paper, node, gpu, tiny, cpu, cpu-hard}: applied before the other flags
    wandb_project: str = ""  # live curves in this W&B project (pip install wandb); "": off

presets = {
    "paper": {},
    # One node of 8 x 80 GB GPUs, phase one, the collection and phase two in an evening
    # (docs/gpu.md: the node preset, its time and memory estimated): Qwen2.5-Math-1.5B, whose
    # context is the 7B's 4,096 tokens, on the paper's data and lengths. The paper's ratios at
    # half its prompts a step: m : n = 1 : 8, 8 updates a step (9 with replays); K = 16 of 64.
    "node": dict(
        model_path="Qwen/Qwen2.5-Math-1.5B", out_dir="runs/node", prompts_per_step=256, n=8,
        replay_m=1, mini_batch_prompts=32, micro_batch_tokens=32768, phase1_steps=150,
        collect_step=150, collect_k=16, phase2_steps=150, val_every=10, val_k=16,
        gpu_memory_utilization=0.65),
    # A tiny random Qwen2, given seconds of supervised warm-up, on 1-digit sums.
    "tiny": dict(
        model_path="builtin:tiny", train_file="builtin:tiny:train",
        val_file="builtin:tiny:val", prompt_template="{problem}", out_dir="runs/tiny",
        prompts_per_step=8, n=8, max_prompt_len=32, max_response_len=16,
        overlong_buffer=4, lr=3e-4, warmup_steps=0, mini_batch_prompts=4,
        micro_batch_size=16, micro_batch_tokens=0, share_prompts=True, phase1_steps=4,
        collect_step=4, collect_k=16, collect_chunk=0, phase2_steps=4, val_every=2, val_k=4,
        verify_mode="equivalence", dtype="float32", save_every=2, log_samples=1,
        progress=False),
    # SmolLM2-135M-Instruct (PyPI, GGUF) on arithmetic; two updates a step.
    "cpu": dict(
        model_path="builtin:smollm2", train_file="builtin:arith:train",
        val_file="builtin:arith:val", out_dir="runs/cpu", prompts_per_step=8, n=8,
        max_prompt_len=160, max_response_len=48, overlong_buffer=16, lr=1e-5,
        warmup_steps=0, mini_batch_prompts=4, micro_batch_size=40, micro_batch_tokens=0,
        share_prompts=True, phase1_steps=6, collect_step=6, collect_k=8, collect_chunk=0,
        phase2_steps=6, val_every=3, val_k=4, verify_mode="equivalence",
        gradient_checkpointing=False, save_every=6, progress=False),
}
# gpu: one 80 GB GPU, no torchrun, the three parts in an afternoon (docs/gpu.md: the gpu preset):
# the node preset at a quarter of its prompts a step and 80 steps a phase, on a fixed 2,560 of
# DAPO-Math-17k's prompts (two passes in phase one, as the node's 2.1), micro-batches of the
# default 16,384 tokens. The paper's ratios: m : n = 1 : 8, 8 updates a step (9 with replays);
# K = 16 of 64.
presets["gpu"] = dict(
    presets["node"], out_dir="runs/gpu", train_prompts=2560, prompts_per_step=64,
    mini_batch_prompts=8, micro_batch_tokens=16384, phase1_steps=80, collect_step=80,
    phase2_steps=80, val_k=8, gpu_memory_utilization=0.5)
# cpu-hard: the cpu preset where replays can rescue (docs/studies.md), with the paper's K = 64
presets["cpu-hard"] = dict(
    presets["cpu"], train_file="builtin:arith-mix:train", val_file="builtin:arith-mix:val",
    out_dir="runs/cpu-hard", collect_k=64)


def parse_config(argv=None) -> Config:
    """Config defaults <- preset <- command line; booleans also take `--no-flag`."""
    parser = argparse.ArgumentParser(
        description="RLEP, GRPO with experience replay. A flag's default is the paper's, "
        "unless --preset (cpu when not given) sets it.", argument_default=argparse.SUPPRESS)
    # one line, not argparse's usage of every flag
    parser.error = lambda message: parser.exit(2, f"rlep.py: {message} (see --help)\n")
    # one source: a field's comment is its --help (and "{a, b}: " its choices)
    for name, flag in preflight.dataclass_flags(Config):
        parser.add_argument(f"--{name}", **flag)
    args = vars(parser.parse_args(argv))
    if "preset" not in args and torch.cuda.is_available():
        # the default, cpu, is SmolLM2 on arithmetic: not what a GPU is for
        parser.error("on GPUs, choose: --preset gpu (one 80 GB GPU), --preset node (one node of "
                     "8) or --preset paper (the paper's 64, Qwen2.5-Math-7B); their time and "
                     "memory: docs/gpu.md")
    cfg = Config(**{**presets[args.get("preset", Config.preset)], **args})
    if cfg.share_prompts and cfg.micro_batch_tokens:
        # a shared row holds a whole group: it cannot be split by length
        parser.error("--share_prompts needs --micro_batch_tokens 0")
    if cfg.wandb_project and importlib.util.find_spec("wandb") is None:
        parser.error("--wandb_project: wandb is not installed (pip install wandb)")
    # a GPU image may lack them (benchmarks/bench_trainer.py needs none of them)
    for name in ("vllm", "pydantic", "latex2sympy2_extended"):
        if importlib.util.find_spec(name) is None:
            raise UserError(f"{name} is not installed: pip install -r requirements.txt (on a "
                            "CPU, requirements-cpu.txt)")
    return cfg


# ---------------------------------------------------------------------------
# Seeds and clocks

def seed_for(*keys) -> int:
    """A stable 31-bit seed. Every random draw is a function of (seed, step, ...): a resumed run
    draws the same."""
    digest = hashlib.sha256(repr(keys).encode()).digest()
    return int.from_bytes(digest[:4], "little") >> 1

class RunState:
    """What one main keeps across its parts, made by __main__ (or by main when given none; a
    second main in the process starts afresh)."""

    def __init__(self):
        # where the run is, for the line a stop prints: __main__ prints it after main has raised
        self.stage = "start-up"
        self.spent = collections.Counter()  # seconds per activity: the time table at the end
        # base model -> its validation at step 0: phase one and phase two share it
        self.base_scores = {}


@contextlib.contextmanager
def clock(activity: str, times: dict):
    """Adds the block's seconds to times[activity] (a step's generation rounds add up)."""
    start = time.perf_counter()
    yield
    times[activity] = times.get(activity, 0.0) + time.perf_counter() - start


# ---------------------------------------------------------------------------
# Data: rows {"id", "problem", "answer" [, "prompt" (chat), "responses" (a pool's)]}, read once in
# main by machinery/data.py and checked by preflight.py; here they become prompts, a step at a
# time. The reading's rules, each a number the method sees:
# - rows are de-duplicated by problem, the first kept, in file order (deviation 6);
# - a row without an id gets sha1(problem)'s first 12 hex digits: the id seeds every draw for its
#   prompt (seed_for) and names its answers in the pool;
# - a gold answer is read as text, a whole float as an integer (3.0: "3"), as verify.py reads it;
# - a DAPO row's prompt is the file's chat messages, not --template (prompt_text);
# - a pool given with --pool keeps its rows with answers (a DAPO row without candidates is left
#   out, counted in a line), then only the answers the run's rule verifies (verified_pool).

def prompt_text(tokenizer, row: dict, template: str) -> str:
    """The row's chat prompt, generation prompt included."""
    user = {"role": "user", "content": template.format(problem=row["problem"])}
    messages = row.get("prompt") or [user]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def render_prompt(tokenizer, row: dict, template: str, max_len: int) -> list[int]:
    """The row's chat prompt as token ids, cut from the left to max_len tokens."""
    text = prompt_text(tokenizer, row, template)
    return tokenizer(text, add_special_tokens=False)["input_ids"][-max_len:]


def end_token_id(tokenizer, stop_token: str) -> int:
    """The token that ends a response, fresh or replayed: EOS (the authors pass no stop tokens)
    or `stop_token`."""
    if not stop_token:
        return tokenizer.eos_token_id
    token_id = tokenizer.convert_tokens_to_ids(stop_token)
    if not isinstance(token_id, int) or token_id == tokenizer.unk_token_id:
        raise UserError(f"--stop_token {stop_token!r}: not a single token of "
                               f"{tokenizer.name_or_path}")
    return token_id


def training_prompts(rows: list[dict], count: int) -> list[dict]:
    """The training rows the method sees: all of D (count 0, the paper's), or a fixed subset of
    `count` prompts, those whose ids hash lowest, in file order: the same for every --seed and any
    order of the file, a smaller subset inside a larger. Phase one, the collection and
    --phase2_prompts all read it."""
    if not count or not rows:  # phase two on a pool reads no training rows
        return rows
    if count > len(rows):
        raise UserError(f"--train_prompts {count}: the training file holds {len(rows)} prompts")
    def rank(row):
        return hashlib.sha256(f"train_prompts:{row['id']}".encode()).digest()
    kept = {row["id"] for row in sorted(rows, key=rank)[:count]}
    return [row for row in rows if row["id"] in kept]


def step_prompts(num_rows: int, prompts_per_step: int, step: int, seed: int) -> list[int]:
    """Row indices of a training step: each epoch visits every row once, in its own random order."""
    steps_per_epoch = num_rows // prompts_per_step
    epoch = step // steps_per_epoch
    start = (step % steps_per_epoch) * prompts_per_step
    order = np.random.default_rng(seed_for(seed, "epoch", epoch)).permutation(num_rows)
    return order[start:start + prompts_per_step].tolist()


# ---------------------------------------------------------------------------
# Rollouts: one vLLM engine per rank, in this process, sharing the device with the trainer

def build_engine(cfg: Config, model_path: str, d: ranks.Dist) -> vllm_engine.Engine:
    """The rank's vLLM engine (machinery/vllm_engine.py), sized for the run's prompts and
    responses."""
    return vllm_engine.start(model_path, d, cfg.dtype, cfg.seed,
                             max_model_len=cfg.max_prompt_len + cfg.max_response_len,
                             gpu_memory_utilization=cfg.gpu_memory_utilization)


# The long argument lists here and in make_groups are kept: each is a value the caller holds by
# name; a context object would hide what a function reads.
def sample_and_grade(engine: vllm_engine.Engine, tokenizer, rows: list[dict], num_samples: int,
                     cfg: Config, stop_ids: list[int], d: ranks.Dist, seed_key: tuple,
                     temperature: float = None, top_p: float = None, progress: bool = False,
                     keep=None) -> list[dict]:
    """num_samples graded responses per row, the rows sharded over ranks (validation, eval.py, the
    collection). Rank 0, which writes them, gets every record (or what keep(record) keeps) in row
    order; the other ranks get []."""
    my_rows = rows[d.rank::d.world_size]
    temperature = cfg.temperature if temperature is None else temperature
    top_p = cfg.top_p if top_p is None else top_p
    prompts = [render_prompt(tokenizer, row, cfg.prompt_template, cfg.max_prompt_len)
               for row in my_rows]
    seeds = [seed_for(*seed_key, row["id"]) for row in my_rows]
    completions = []
    if my_rows:
        completions = engine.generate(prompts, num_samples, temperature, top_p,
                                      cfg.max_response_len, stop_ids, seeds,
                                      progress=progress and d.master_process)
    records = []
    for row, group in zip(my_rows, completions):
        texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in group]
        correct = [verify.verify(t, row["answer"], mode=cfg.verify_mode) for t in texts]
        record = {"id": row["id"], "problem": row["problem"], "gold": row["answer"],
                  "responses": texts, "lengths": [len(c.token_ids) for c in group],
                  "answers": [verify.extract_answer(t) for t in texts], "correct": correct}
        records.append(keep(record) if keep else record)
    order = {row["id"]: j for j, row in enumerate(rows)}
    return sorted(ranks.gather_to_rank0(records, d), key=lambda r: order[r["id"]])


# ---------------------------------------------------------------------------
# Rewards, replay and advantages: DAPO's reward with its soft overlong punishment, RLEP's replayed
# successes, GRPO's group standardisation. The pool's file: machinery/data.py.

@dataclass
class Sample:
    prompt_ids: list[int]
    completion_ids: list[int]
    correct: bool
    reward: float
    replay: bool = False
    advantage: float = 0.0
    vllm_logprobs: list = None  # vLLM's log-prob of each sampled token (fresh samples)
    old_logprobs: torch.Tensor = None  # (L_i,) log π_θold, kept by the update
    row_id: str = ""  # the data row the prompt came from


def overlong_penalty(length: int, max_len: int, buffer_len: int, factor: float = 1.0) -> float:
    """0 up to max_len - buffer_len tokens, then linear down to -factor at max_len (DAPO Eq. 13)."""
    if buffer_len <= 0:
        return 0.0
    excess = max(0, length - (max_len - buffer_len))
    return -factor * min(1.0, excess / buffer_len)


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """Â_i = (R_i - mean(R)) / (std(R) + eps) within each group of `group_size` consecutive
    rewards, with the unbiased std (torch.std, as verl). R = [1, -1, -1, -1] gives
    [1.5, -0.5, -0.5, -0.5]; an all-equal group gives zeros (no signal). RLEP: 16 wrong fresh + 2
    right replays give -0.34 and +2.75."""
    groups = rewards.view(-1, group_size)  # (groups, G)
    mean = groups.mean(dim=1, keepdim=True)  # (groups, 1)
    # one answer has no spread: std 0 (torch.std's would be NaN)
    std = groups.std(dim=1, keepdim=True) if group_size > 1 else 0.0  # (groups, 1)
    return ((groups - mean) / (std + eps)).view(-1)  # (groups * G,)


def draw_replays(responses: list[str], m: int, rng: np.random.Generator) -> list[str]:
    """RLEP: m pooled successes, uniformly without replacement, drawn anew each time the prompt
    comes up."""
    if len(responses) <= m:  # RLEP: fewer than m: the authors' code takes them all
        return list(responses)
    picks = rng.choice(len(responses), size=m, replace=False)  # RLEP: without replacement
    return [responses[i] for i in picks]


def build_group(row: dict, prompt_ids: list[int], completions: list[vllm_engine.Completion],
                tokenizer, cfg: Config, end_id: int, replays: list[str] = ()) -> list[Sample]:
    """A prompt's group: n fresh rollouts, then (phase two) the replayed successes. Each gets
    R = ±1 (verify.py) + the overlong penalty (its length counts the end token); advantages are
    standardised over the whole group."""
    candidates = [(ids, logprobs, False) for ids, logprobs in completions]
    for text in replays:
        # RLEP: re-tokenized, ended like fresh responses, cut to L_max
        ids = tokenizer.encode(text, add_special_tokens=False) + [end_id]  # RLEP
        candidates.append((ids[:cfg.max_response_len], None, True))  # RLEP
    group = []
    for ids, logprobs, replay in candidates:  # RLEP: n fresh and m replays, one reward
        text = tokenizer.decode(ids, skip_special_tokens=True)
        # the reward's rule, --verify_mode: the paper's (node, paper presets) or verify.py's
        # equivalence checker (the small presets: deviation 4)
        correct = verify.verify(text, row["answer"], mode=cfg.verify_mode)
        penalty = overlong_penalty(len(ids), cfg.max_response_len, cfg.overlong_buffer,
                                   cfg.overlong_factor)
        reward = (1.0 if correct else -1.0) + penalty
        group.append(Sample(prompt_ids, ids, correct, reward, replay, vllm_logprobs=logprobs,
                            row_id=row["id"]))
    # RLEP: Â standardised over the whole group, G = n + m
    scored = group  # RLEP
    if cfg.replay_loss == "nll":
        # control: over the n fresh alone; the replays are imitated, their Â 0
        scored = group[:len(completions)]  # control
    rewards = torch.tensor([s.reward for s in scored])  # (n + m,)
    advantages = group_advantages(rewards, len(scored))  # (n + m,)
    for sample, advantage in zip(scored, advantages.tolist()):
        sample.advantage = advantage
    return group


# ---------------------------------------------------------------------------
# The loss: DAPO's objective (clip-higher, dual clip, token mean), no KL term

def policy_loss(logprobs, old_logprobs, advantages, mask, clip_low=0.2, clip_high=0.28,
                clip_c=10.0, num_tokens=None):
    """L(θ) = -1/N Σ_i Σ_t m_it · min(r_it Â_i, clip(r_it, 1 - ε_low, 1 + ε_high) Â_i),
    r_it = π_θ(o_it) / π_θold(o_it),

    with the dual clip: where Â_i < 0 the per-token loss is capped at -c·Â_i (huge ratios cannot
    blow it up). N is an argument (a micro-batch sees only part of the mini-batch); default:
    mask.sum(). logprobs, old_logprobs, mask: (S, L); advantages: (S,). Returns (loss, metrics);
    the metrics are 0-d tensors (no host sync)."""
    mask = mask.to(logprobs.dtype)  # (S, L) m_it, 1 on response tokens (EOS included)
    if num_tokens is None:
        num_tokens = mask.sum()  # N
    adv = advantages.unsqueeze(1)  # (S, 1) Â_i, shared by the tokens of response i
    # clamped as verl does, so that exp stays finite
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)  # (S, L) log r_it
    ratio = torch.exp(log_ratio)  # (S, L) r_it
    loss_unclipped = -adv * ratio  # (S, L) -r Â
    clipped_ratio = ratio.clamp(1 - clip_low, 1 + clip_high)  # (S, L) clip(r)
    loss_clipped = -adv * clipped_ratio  # (S, L) -clip(r) Â
    pessimistic = torch.maximum(loss_unclipped, loss_clipped)  # (S, L) PPO's bound
    dual_clipped = torch.minimum(pessimistic, -adv * clip_c)  # (S, L) capped at -c Â
    per_token_loss = torch.where(adv < 0, dual_clipped, pessimistic)  # (S, L)
    loss = (per_token_loss * mask).sum() / num_tokens  # scalar: the token mean
    with torch.no_grad():
        def token_mean(values):  # over this micro-batch's response tokens
            return (values.to(mask.dtype) * mask).sum() / mask.sum().clamp(min=1)
        metrics = {"clip_frac": token_mean(loss_clipped > loss_unclipped),
                   "dual_clip_frac": token_mean(per_token_loss < pessimistic),
                   "ratio_mean": token_mean(ratio),
                   "ratio_max": (ratio * mask).max()}
    return loss, metrics


def imitation_loss(logprobs, replay_mask, num_tokens):
    """The "nll" control (RAFT-style), a replay token weighed as one with Â = 1:
    L = -1/N Σ_i Σ_t m_it log π_θ(o_it), m on replays. logprobs, replay_mask: (S, L)."""
    return -(logprobs * replay_mask).sum() / num_tokens  # scalar


# ---------------------------------------------------------------------------
# The update: log π_θ at T of a micro-batch's response tokens, the mini-batches and their N, π_θold
# once, an optimizer step per mini-batch

class TokenLogProbs(torch.nn.Module):
    """log π_θ(o_t | q, o_<t) per response token, from logits / T as vLLM samples them, of a
    micro-batch from collate (below); the LM head runs on chunks of tokens (all logits at once:
    the largest tensor)."""

    def __init__(self, model, temperature: float, chunk_tokens: int = 1024):
        super().__init__()
        self.model = model
        self.temperature = temperature
        self.chunk_tokens = chunk_tokens

    def _chunk_logps(self, hidden, targets):  # (tokens, H), (tokens,) -> (tokens,)
        # h W / T as (h / T) W: a division of (tokens, H), not of (tokens, V)
        logits = self.model.lm_head(hidden / self.temperature)  # (tokens, V)
        # log softmax and gather in one fused op
        return -F.cross_entropy(logits.float(), targets, reduction="none")

    def forward(self, batch: dict) -> torch.Tensor:
        """(S, L) log-probs, 0 after each response's end."""
        hidden = self.model.model(input_ids=batch["input_ids"],
                                  attention_mask=batch["attention_mask"],
                                  position_ids=batch["position_ids"]).last_hidden_state
        # the state before each response token: (R, L, H) -> (tokens, H)
        hidden = hidden.flatten(0, 1)[batch["sources"]]
        # chunks of (chunk_tokens, H) and (chunk_tokens,), recomputed in backward: one chunk of
        # logits alive at a time
        logps = [torch.utils.checkpoint.checkpoint(self._chunk_logps, states, targets,
                                                   use_reentrant=False)
                 for states, targets in zip(hidden.split(self.chunk_tokens),
                                            batch["targets"].split(self.chunk_tokens))]
        out = hidden.new_zeros(batch["completion_mask"].shape, dtype=torch.float32)  # (S, L)
        # integer positions: a boolean mask would sync with the host
        out.view(-1)[batch["completion_index"]] = torch.cat(logps)
        return out


def collate(samples: list, pad_id: int, device, share_prompts: bool = False) -> dict:
    """A micro-batch as tensors; a row is [prompt | response], positions from 0 as in vLLM. With
    share_prompts a row holds a prompt once, then each of its responses, each seeing only the
    prompt and itself (a block-causal mask): the prompt's forward and backward run once, not n
    times. Otherwise the mask stays 2-D (fused attention kernels). samples: objects with
    (prompt_ids, completion_ids, advantage, replay, old_logprobs). The keys TokenLogProbs reads:
    input_ids, position_ids, attention_mask; sources, the flat (row, column) of the state that
    predicts each response token; targets, those tokens; completion_index, where each lands in
    the (S, L) output."""
    members = collections.defaultdict(list)  # row key -> the indices of its samples
    for i, s in enumerate(samples):
        members[tuple(s.prompt_ids) if share_prompts else i].append(i)
    # per row: tokens, positions, segments (0: the prompt, j: its j-th response)
    tokens, positions, segments = [], [], []
    # per sample: its row, and the columns of the states that predict its tokens
    sources = [None] * len(samples)
    for r, ids in enumerate(members.values()):
        prompt = samples[ids[0]].prompt_ids
        p = len(prompt)
        tokens.append(list(prompt))
        positions.append(list(range(p)))
        segments.append([0] * p)
        for j, i in enumerate(ids):
            completion = samples[i].completion_ids
            start = len(tokens[r])
            # state t - 1 predicts token t: the first token's is the prompt's last
            sources[i] = r, [p - 1, *range(start, start + len(completion) - 1)]
            tokens[r] += completion
            # positions continue the prompt's, as vLLM numbers them
            positions[r] += range(p, p + len(completion))
            segments[r] += [j + 1] * len(completion)
    length = max(map(len, tokens))

    def pad(lists, value):  # -> (len(lists), the longest)
        return pad_sequence([torch.tensor(x) for x in lists], batch_first=True,
                            padding_value=value)

    segments = pad(segments, -1)  # (R, L), -1 on padding
    attention = (segments >= 0).long()  # (R, L)
    if share_prompts:
        query, key = segments.unsqueeze(2), segments.unsqueeze(1)  # (R, L, 1), (R, 1, L)
        # a token sees the prompt and its own response, causally: (R, 1, L, L)
        attention = ((key == 0) | (key == query)).tril().unsqueeze(1)
    responses = pad([s.completion_ids for s in samples], -1)  # (S, L), -1 after each end
    completion_mask = responses >= 0  # (S, L)
    batch = {
        "input_ids": pad(tokens, pad_id),  # (R, L)
        "position_ids": pad(positions, 0),  # (R, L)
        "attention_mask": attention,
        # (tokens,) flat positions in (R * L)
        "sources": torch.tensor([r * length + t for r, columns in sources for t in columns]),
        "targets": responses[completion_mask],  # (tokens,)
        "completion_mask": completion_mask.long(),  # (S, L)
        # (tokens,) positions in (S * L), in the order of targets
        "completion_index": completion_mask.flatten().nonzero().squeeze(1),
        "advantages": torch.tensor([s.advantage for s in samples]).float(),  # (S,)
        "replays": torch.tensor([s.replay for s in samples]),  # (S,)
    }
    batch = {key: value.to(device) for key, value in batch.items()}
    if all(s.old_logprobs is not None for s in samples):
        # π_θold, carried by the samples as their advantages are (epochs after the first)
        batch["old_logprobs"] = pad_sequence([s.old_logprobs for s in samples],
                                             batch_first=True)  # (S, L), 0 after the end
    batch["samples"] = samples
    # the rows' real tokens: what the forward costs
    batch["row_tokens"] = sum(map(len, tokens))
    return batch


def build_policy(path: str, cfg: Config, d: ranks.Dist):
    """π_θ and its AdamW: float32 master weights (under torchrun sharded by FSDP2 and read by
    rank 0 alone); log π_θ of each response token from logits / T, as vLLM samples them."""
    model = fsdp.load_model(path, d, cfg.gradient_checkpointing)
    policy = TokenLogProbs(model, cfg.temperature)
    # deviation: under torchrun a bf16 run gathers bf16 weights (verl's default: half the bytes)
    # and reduces gradients in fp32; it doubles the gap between 2 ranks and 1 (docs/paper.md, 1)
    fsdp.shard(policy, model, d, gather_bf16=cfg.dtype == "bfloat16")
    # fused: one kernel for all parameters (CPU's default loops over them); betas (0.9, 0.999),
    # AdamW's default, as verl's
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr,
                                  weight_decay=cfg.weight_decay, fused=True)
    return policy, optimizer


def plan_mini_batches(num_prompts: int, num_updates: int, epoch: int,
                      seed: int) -> list[np.ndarray]:
    """An epoch's mini-batches as runs of consecutive positions of the step's prompts, whose
    order step_prompts already shuffled, whole groups, replays included (RLEP's 9 runs of 56 or
    57 of 512). The runs do not depend on W (the update is the same on any number of ranks);
    later epochs take them in another seeded order."""
    runs = np.array_split(np.arange(num_prompts), num_updates)  # of positions
    if epoch == 0:
        return runs
    order = np.random.default_rng(seed).permutation(num_updates)
    return [runs[i] for i in order]


def keep_old_logprobs(micro: dict, old_logprobs: torch.Tensor):
    """A micro-batch's (S, L) log π_θold, the policy at the step's start: the loss reads the
    micro-batch's; later epochs (collate) and the step's metrics each sample's row."""
    micro["old_logprobs"] = old_logprobs
    for sample, row in zip(micro["samples"], old_logprobs):
        sample.old_logprobs = row[:len(sample.completion_ids)]


def ppo_update(policy, optimizer, my_groups: dict[int, list[Sample]],
               sequences_per_update: int, cfg: Config, d: ranks.Dist, pad_id: int,
               seed: int) -> tuple[dict, list[Sample]]:
    """A training step's update of this rank's groups, {position in the step: group}
    (make_groups); its metrics and the samples it trained."""
    # a cache of bf16 weight copies would cost 13 GiB for 7B
    autocast = torch.autocast(d.device.type, dtype=getattr(torch, cfg.dtype),
                              enabled=cfg.dtype != "float32", cache_enabled=False)
    # every rank's groups' sizes (one small gather): N's tokens, the rows' lengths
    sizes = planner.group_sizes(my_groups, d)
    num_updates = max(1, round(sum(len(g.row_lengths) for g in sizes.values())
                               / sequences_per_update))
    split = planner.Split(cfg.micro_batch_size, cfg.micro_batch_tokens, cfg.share_prompts)
    # an idle pass's sample (FSDP2's lockstep: a rank short of rows runs one): one token with
    # Â = 0, an exactly zero gradient; its π_θold does not matter: 0, so later epochs collate it
    idle = Sample([pad_id], [pad_id], correct=False, reward=0.0,
                  old_logprobs=torch.zeros(1, device=d.device))
    # rows, not groups, dealt to the ranks by tokens (one exchange a step): this rank's
    # micro-batches of each mini-batch, as many as every other rank's (FSDP2's lockstep)
    dealt, rows = planner.deal(my_groups, sizes, plan_mini_batches(len(sizes), num_updates, 0, 0),
                               split, d, idle)
    stats = collections.defaultdict(list)
    for epoch in range(cfg.epochs):
        # a mini-batch: a run of the step's shuffled prompts, whole groups, replays included; later
        # epochs take the runs in another order
        runs = plan_mini_batches(len(sizes), num_updates, epoch, seed_for(seed, epoch))
        # N: each mini-batch's response tokens on all ranks
        num_tokens = [sum(sizes[p].response_tokens for p in run) for run in runs]
        mini_batches = [[collate(samples, pad_id, d.device, cfg.share_prompts)
                         for samples in dealt[tuple(run)]] for run in runs]
        if epoch == 0:
            # π_θold of every sequence, replays included, in one no-grad pass before any update, for
            # every mini-batch but the first (below)
            with torch.no_grad(), autocast:
                for mini_batch in mini_batches[1:]:
                    for micro in mini_batch:
                        keep_old_logprobs(micro, policy(micro))
        for u, mini_batch in enumerate(mini_batches):  # u: the step's u-th update
            for micro in mini_batch:
                with autocast:
                    logprobs = policy(micro)  # (S, L)
                    if epoch == 0 and u == 0:
                        # the policy has not moved: its forward is π_θold (a pass saved; all of it
                        # when a step is 1 update)
                        keep_old_logprobs(micro, logprobs.detach())
                    loss, metrics = policy_loss(logprobs, micro["old_logprobs"],
                                                micro["advantages"], micro["completion_mask"],
                                                cfg.clip_low, cfg.clip_high, cfg.clip_c,
                                                num_tokens=num_tokens[u])
                    if cfg.replay_loss == "nll":
                        # control: replays imitated (their Â is 0)
                        replay_mask = micro["completion_mask"] * micro["replays"][:, None]
                        loss = loss + cfg.replay_coef * imitation_loss(
                            logprobs, replay_mask, num_tokens[u])  # control
                # A rank's loss is its tokens' share of the token mean (their sum over N); FSDP2
                # averages gradients over the W ranks, so W times the loss sums the shares.
                (loss * d.world_size).backward()
                # an idle pass (FSDP2's lockstep) has no samples to count
                if micro["samples"][0] is not idle:
                    for key, value in metrics.items():
                        stats[key].append(value)
                    # tokens through decoder and LM head: the step's FLOPs
                    stats["trained_tokens"].append(micro["row_tokens"])
                    stats["trained_response_tokens"].append(len(micro["targets"]))
            # the norm before the clip, of all ranks' gradients
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
            # not skipped where the norm is not finite (verl skips): train stops the run at the
            # step's end on the mean norm and the weights, before a push or save
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            stats["grad_norm"].append(fsdp.full(grad_norm).item())
    # to the host once a step: the means of this rank's micro-batches
    summary = {key: float(torch.stack(stats[key]).double().mean())
               for key in ("clip_frac", "dual_clip_frac", "ratio_mean")}
    summary["ratio_max"] = float(torch.stack(stats["ratio_max"]).max())
    # not finite if any update's is
    summary["grad_norm"] = float(np.mean(stats["grad_norm"]))
    for key in ("trained_tokens", "trained_response_tokens"):
        summary[key] = sum(stats[key])
    return summary, list(rows.values())


# ---------------------------------------------------------------------------
# Phase one: GRPO/DAPO from the base model; phase two reruns it as train(..., replay=True)

def learning_rate(step: int, cfg: Config) -> float:
    """Linear warm-up, then constant. verl's LambdaLR counts from 0 (lr x step / warmup_steps):
    the first update runs at lr 0 (no weight moves; AdamW's moments take its gradient)."""
    if cfg.warmup_steps <= 0:
        return cfg.lr
    return cfg.lr * min(1.0, step / cfg.warmup_steps)


def validate(engine, tokenizer, val_rows, cfg, stop_ids, d, step) -> dict:
    """avg@val_k, overall and per data source, without replays, seeded by the step (both phases
    draw the same), on rank 0, which logs it; {} elsewhere."""
    records = sample_and_grade(engine, tokenizer, val_rows, cfg.val_k, cfg, stop_ids, d,
                               seed_key=(cfg.seed, "val", step), progress=cfg.progress)
    if not d.master_process:
        return {}
    scores = {"val_acc": float(np.mean([c for r in records for c in r["correct"]]))}
    by_source = collections.defaultdict(list)
    for row, record in zip(val_rows, records):
        by_source[f"val_acc/{row.get('data_source')}"] += record["correct"]
    if len(by_source) > 1:
        scores |= {key: float(np.mean(c)) for key, c in by_source.items()}
    return scores


def right_and_wrong(group: list[Sample]) -> bool:
    """control: the group holds right and wrong answers (verl's metric acc), replays included: a
    rescue (fresh all wrong, a replay right) is kept."""
    return len({s.correct for s in group}) > 1  # control


def first_flagged(flags: list[tuple], count: int) -> list:
    """control: the first `count` keys, in key order, whose flag is true, made up with the first
    false ones where fewer are true; returned in key order. flags: (key, flag) pairs gathered from
    every rank, so that every rank chooses alike."""
    ordered = sorted(flags)
    chosen = [key for key, flag in ordered if flag][:count]
    chosen += [key for key, flag in ordered if not flag][:count - len(chosen)]
    return sorted(chosen)


def make_groups(cfg: Config, part: str, step: int, first_round: int, rows: list[dict],
                engine: vllm_engine.Engine, tokenizer, end_id: int, d: ranks.Dist, replay: bool,
                times: dict) -> tuple[dict, dict]:
    """This rank's groups, {position in the step: group}: n fresh rollouts each, plus m replays
    in phase two; and the step's counts. Round j is step_prompts's slot first_round + j. One
    round a step; control: with --dynamic_sampling, rounds until B groups hold right and wrong
    answers."""
    B = cfg.prompts_per_step
    rounds = cfg.max_gen_rounds if cfg.dynamic_sampling else 1  # control
    made = {}  # (round, position) -> a group this rank made
    flags = []  # every rank's ((round, position), right_and_wrong)
    for j in range(rounds):
        order = step_prompts(len(rows), B, first_round + j, cfg.seed)
        positions = range(d.rank, B, d.world_size)  # rank r: r, r + W, ...
        batch_rows = [rows[order[p]] for p in positions]
        # round 0 keeps the keys of a run without dynamic sampling; later ones add j (a row can come
        # up twice in a step)
        extra = (j,) if j else ()  # control
        with clock("generation", times):
            prompts = [render_prompt(tokenizer, row, cfg.prompt_template, cfg.max_prompt_len)
                       for row in batch_rows]
            seeds = [seed_for(cfg.seed, part, step, row["id"], *extra) for row in batch_rows]
            completions = engine.generate(prompts, cfg.n, cfg.temperature, cfg.top_p,
                                          cfg.max_response_len, [end_id], seeds, logprobs=True,
                                          progress=cfg.progress and d.master_process)
        with clock("scoring", times):
            for p, row, prompt_ids, fresh, seed in zip(positions, batch_rows, prompts,
                                                       completions, seeds):
                replays = []
                if replay:
                    # RLEP: m drawn anew at every visit, seeded by vLLM's key for the prompt in
                    # another generator (numpy's PCG64, not torch's)
                    rng = np.random.default_rng(seed)  # RLEP
                    replays = draw_replays(row["responses"], cfg.replay_m, rng)  # RLEP
                made[j, p] = build_group(row, prompt_ids, fresh, tokenizer, cfg, end_id, replays)
        flags += ranks.gather_lists([((j, p), right_and_wrong(made[j, p])) for p in positions], d)
        with_signal = sum(flag for _, flag in flags)
        if with_signal >= B:
            break
    with clock("generation", times):
        engine.sleep()  # on a GPU: free vLLM's memory for the trainer
    # control: the first B groups with right and wrong answers in stream order (round, position),
    # alike on any number of ranks, each kept on the rank that made it; at the cap the dropped ones
    # fill the step, earliest first
    kept = first_flagged(flags, B)  # control
    my_groups = {i: made[key] for i, key in enumerate(kept) if key in made}
    meter = {"gen_rounds": j + 1, "gen_prompts": len(flags),
             "gen_responses": len(flags) * cfg.n, "kept_groups": min(B, with_signal)}
    if cfg.dynamic_sampling:
        meter["gen_capped"] = with_signal < B  # control
    return my_groups, meter


def visit(group: list[Sample]) -> dict:
    """A prompt's visit, for metrics.jsonl. RLEP: rescued when every fresh rollout is wrong and a
    replay right: the replays are the only signal."""
    fresh_correct = sum(s.correct for s in group if not s.replay)
    replays = [s for s in group if s.replay]
    rescued = fresh_correct == 0 and any(s.correct for s in replays)  # RLEP
    return {"id": group[0].row_id, "fresh_correct": fresh_correct,
            "replays": len(replays), "rescued": rescued}


def validate_base(engine, tokenizer, val_rows, cfg, stop_ids, d, part, base_path, run):
    """Step 0 of the part's curve: the base model, validated once for both phases (run keeps its
    scores), appended to the part's metrics.jsonl and tracked."""
    if base_path not in run.base_scores:
        with clock("validation", run.spent):
            run.base_scores[base_path] = validate(engine, tokenizer, val_rows, cfg,
                                                  stop_ids, d, step=0)
    first = {"step": 0, **run.base_scores[base_path]}
    if d.master_process:
        files.append_jsonl(os.path.join(cfg.out_dir, part, "metrics.jsonl"), [first])
        metrics.track(part, first)


def train(cfg: Config, part: str, rows: list[dict], engine: vllm_engine.Engine, tokenizer,
          end_id: int, base_path: str, d: ranks.Dist, val_rows: list[dict], run: RunState,
          replay: bool = False):
    """Train from the base model (or the part's last checkpoint); with replay, rows carry pooled
    responses. A step: generate and grade, update, push, validate, log, save."""
    part_dir = os.path.join(cfg.out_dir, part)
    steps = cfg.phase2_steps if replay else cfg.phase1_steps
    # the checkpoint's step, and the round of prompts it starts at
    start, ckpt, prompt_round = ranks.rank0_decides(lambda: checkpoints.resume_point(part_dir), d)
    if start >= steps:
        return
    run.stage = f"{part}, before step {start + 1}"
    # a collected pool's size is known only now (machinery/preflight.py checked the rest)
    if len(rows) < cfg.prompts_per_step:
        raise RunStopped(f"{part}: the pool holds {len(rows)} prompts, fewer than "
                         f"--prompts_per_step {cfg.prompts_per_step}: collect with a larger "
                         "--collect_k, or continue with a smaller --prompts_per_step (--override)")
    os.makedirs(part_dir, exist_ok=True)
    if d.master_process:
        files.forget_after(part_dir, start)  # the steps logged after the resumed checkpoint
    policy, optimizer = build_policy(ckpt or base_path, cfg, d)
    if ckpt:
        checkpoints.load_trainer_state(ckpt, policy, optimizer)
    stop_ids = [end_id]
    pad_id = end_id if tokenizer.pad_token_id is None else tokenizer.pad_token_id
    with clock("push", run.spent):
        engine.push(policy.model)
    if start == 0 and cfg.val_every:  # the curve starts at the base model
        validate_base(engine, tokenizer, val_rows, cfg, stop_ids, d, part, base_path, run)
    # An update takes mini_batch_prompts x n sequences, as the paper's run.
    # RLEP: groups are n + m long, so a step of 512 x 18 makes round(512 x 18 / (64 x 16)) = 9
    # updates where the baseline makes 8.
    # control: --equal_updates counts n + m a prompt.
    per_prompt = cfg.n + cfg.replay_m if replay and cfg.equal_updates else cfg.n  # control
    sequences_per_update = cfg.mini_batch_prompts * per_prompt

    for step in range(start, steps):
        interrupts.stop_if_asked()
        run.stage = f"{part} step {step + 1} of {steps}"
        lr = learning_rate(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        times = {}  # seconds per part of this step
        # generate and grade: this rank's groups
        my_groups, meter = make_groups(cfg, part, step, prompt_round, rows, engine,
                                       tokenizer, end_id, d, replay, times)
        prompt_round += meter["gen_rounds"]  # control: the next step's prompts follow its rounds
        with clock("training", times):  # update
            stats, trained = ppo_update(policy, optimizer, my_groups, sequences_per_update, cfg,
                                        d, pad_id, seed_for(cfg.seed, part, step, "update"))
        # The one check of divergence: an update whose gradient norm (a NaN gradient made the
        # weights NaN) or weights are no longer finite stops the run before the push and any
        # save; the newest checkpoint stays the last good one.
        if not (math.isfinite(stats["grad_norm"]) and fsdp.weights_finite(policy)):
            raise RunStopped(checkpoints.divergence_line(part_dir, step + 1, stats["grad_norm"],
                                                         cfg.lr))
        with clock("push", times):
            engine.push(policy.model)
        scores = {}
        if cfg.val_every and (step + 1) % cfg.val_every == 0:
            with clock("validation", run.spent):
                scores = validate(engine, tokenizer, val_rows, cfg, stop_ids, d, step=step + 1)
        run.spent.update(times)  # a Counter: the step's seconds added
        # metrics.jsonl, W&B, samples.jsonl and the step's line
        groups = list(my_groups.values())
        step_times = {f"t_{activity}": seconds for activity, seconds in times.items()}
        metrics.record_step(cfg, part, step + 1, steps, {"lr": lr, **stats},
                            {**meter, **step_times, **fsdp.peak_memory(d.device), **scores},
                            groups, [visit(group) for group in groups], trained, tokenizer,
                            stop_ids, d)
        # save; pruning keeps the weights the collection reads
        if step + 1 in checkpoints.save_plan(cfg, part):
            with interrupts.saving():
                checkpoints.save(part_dir, step + 1, policy, optimizer, tokenizer, cfg, d,
                                 checkpoints.protected_steps(cfg, part), prompt_round)
    engine.sleep()
    # FSDP2's modules sit in reference cycles: free this part's policy and AdamW now, before the
    # next part builds its own (~10 GiB a GPU for 7B)
    del policy, optimizer
    gc.collect()
    torch.cuda.empty_cache()  # a no-op where CUDA never started


# ---------------------------------------------------------------------------
# Collection: the phase-one checkpoint answers each training prompt K times; RLEP's pool

def verified_answers(record: dict) -> dict:
    """RLEP: a collected prompt's row of progress.jsonl, from a sample_and_grade record: its
    verified answers (the pool's candidates) and the response tokens generated for it (the
    studies' cost). Made before the ranks gather: the other answers of K never cross them."""
    right = [t for t, ok in zip(record["responses"], record["correct"]) if ok]  # RLEP
    return {"id": record["id"], "successes": right, "tokens": sum(record["lengths"])}


def verified_pool(pool: list[dict], cfg: Config) -> list[dict]:
    """RLEP: a pool given with --pool replays only the answers the verifier accepts under the
    run's rule, as the collection keeps; a warning line counts the rest, left out, and the prompts
    left with none (gone from the pool)."""
    kept = [{**row, "responses": [r for r in row["responses"]
                                  if verify.verify(r, row["answer"], mode=cfg.verify_mode)]}
            for row in pool]  # RLEP
    wrong = sum(len(row["responses"]) for row in pool) - sum(len(r["responses"]) for r in kept)
    if wrong:
        emptied = sum(not row["responses"] for row in kept)
        preflight.warn(f"--pool {cfg.pool}: {wrong:,} of its answers are wrong under "
                       f"--verify_mode {cfg.verify_mode}: left out ({emptied:,} of its "
                       f"{len(pool):,} prompts left with none)")
    return [row for row in kept if row["responses"]]


def collect(cfg: Config, rows: list[dict], engine: vllm_engine.Engine, tokenizer, end_id: int,
            d: ranks.Dist, run: RunState):
    """RLEP: the pool, from the phase-one checkpoint at `collect_step`; progress.jsonl lets a
    stopped collection resume. run: where the stage a stop prints is set."""
    out = os.path.join(cfg.out_dir, "collect")
    ckpt = checkpoints.checkpoint_path(os.path.join(cfg.out_dir, "phase1"), cfg.collect_step)
    successes = {}  # rank 0's: it writes the pool

    def where_to_start():
        # rank 0's view of the folder for every rank: a shared filesystem can show the ranks
        # different files (rank0_decides); the others need only which prompts are done
        written, successes_so_far = data.read_collection(out)
        if not written and not os.path.isdir(ckpt):  # preflight's check_checkpoints: not here
            raise RunStopped(f"{ckpt}: phase one has no checkpoint at --collect_step "
                             f"{cfg.collect_step}")
        successes.update(successes_so_far)
        return written, set(successes_so_far)
    pooled, done = ranks.rank0_decides(where_to_start, d)
    if pooled:
        return
    os.makedirs(out, exist_ok=True)
    run.stage = "the collection"
    todo = [row for row in rows if row["id"] not in done]
    bar = tqdm(total=len(todo), desc="collection", unit="prompt",
               disable=not (cfg.progress and d.master_process))
    # a generate call's prompts: W x collect_chunk / K, so that vLLM schedules thousands of
    # sequences a rank with its KV cache full and a chunk's longest response is one tail among
    # many; the small presets keep B (docs/gpu.md: the collection's chunks). Each prompt keeps its
    # seed: a chunk changes which prompts share a batch, not how each is sampled.
    size = cfg.prompts_per_step
    if cfg.collect_chunk:
        size = d.world_size * max(1, cfg.collect_chunk // cfg.collect_k)
    # RLEP: the seed policy, read by vLLM in its own dtype (no trainer copy)
    engine.push(path=ckpt)  # RLEP
    for start in range(0, len(todo), size):
        interrupts.stop_if_asked()
        chunk = todo[start:start + size]
        records = sample_and_grade(engine, tokenizer, chunk, cfg.collect_k, cfg, [end_id],
                                   d, seed_key=(cfg.seed, "collect"),
                                   temperature=cfg.collect_temperature,
                                   top_p=cfg.collect_top_p, keep=verified_answers)
        # on rank 0 (the others' records are [])
        successes.update((r["id"], r["successes"]) for r in records)  # RLEP
        if d.master_process:
            files.append_jsonl(os.path.join(out, "progress.jsonl"), records)
        bar.update(len(chunk))
    bar.close()
    engine.sleep()

    def write_pool():
        # RLEP: only prompts with >= min_successes verified answers
        pool = [{**row, "responses": successes[row["id"]]} for row in rows
                if len(successes[row["id"]]) >= cfg.min_successes]  # RLEP
        if not pool:
            raise RunStopped(f"empty experience pool: no prompt got {cfg.min_successes} "
                             f"verified answers out of {cfg.collect_k} from {ckpt}. "
                             "Train phase one longer or raise --collect_k.")
        data.save_pool(os.path.join(out, "pool.jsonl"), pool)
    # rank 0 writes it; if it is empty, every rank raises
    ranks.rank0_decides(write_pool, d)


# ---------------------------------------------------------------------------
# Phase two: RLEP proper. The loop of phase one, restarted from the base model π_θ0 on the pool's
# prompts, each group n fresh + m replayed.

def phase_two(cfg: Config, given_pool: list[dict] | None, train_rows: list[dict],
              engine: vllm_engine.Engine, tokenizer, end_id: int, base_path: str, d: ranks.Dist,
              val_rows: list[dict], run: RunState):
    # RLEP: the pool's rows, the pool given with --pool, else the collection's (read by rank 0,
    # for all)
    rows = given_pool or ranks.rank0_decides(
        lambda: data.load_pool(os.path.join(cfg.out_dir, "collect", "pool.jsonl")), d)  # RLEP
    if cfg.phase2_prompts == "all":
        # control: every training prompt, with replays where the pool has some
        pooled = {row["id"]: row["responses"] for row in rows}
        rows = [{**row, "responses": pooled.get(row["id"], [])} for row in train_rows]
    # RLEP: from π_θ0 (base_path), not phase one's checkpoint, with replays
    train(cfg, "phase2", rows, engine, tokenizer, end_id, base_path, d, val_rows, run,
          replay=True)


# ---------------------------------------------------------------------------
# main: phase one, the collection, phase two; the report and the time table

def start_up(cfg: Config, d: ranks.Dist):
    """The preflight and the run's start: the model folder, the data and the pool read by rank 0
    and checked (nothing after it fails on input: the end token's too), the dtype, then the run
    folder held, its config.json written and W&B started. Returns (the model's folder, the rows
    (train, val, the pool given), the dtype's choice)."""
    # the command alone: every rank refuses alike
    for warning in preflight.check_config(cfg, d.world_size):
        if d.master_process:
            preflight.warn(warning)
    def model_folder():
        return hub.model_folder(cfg.model_path, cfg.cache_dir)
    try:
        # a folder as given, a built-in model made or a hub model fetched: by rank 0 first, once;
        # then every rank finds it
        ranks.rank0_decides(model_folder, d)
        model_path = model_folder()
    except ValueError as e:  # an unknown built-in model, a hub name that cannot be fetched
        raise UserError(f"--model_path {e}") from None
    # the data, read once by rank 0 (the paper's parquet holds 1.8 M rows for ~17.9k prompts) and
    # handed to every rank: the training rows, the validation rows, the pool given with --pool
    def read_inputs():
        train_rows, val_rows, pool = data.read_inputs(cfg)
        # the method's prompts: all of D, or the fixed --train_prompts of them
        return (training_prompts(train_rows, cfg.train_prompts), val_rows,
                pool and verified_pool(pool, cfg))  # RLEP
    inputs = ranks.rank0_decides(read_inputs, d)
    # the preflight: rank 0 checks all the command reads (the run there, the model, the rows, the
    # pool, the folders, the disk, W&B); every rank gets the run's saved config, this command's
    # changes to it, the disk's line and the data's digests, or the refusal. Nothing after it
    # fails on input.
    saved, changes, disk_line, digests = ranks.rank0_decides(lambda: preflight.check_start(
        cfg, model_path, d.world_size, inputs, hub.commits, prompt_text, end_token_id), d)
    if cfg.dtype == "auto" and "dtype" in saved:
        cfg.dtype = saved["dtype"]  # a resumed run keeps its measured dtype
    # the dtype of vLLM's weights and the update's autocast (master weights stay fp32): bf16 on a
    # GPU, as the paper; on a CPU --dtype auto measures both and takes bf16 only if 1.5x faster
    # (bf16 rounds log π: a gap to vLLM's of ~0.3, not ~1e-5). The ranks must agree: every rank
    # takes rank 0's measurement
    dtype = ranks.rank0_decides(lambda: fsdp.resolve_dtype(cfg.dtype, d.device, model_path), d)
    cfg.dtype = dtype.dtype
    # one process writes the run: rank 0 holds its folder from the first write on
    ranks.rank0_decides(lambda: files.hold_run_folder(cfg.out_dir), d)
    if d.master_process:
        print(f"rlep: preset {cfg.preset}, {d.world_size} rank(s) on {d.device.type}, dtype "
              f"{cfg.dtype} ({dtype.why}), torch threads {torch.get_num_threads()}, output "
              f"in {cfg.out_dir}\n{disk_line}", flush=True)
        checkpoints.remove_leftovers(cfg.out_dir)
        # with the hub names' commits, the data's digests, and --override's changes at the steps
        # they took effect
        files.save_config(cfg.out_dir, asdict(cfg), saved, changes, hub.commits, digests)
        if cfg.wandb_project:
            name = f"{os.path.basename(os.path.abspath(cfg.out_dir))}-{cfg.preset}"
            metrics.start_wandb(cfg.wandb_project, cfg.out_dir, asdict(cfg), name)
    return model_path, inputs, dtype


def main(argv=None, run: RunState = None):
    """Phase one, the collection, phase two (each part resumes on its own), the report. run:
    where __main__ reads the stage a stop prints."""
    from transformers import AutoTokenizer
    started = time.perf_counter()
    run = run or RunState()
    cfg = parse_config(argv)
    d = ranks.setup_distributed(cfg.timeout_minutes)
    model_path, (train_rows, val_rows, given_pool), dtype = start_up(cfg, d)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    end_id = end_token_id(tokenizer, cfg.stop_token)
    engine = build_engine(cfg, model_path, d)
    # free the GPU for the trainer; the first push wakes it
    engine.sleep()
    if d.master_process:
        print(engine.memory_line(cfg.preset), flush=True)
    try:
        if cfg.phase in ("all", "1"):
            # control: --phase1_prompts pool, the baseline on the pool's prompts
            rows = given_pool if cfg.phase1_prompts == "pool" else train_rows
            train(cfg, "phase1", rows, engine, tokenizer, end_id, model_path, d, val_rows, run)
        if cfg.phase in ("all", "collect") and not cfg.pool:
            with clock("collection", run.spent):
                collect(cfg, train_rows, engine, tokenizer, end_id, d, run)
        if cfg.phase in ("all", "2"):
            phase_two(cfg, given_pool, train_rows, engine, tokenizer, end_id, model_path, d,
                      val_rows, run)  # RLEP
    except BaseException as error:
        # After an error, no wake (it would ask for the memory again and hide the error). A rank's
        # stop under torchrun, no shutdown either: it tears down the process group, which can
        # wait for ranks stuck in a collective; the rank ends at once (__main__: ranks.end_rank).
        # A stop says where it stopped first (vLLM's exit handler shuts down).
        failed = d.distributed and not isinstance(error, KeyboardInterrupt)
        if not (failed or interrupts.stop["why"]):
            engine.shutdown()
        raise
    # vLLM's groups, torchrun's too (else at exit, below); awake: vLLM frees the weights and KV
    # cache, and freeing what a sleep unmapped prints CUDA errors
    engine.shutdown(wake=True)
    if not d.master_process:
        return
    total = time.perf_counter() - started
    spent = {**run.spent, "start-up, loading, saving": total - sum(run.spent.values())}
    # the comparison (after --phase all), the time table
    table = report.final_report(cfg.out_dir, cfg.phase == "all" and cfg.val_every, total, spent,
                                dtype.gflops)
    # the table too; a run that stopped early is closed by wandb at exit
    metrics.finish_wandb(table)

if __name__ == "__main__":
    interrupts.catch_stops("rlep.py")  # main runs: a stop raises there, at a safe point
    run = RunState()
    try:
        main(run=run)
    except (KeyboardInterrupt, Exception) as e:
        # under torchrun, any stop but Ctrl-C: one line naming the rank, the rank's end at once
        # (torchrun then ends the others, which may wait in a collective for this rank alone)
        ranks.end_rank(e)
        if isinstance(e, (UserError, RunStopped)):
            # bad input, before anything is written (exit 2); a run that cannot go on, what is
            # saved stays (exit 1): one line
            print(f"rlep.py: {e}", file=sys.stderr)
            sys.exit(2 if isinstance(e, UserError) else 1)
        # a stop's line and exit; other errors go on, with their traceback
        interrupts.end_on_stop(e, parse_config(), sys.argv[1:], run.stage)
    finally:
        # every exit, a refusal's too: a gloo thread left running aborts it
        if dist.is_initialized():
            dist.destroy_process_group()
