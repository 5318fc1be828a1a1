"""
RLEP: Reinforcement Learning with Experience Replay for LLM Reasoning (arXiv 2507.07451), in one file.

Phase one trains a GRPO/DAPO baseline from the base model, then samples many answers per training prompt from
one of its checkpoints and keeps the verified correct ones: the experience pool. Phase two restarts from the
base model; every prompt's group holds n fresh rollouts plus m replayed successes from the pool, and the
advantage is standardised over all n + m of them. Replays give a learning signal on prompts the current policy
cannot solve yet. Every line that differs from plain DAPO is tagged `# RLEP:` (try `grep -n RLEP rlep.py`).

Run:
    python rlep.py                                  # preset `cpu`: SmolLM2-135M on built-in arithmetic, CPU only
    python rlep.py --preset tiny                    # a tiny random model, seconds per step (what the tests use)
    torchrun --standalone --nproc_per_node=8 rlep.py --preset paper --model_path Qwen2.5-Math-7B \
        --train_file dapo-math-17k.parquet --val_file aime-2024.parquet
    python rlep.py --preset tiny --phase 2 --pool runs/tiny/collect/pool.jsonl    # one part, from a saved pool
Every Config field is a flag (`--lr 2e-6`); `--resume` continues a stopped run where it stopped.

Deviations from the paper (and its verl code):
1. One node: data parallel over torch.distributed (gradients all-reduced once per optimizer step), ZeRO-1 and
   one in-process vLLM engine per rank, not verl's Ray + FSDP on 64 GPUs.
2. The loss is the exact token mean over each mini-batch (all ranks); verl approximates it per micro-batch.
3. The collection code was never published: ours samples K answers per prompt from the phase-one checkpoint
   and keeps the verified ones of prompts with at least `min_successes` of them.
4. The reward comes from verify.py (equivalence); `--verify_mode dapo` is the paper's string match.
5. A prompt with fewer than m pooled answers replays all it has; verl pads with empty responses scored -1.
6. Training prompts are de-duplicated and shuffled per epoch; the paper's file repeats each one ~100 times.
7. The warm-up (lr 0 on the first step, as in verl) is computed from the step, not by a scheduler object.
"""
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine lives in this process (weight pushes)
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; left unset, vLLM-CPU reserves 90 % of RAM

import argparse
import hashlib
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, fields

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

import verify

# ----------------------------------------------------------------------------------------------------------------
# Config: the defaults are the paper's (RLEP section 4 and its run scripts; RLEP_SPEC.md section 3)
dapo_template = ("Solve the following math problem step by step. The last line of your response should be of "
                 "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
                 "{problem}\n\nRemember to put your answer on its own line after \"Answer:\".")


@dataclass
class Config:
    # data and model
    model_path: str = "Qwen/Qwen2.5-Math-7B"  # π_θ0, the base model both phases start from (a local folder)
    train_file: str = "dapo-math-17k.parquet"  # D, DAPO-Math-17k
    val_file: str = "aime-2024.parquet"  # validation set (AIME-2024), scored as avg@val_k
    prompt_template: str = dapo_template  # user message for plain {"problem", "answer"} rows
    out_dir: str = "runs/paper"  # run folder: config, one subfolder per part, checkpoints, metrics
    # rollouts
    prompts_per_step: int = 512  # B, prompts per training step (train_batch_size)
    n: int = 16  # G, fresh rollouts per prompt
    temperature: float = 1.0  # T, sampling temperature; log-probs use logits / T
    top_p: float = 1.0  # nucleus sampling threshold
    max_prompt_len: int = 1024  # prompt tokens (longer prompts are cut from the left)
    max_response_len: int = 3072  # L_max, response tokens including EOS
    overlong_buffer: int = 512  # L_cache, DAPO soft overlong punishment window
    overlong_factor: float = 1.0  # penalty at L_max
    # optimisation
    lr: float = 1e-6  # η, AdamW learning rate
    weight_decay: float = 0.1  # λ, AdamW weight decay
    warmup_steps: int = 10  # linear warm-up, stepped once per training step
    grad_clip: float = 1.0  # global gradient-norm clip
    mini_batch_prompts: int = 64  # one optimizer step = mini_batch_prompts * n sequences
    epochs: int = 1  # PPO epochs over each step's batch
    clip_low: float = 0.2  # ε_low
    clip_high: float = 0.28  # ε_high (DAPO clip-higher)
    clip_c: float = 10.0  # c, dual-clip bound for negative advantages
    micro_batch_size: int = 2  # sequences per forward/backward on one rank (memory, not math)
    # phase one: the baseline, then experience collection
    phase1_steps: int = 400  # training steps of the baseline
    phase1_prompts: str = "all"  # "all" (paper) or "pool": baseline on the pool's prompts (confound control)
    collect_step: int = 400  # RLEP: the phase-one checkpoint that builds the pool
    collect_k: int = 64  # RLEP: K, samples per prompt during collection
    collect_temperature: float = 0.7  # RLEP: sampling temperature of the collection
    collect_top_p: float = 0.95  # RLEP: nucleus threshold of the collection
    min_successes: int = 2  # RLEP: keep prompts with at least this many verified answers
    # phase two: replay
    phase2_steps: int = 400  # RLEP: training steps of phase two
    replay_m: int = 2  # RLEP: m, replayed successes added to each group of n fresh rollouts
    equal_updates: bool = False  # RLEP: True: phase-two mini-batches hold n + m per prompt (confound control)
    pool: str = ""  # RLEP: phase two from this pool file (pool.jsonl, or DAPO parquet with reward_model.candidates)
    # evaluation
    val_every: int = 5  # validate every N steps (and before the first); 0 turns it off
    val_k: int = 32  # samples per validation problem (avg@k)
    val_max_problems: int = 0  # 0 = all
    verify_mode: str = "default"  # "default" (equivalence) or "dapo" (the paper's string match)
    # system
    phase: str = "all"  # all | 1 | collect | 2
    resume: bool = False  # continue the run in out_dir from its last checkpoints
    seed: int = 1  # every random draw derives from (seed, step, ...): see seed_for
    dtype: str = "bfloat16"  # compute dtype (autocast) and vLLM dtype; master weights stay float32
    gradient_checkpointing: bool = True  # recompute activations in backward: memory for compute
    zero1: bool = True  # shard AdamW state over ranks (ZeroRedundancyOptimizer)
    gpu_memory_utilization: float = 0.35  # vLLM's share of each GPU (weights + KV cache)
    save_every: int = 20  # checkpoint every N steps (and at the end of each part)
    log_samples: int = 2  # completions written to samples.jsonl per step
    cache_dir: str = ".cache/rlep"  # where built-in models are built or converted
    preset: str = "cpu"  # paper | tiny | cpu (applied before the other command-line flags)


presets = {
    "paper": {"out_dir": "runs/paper"},
    # A tiny random Qwen2 given a few seconds of supervised warm-up, on single-digit sums: tests and smoke runs.
    "tiny": dict(model_path="builtin:tiny", train_file="builtin:tiny:train", val_file="builtin:tiny:val",
                 prompt_template="{problem}", out_dir="runs/tiny", prompts_per_step=8, n=8, max_prompt_len=32,
                 max_response_len=16, overlong_buffer=4, lr=3e-4, warmup_steps=0, mini_batch_prompts=4,
                 micro_batch_size=16, phase1_steps=4, collect_step=4, collect_k=16, phase2_steps=4, val_every=2,
                 val_k=4, dtype="float32", save_every=2, log_samples=1),
    # SmolLM2-135M-Instruct (shipped on PyPI as GGUF) on built-in arithmetic: the real thing on a laptop CPU.
    "cpu": dict(model_path="builtin:smollm2", train_file="builtin:arith:train", val_file="builtin:arith:val",
                out_dir="runs/cpu", prompts_per_step=8, n=8, max_prompt_len=160, max_response_len=48,
                overlong_buffer=16, lr=1e-5, warmup_steps=0, mini_batch_prompts=8, micro_batch_size=16,
                phase1_steps=8, collect_step=8, collect_k=16, phase2_steps=8, val_every=2, val_k=4,
                gradient_checkpointing=False, save_every=4, log_samples=2),
}


def parse_config(argv=None) -> Config:
    """Config defaults <- preset <- command line. Every field is a `--flag`; booleans also take `--no-flag`."""
    parser = argparse.ArgumentParser(description="RLEP: GRPO with experience replay (see the module docstring)")
    choices = {"preset": sorted(presets), "phase": ["all", "1", "collect", "2"]}
    for field in fields(Config):
        kind = dict(action=argparse.BooleanOptionalAction) if field.type is bool else dict(type=field.type)
        parser.add_argument(f"--{field.name}", default=None, choices=choices.get(field.name), **kind)
    args = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    return Config(**{**presets[args.get("preset", Config.preset)], **args})


# ----------------------------------------------------------------------------------------------------------------
# Distributed setup, nanoGPT style: torchrun sets RANK; a plain `python rlep.py` gets the same names.
@dataclass
class Dist:
    ddp: bool
    rank: int
    world_size: int
    device: torch.device
    master_process: bool  # rank 0 alone prints and writes shared files


def setup_distributed() -> Dist:
    if int(os.environ.get("RANK", -1)) == -1:
        return Dist(False, 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu"), True)
    rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:  # vLLM reuses this group; with TP=1 it must exist before the engine is built (VLLM_CPU.md)
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return Dist(True, rank, world_size, device, rank == 0)


def gather_lists(items: list, d: Dist) -> list:
    """Every rank's list, concatenated in rank order, on every rank."""
    if not d.ddp:
        return items
    gathered = [None] * d.world_size
    dist.all_gather_object(gathered, items)
    return [x for part in gathered for x in part]


def all_reduce_sum(value: float, d: Dist) -> float:
    return float(sum(gather_lists([value], d)))


def barrier(d: Dist):
    if d.ddp:
        dist.barrier()


def seed_for(*keys) -> int:
    """A stable 31-bit seed from any keys. Every random draw is a function of (seed, step, ...), so a resumed
    run draws exactly what the uninterrupted run would have drawn."""
    return int.from_bytes(hashlib.sha256(repr(keys).encode()).digest()[:4], "little") >> 1


def write_atomic(path: str, text: str):
    """Write a file so that a crash leaves either the old file or the new one, never half of one."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_jsonl(path: str) -> list:
    """The rows of a JSONL file (none if it is missing), without a last line cut short by a kill."""
    rows = []
    for line in open(path) if os.path.isfile(path) else ():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return rows


def append_jsonl(path: str, rows: list):
    with open(path, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
        f.flush()
        os.fsync(f.fileno())


# ----------------------------------------------------------------------------------------------------------------
# Data: rows are {"id", "problem", "answer"}, plus "prompt" (chat messages) and "responses" (a pool) if given
def normalize_row(raw: dict, where: str) -> dict:
    """A DAPO-Math-17k row (prompt messages, reward_model.ground_truth [and .candidates]) or a plain
    {"problem", "answer" [, "responses"]} row; anything else stops with the file, row and missing field."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    if "reward_model" in raw:
        messages, reward_model = raw.get("prompt"), raw["reward_model"]
        if not (isinstance(messages, list) and messages and all(isinstance(m, dict) and {"role", "content"} <= set(m)
                                                                 for m in messages)):
            raise ValueError(f"{where}: 'prompt' must be a non-empty list of {{role, content}} messages")
        if not isinstance(reward_model, dict) or reward_model.get("ground_truth") in (None, ""):
            raise ValueError(f"{where}: missing 'reward_model.ground_truth'")
        raw = {**raw, "problem": messages[-1]["content"], "answer": reward_model["ground_truth"],
               "prompt": [{"role": m["role"], "content": m["content"]} for m in messages],
               "responses": reward_model.get("candidates")}
    for key in ("problem", "answer"):
        if raw.get(key) in (None, ""):
            raise ValueError(f"{where}: missing '{key}' (or use the DAPO schema: prompt + reward_model)")
    row = {"problem": str(raw["problem"]), "answer": str(raw["answer"])}
    row["id"] = str(raw.get("id") or hashlib.sha1(row["problem"].encode()).hexdigest()[:12])
    if isinstance(raw.get("prompt"), list):
        row["prompt"] = raw["prompt"]
    if raw.get("responses") is not None:
        if not isinstance(raw["responses"], (list, tuple)) or not all(isinstance(r, str) for r in raw["responses"]):
            raise ValueError(f"{where}: responses/candidates must be a list of strings")
        row["responses"] = list(raw["responses"])
    if raw.get("data_source"):  # eval.py scores each source of a mixed file (AIME-24/25, AMC-23) apart
        row["data_source"] = str(raw["data_source"])
    return row


def read_rows(path: str) -> list[dict]:
    """Rows of a JSONL or parquet file (or a built-in task), de-duplicated by problem text in file order."""
    if path.startswith("builtin:"):
        from builtin import builtin_rows  # the tiny and cpu presets' tasks
        return builtin_rows(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such data file")
    if not path.endswith((".parquet", ".jsonl", ".json")):
        raise ValueError(f"{path}: unknown format (use .jsonl or .parquet)")
    if path.endswith(".parquet"):
        import pyarrow.parquet  # only parquet needs it
        lines = enumerate(pyarrow.parquet.read_table(path).to_pylist(), start=1)
    else:
        lines = ((i, line) for i, line in enumerate(open(path), start=1) if line.strip())
    rows = {}
    for i, raw in lines:
        try:
            row = normalize_row(json.loads(raw) if isinstance(raw, str) else raw, f"{path}: row {i}")
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: row {i}: not valid JSON ({e.msg})") from None
        rows.setdefault(row["problem"], row)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return list(rows.values())


def render_prompt(tokenizer, row: dict, template: str, max_len: int) -> list[int]:
    """The row's chat prompt as token ids, generation prompt included, cut from the left to max_len tokens."""
    messages = row.get("prompt") or [{"role": "user", "content": template.format(problem=row["problem"])}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"][-max_len:]


def stop_token_ids(tokenizer) -> list[int]:
    """EOS and the chat template's end-of-turn token (vLLM adds the generation config's EOS ids itself)."""
    ids = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
    return sorted(i for i in ids if isinstance(i, int) and i != tokenizer.unk_token_id)


def resolve_model(path: str, cache_dir: str, d: Dist) -> str:
    """A model folder. Built-in models are built once by rank 0 into a temporary folder, renamed when complete."""
    if not path.startswith("builtin:"):
        return path
    from builtin import build_tiny_model, convert_smollm2  # the tiny and cpu presets' models
    builders = {"builtin:tiny": build_tiny_model, "builtin:smollm2": convert_smollm2}
    if path not in builders:
        raise ValueError(f"{path}: unknown built-in model; use one of {sorted(builders)}")
    out_dir = os.path.join(cache_dir, path.split(":")[1])
    if d.master_process and not os.path.isdir(out_dir):
        builders[path](f"{out_dir}.tmp{os.getpid()}")
        os.replace(f"{out_dir}.tmp{os.getpid()}", out_dir)
    barrier(d)
    return out_dir


# ----------------------------------------------------------------------------------------------------------------
# Rollouts: one vLLM engine per rank, in this process, sharing the GPU with the trainer
def build_engine(cfg: Config, model_path: str, d: Dist):
    from vllm import LLM  # imported here so the trainer's functions run on machines without vLLM

    on_gpu = d.device.type == "cuda"
    return LLM(model=model_path, dtype=cfg.dtype, seed=cfg.seed + d.rank, tensor_parallel_size=1,
               max_model_len=cfg.max_prompt_len + cfg.max_response_len,
               distributed_executor_backend="external_launcher" if d.ddp else None,  # one engine per rank
               enable_prefix_caching=True, enforce_eager=not on_gpu,
               enable_chunked_prefill=on_gpu,  # on CPU, per-request seeds crash with chunked prefill
               enable_sleep_mode=on_gpu,  # not supported on CPU
               gpu_memory_utilization=cfg.gpu_memory_utilization)


def push_weights(llm, model: torch.nn.Module):
    """The trainer's weights into the engine, in place, by vLLM's `reload_weights` (>= 0.32; `load_weights` breaks
    on CPU). A level-2 sleep dropped the engine's weights, so all are pushed, tied ones too (SmolLM2's lm_head)."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # hand the trainer's freed blocks back before vLLM re-allocates
        llm.wake_up(tags=["weights"])
    dtype = llm.llm_engine.model_config.dtype
    weights = ((name, tensor.detach().to(dtype)) for name, tensor in model.state_dict().items())
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
    if torch.cuda.is_available():
        llm.wake_up(tags=["kv_cache"])  # the scheduler resumes only when fully awake
    llm.reset_prefix_cache()  # cached prompt KV was computed by the old weights


def generate(llm, prompts: list[list[int]], n: int, temperature: float, top_p: float, max_tokens: int,
             stop_ids: list[int], seeds: list[int]) -> list[list[list[int]]]:
    """n completions (token ids) per prompt. A seed per prompt makes them independent of the batch and the engine."""
    from vllm import SamplingParams

    params = [SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed,
                             stop_token_ids=stop_ids, detokenize=False) for seed in seeds]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [[list(c.token_ids) for c in out.outputs] for out in outputs]


def sample_and_grade(llm, tokenizer, rows: list[dict], k: int, cfg: Config, stop_ids: list[int], d: Dist,
                     seed_key: tuple, temperature: float = None, top_p: float = None) -> list[dict]:
    """k graded responses per row, rows sharded over ranks (validation, eval.py, collection); all records, in order."""
    mine = rows[d.rank::d.world_size]
    prompts = [render_prompt(tokenizer, row, cfg.prompt_template, cfg.max_prompt_len) for row in mine]
    completions = generate(llm, prompts, k, cfg.temperature if temperature is None else temperature,
                           cfg.top_p if top_p is None else top_p, cfg.max_response_len, stop_ids,
                           [seed_for(*seed_key, row["id"]) for row in mine]) if mine else []
    records = []
    for row, group in zip(mine, completions):
        texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in group]
        records.append({"id": row["id"], "problem": row["problem"], "gold": row["answer"], "responses": texts,
                        "lengths": [len(ids) for ids in group], "answers": [verify.extract_answer(t) for t in texts],
                        "correct": [verify.verify(t, row["answer"], mode=cfg.verify_mode) for t in texts]})
    order = {row["id"]: j for j, row in enumerate(rows)}
    return sorted(gather_lists(records, d), key=lambda r: order[r["id"]])


# ----------------------------------------------------------------------------------------------------------------
# Rewards and advantages (DAPO soft overlong punishment; GRPO group standardisation)
@dataclass
class Sample:
    prompt_ids: list[int]
    completion_ids: list[int]
    text: str
    correct: bool
    reward: float
    replay: bool = False
    advantage: float = 0.0


def overlong_penalty(length: int, max_len: int, buffer_len: int, factor: float = 1.0) -> float:
    """0 up to max_len - buffer_len tokens, then linear down to -factor at max_len (DAPO Eq. 13)."""
    if buffer_len <= 0:
        return 0.0
    return -factor * min(1.0, max(0, length - (max_len - buffer_len)) / buffer_len)


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """Â_i = (R_i - mean(R)) / (std(R) + eps) within each group of consecutive `group_size` rewards, with the
    unbiased std (torch.std, as verl). Examples: R = [1, -1, -1, -1] gives [1.5, -0.5, -0.5, -0.5];
    an all-equal group gives zeros (no signal). RLEP: 16 wrong fresh + 2 correct replays give -0.34 / +2.75."""
    groups = rewards.view(-1, group_size)  # (num_groups, G)
    mean = groups.mean(dim=1, keepdim=True)  # (num_groups, 1)
    std = groups.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(mean)  # (num_groups, 1)
    return ((groups - mean) / (std + eps)).view(-1)  # (num_groups * G,)


# ----------------------------------------------------------------------------------------------------------------
# Loss: the DAPO objective (clip-higher, dual clip, token mean); no KL term and no reference model
def policy_loss(logprobs, old_logprobs, advantages, mask, clip_low=0.2, clip_high=0.28, clip_c=10.0,
                num_tokens=None):
    """
    L(θ) = -1/N Σ_i Σ_t m_it · min( r_it Â_i, clip(r_it, 1 - ε_low, 1 + ε_high) Â_i ),  r_it = π_θ / π_θold
    with dual clip: where Â_i < 0 the per-token loss is capped at -c·Â_i (huge ratios cannot blow it up).
    N is the token-count normalizer: all response tokens of the mini-batch, on all ranks (DAPO's token mean).
    It is an argument because a micro-batch sees only part of the mini-batch; default: mask.sum().
    logprobs, old_logprobs, mask: (B, T); advantages: (B,). Returns (loss, metrics).
    """
    mask = mask.to(logprobs.dtype)  # (B, T) m_it, 1 on response tokens (EOS included)
    num_tokens = mask.sum() if num_tokens is None else num_tokens  # N
    adv = advantages.unsqueeze(1)  # (B, 1) Â_i, shared by every token of response i
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)  # (B, T) keeps exp finite, as verl does
    ratio = torch.exp(log_ratio)  # (B, T) r_it
    loss_unclipped = -adv * ratio  # (B, T) -r Â
    loss_clipped = -adv * ratio.clamp(1 - clip_low, 1 + clip_high)  # (B, T) -clip(r, 1-ε_low, 1+ε_high) Â
    pessimistic = torch.maximum(loss_unclipped, loss_clipped)  # (B, T) PPO's pessimistic bound
    dual_clipped = torch.minimum(pessimistic, -adv * clip_c)  # (B, T) -c Â caps it when Â < 0
    per_token_loss = torch.where(adv < 0, dual_clipped, pessimistic)  # (B, T)
    loss = (per_token_loss * mask).sum() / num_tokens  # scalar, token mean
    with torch.no_grad():
        def share(flags):  # the fraction of response tokens where a flag holds
            return ((flags.to(mask.dtype) * mask).sum() / mask.sum().clamp(min=1)).item()
        metrics = {"clip_frac": share(loss_clipped > loss_unclipped),
                   "dual_clip_frac": share(per_token_loss < pessimistic), "ratio_mean": share(ratio)}
    return loss, metrics


class TokenLogProbs(torch.nn.Module):
    """The policy as a function: log π_θ(o_t | q, o_<t) with logits / T. The LM head runs on chunks of response
    tokens only: with a 152k vocabulary, (B, L, V) logits would be the largest tensor of the step."""

    def __init__(self, model, temperature: float, chunk_tokens: int = 1024):
        super().__init__()
        self.model, self.temperature, self.chunk_tokens = model, temperature, chunk_tokens

    def _chunk_logps(self, hidden, targets):  # (N, H), (N,) -> (N,)
        logits = self.model.lm_head(hidden).float() / self.temperature  # (N, V)
        return logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (N,)

    def forward(self, input_ids, attention_mask, completion_mask):  # (B, L) each -> (B, L-1)
        hidden = self.model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        predicts = completion_mask[:, 1:].bool()  # (B, L-1) position t-1 predicts response token t
        hidden, targets = hidden[:, :-1][predicts], input_ids[:, 1:][predicts]  # (N, H), (N,)
        logps = [torch.utils.checkpoint.checkpoint(  # recomputed in backward: one chunk of logits at a time
            self._chunk_logps, hidden[i:i + self.chunk_tokens], targets[i:i + self.chunk_tokens], use_reentrant=False)
            for i in range(0, targets.numel(), self.chunk_tokens)]
        out = hidden.new_zeros(predicts.shape, dtype=torch.float32)  # (B, L-1)
        out[predicts] = torch.cat(logps) if logps else out.new_zeros(0)
        return out


def collate(samples: list[Sample], pad_id: int, device) -> dict:
    """Right-padded [prompt | response] rows: positions start at 0, as in vLLM, so the log-probs match."""
    shape = (len(samples), max(len(s.prompt_ids) + len(s.completion_ids) for s in samples))  # (B, L)
    batch = {"input_ids": torch.full(shape, pad_id), "attention_mask": torch.zeros(shape, dtype=torch.long),
             "completion_mask": torch.zeros(shape, dtype=torch.long),  # (B, L) each
             "advantages": torch.tensor([s.advantage for s in samples], dtype=torch.float32)}  # (B,)
    for i, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        batch["input_ids"][i, :p + c] = torch.tensor(s.prompt_ids + s.completion_ids)
        batch["attention_mask"][i, :p + c] = 1
        batch["completion_mask"][i, p:p + c] = 1
    return {k: v.to(device) for k, v in batch.items()}


def ppo_update(policy, optimizer, samples: list[Sample], sequences_per_update: int, cfg: Config, d: Dist,
               pad_id: int, rng: np.random.Generator) -> dict:
    """One training step: π_θold log-probs from the policy at the start of the step (replays included), then
    `epochs` passes of clipped updates over shuffled mini-batches of `sequences_per_update` sequences."""
    autocast = torch.autocast(d.device.type, dtype=getattr(torch, cfg.dtype), enabled=cfg.dtype != "float32",
                              cache_enabled=False)  # a cache of bf16 weight copies would cost 13 GiB for 7B
    num_updates = max(1, round(all_reduce_sum(len(samples), d) / sequences_per_update))
    stats = {"grad_norm": [], "clip_frac": [], "dual_clip_frac": [], "ratio_mean": [], "skipped_updates": []}
    for _ in range(cfg.epochs):
        mini_batches = [[collate([samples[j] for j in chunk[i:i + cfg.micro_batch_size]], pad_id, d.device)
                         for i in range(0, len(chunk), cfg.micro_batch_size)]
                        for chunk in np.array_split(rng.permutation(len(samples)), num_updates)]
        with torch.no_grad(), autocast:  # the update's micro-batch layout, so the first ratio is exactly 1
            for batch in (b for micro_batches in mini_batches for b in micro_batches):
                batch["old_logprobs"] = policy(batch["input_ids"], batch["attention_mask"], batch["completion_mask"])
        for micro_batches in mini_batches:
            num_tokens = all_reduce_sum(sum(b["completion_mask"][:, 1:].sum().item() for b in micro_batches), d)  # N
            for batch in micro_batches:
                with autocast:
                    logprobs = policy(batch["input_ids"], batch["attention_mask"], batch["completion_mask"])
                    loss, metrics = policy_loss(logprobs, batch["old_logprobs"], batch["advantages"],
                                                batch["completion_mask"][:, 1:], cfg.clip_low, cfg.clip_high,
                                                cfg.clip_c, num_tokens=num_tokens)
                    loss.backward()
                for key, value in metrics.items():
                    stats[key].append(value)
            for p in policy.parameters() if d.ddp else ():  # each rank's loss is its tokens' share of the
                dist.all_reduce(p.grad)  # global token mean, so the sum over ranks is the mini-batch's gradient
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip).item()
            if math.isfinite(grad_norm):  # a NaN/inf gradient would poison AdamW's moments: skip it, as verl
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            stats["grad_norm"].append(grad_norm)
            stats["skipped_updates"].append(not math.isfinite(grad_norm))
    return {k: float(np.sum(v) if k == "skipped_updates" else np.mean(v)) for k, v in stats.items()}


# ----------------------------------------------------------------------------------------------------------------
# Replay buffer: the experience pool, a list of rows whose "responses" are verified answers (pool.jsonl)
def draw_replays(responses: list[str], m: int, rng: np.random.Generator) -> list[str]:
    """RLEP: m pooled successes, uniformly without replacement, drawn anew each time the prompt comes up."""
    if len(responses) <= m:  # RLEP: the authors' code takes them all
        return list(responses)
    return [responses[i] for i in rng.choice(len(responses), size=m, replace=False)]  # RLEP: without replacement


def build_group(row: dict, prompt_ids: list[int], completions: list[list[int]], tokenizer, cfg: Config,
                replay_rng: np.random.Generator | None = None) -> list[Sample]:
    """A prompt's group: its n fresh rollouts plus (in phase two) m replayed successes, which become sequences
    again (re-tokenized, EOS appended, cut to L_max). Every response gets the reward R = +1 / -1 (verify.py) +
    the overlong penalty (its length counts EOS); the advantages are standardised over the whole group."""
    replays = draw_replays(row["responses"], cfg.replay_m, replay_rng) if replay_rng is not None else []  # RLEP: m
    replayed_ids = [(tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id])[:cfg.max_response_len]
                    for text in replays]  # RLEP: re-tokenized, EOS appended
    group = []
    for ids, replay in [(ids, False) for ids in completions] + [(ids, True) for ids in replayed_ids]:  # RLEP: n + m
        text = tokenizer.decode(ids, skip_special_tokens=True)
        correct = verify.verify(text, row["answer"], mode=cfg.verify_mode)
        penalty = overlong_penalty(len(ids), cfg.max_response_len, cfg.overlong_buffer, cfg.overlong_factor)
        group.append(Sample(prompt_ids, ids, text, correct, (1.0 if correct else -1.0) + penalty, replay))
    advantages = group_advantages(torch.tensor([s.reward for s in group]), len(group))  # (n + m,) RLEP: G' = n + m
    for sample, advantage in zip(group, advantages.tolist()):
        sample.advantage = advantage
    return group


def save_pool(path: str, rows: list[dict]):
    keys = ("id", "problem", "answer", "responses", "prompt")
    write_atomic(path, "".join(json.dumps({k: r[k] for k in keys if k in r}) + "\n" for r in rows))


def load_pool(path: str) -> list[dict]:
    """A pool file: our pool.jsonl, or any data file whose rows carry responses (DAPO: reward_model.candidates)."""
    rows = [r for r in read_rows(path) if r.get("responses")]
    if not rows:
        raise ValueError(f"{path}: no row has pooled responses ('responses' or 'reward_model.candidates')")
    return rows


# ----------------------------------------------------------------------------------------------------------------
# Phase one: GRPO/DAPO training from the base model (phase two runs the same loop with replay=True)
def checkpoint_path(part_dir: str, step: int) -> str:
    return os.path.join(part_dir, f"step_{step:06d}")


def latest_checkpoint(part_dir: str) -> tuple[int, str | None]:
    """The newest complete checkpoint; a save cut short left only a `.tmp` folder, which is ignored."""
    steps = [int(name[5:]) for name in os.listdir(part_dir) if name.startswith("step_") and name[5:].isdigit()
             and os.path.isfile(os.path.join(part_dir, name, "trainer_state.pt"))] if os.path.isdir(part_dir) else []
    return (max(steps), checkpoint_path(part_dir, max(steps))) if steps else (0, None)


def save_checkpoint(part_dir: str, step: int, model, optimizer, tokenizer, cfg: Config, d: Dist):
    """A Hugging Face folder plus the trainer state, saved under a temporary name: a crash keeps the last good one."""
    if hasattr(optimizer, "consolidate_state_dict"):  # ZeRO-1: gather the shards on rank 0 (a collective)
        optimizer.consolidate_state_dict(to=0)
    if d.master_process:
        final, tmp = checkpoint_path(part_dir, step), checkpoint_path(part_dir, step) + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        torch.save({"optimizer": optimizer.state_dict(), "step": step, "torch_rng": torch.get_rng_state()},
                   os.path.join(tmp, "trainer_state.pt"))  # data order and replay draws derive from the step
        write_atomic(os.path.join(tmp, "rlep_config.json"), json.dumps(asdict(cfg), indent=2))
        shutil.rmtree(final, ignore_errors=True)  # the same step saved again after a resume
        os.replace(tmp, final)
    barrier(d)


def make_optimizer(model, cfg: Config, d: Dist):
    kwargs = dict(lr=cfg.lr, betas=(0.9, 0.999), weight_decay=cfg.weight_decay)
    if d.ddp and cfg.zero1:  # ZeRO-1: each rank keeps 1/world of AdamW's fp32 moments (README: memory budget)
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, **kwargs)
    return torch.optim.AdamW(model.parameters(), **kwargs)


def step_prompts(num_rows: int, prompts_per_step: int, step: int, seed: int) -> list[int]:
    """Row indices of a training step: each epoch visits every row once, in its own random order."""
    epoch, offset = divmod(step, num_rows // prompts_per_step)
    order = np.random.default_rng(seed_for(seed, "epoch", epoch)).permutation(num_rows)
    return order[offset * prompts_per_step:(offset + 1) * prompts_per_step].tolist()


def validate(llm, tokenizer, val_rows, cfg, stop_ids, d, step) -> float:
    """avg@val_k on the validation rows, never with replays. The seed depends on the step only, so both
    phases draw the same random numbers at the same step: their curves differ by the policy, not the draw."""
    records = sample_and_grade(llm, tokenizer, val_rows, cfg.val_k, cfg, stop_ids, d, (cfg.seed, "val", step))
    return float(np.mean([c for r in records for c in r["correct"]]))


def train(cfg: Config, part: str, rows: list[dict], llm, tokenizer, stop_ids, base_path: str, d: Dist,
          val_rows: list[dict], replay: bool = False):
    """Train from the base model (or the part's last checkpoint); with replay, rows carry pooled responses."""
    from transformers import AutoModelForCausalLM

    part_dir = os.path.join(cfg.out_dir, part)
    steps = cfg.phase2_steps if replay else cfg.phase1_steps
    start, ckpt = latest_checkpoint(part_dir)
    if start >= steps:
        return
    if len(rows) < cfg.prompts_per_step or cfg.prompts_per_step % d.world_size:
        raise ValueError(f"{part}: {len(rows)} prompts; prompts_per_step={cfg.prompts_per_step} must be at most "
                         f"that and a multiple of the {d.world_size} ranks")
    os.makedirs(part_dir, exist_ok=True)
    metrics_path, samples_path = os.path.join(part_dir, "metrics.jsonl"), os.path.join(part_dir, "samples.jsonl")
    for path in (metrics_path, samples_path) if d.master_process else ():  # forget steps logged after the
        kept = [row for row in read_jsonl(path) if row["step"] <= start]  # checkpoint: they are trained again
        write_atomic(path, "".join(json.dumps(row) + "\n" for row in kept))
    model = AutoModelForCausalLM.from_pretrained(ckpt or base_path, dtype=torch.float32).to(d.device)
    model.config.use_cache = False
    model.train()  # from_pretrained returns eval mode, where transformers skips gradient checkpointing
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy, optimizer = TokenLogProbs(model, cfg.temperature), make_optimizer(model, cfg, d)
    if ckpt:
        state = torch.load(os.path.join(ckpt, "trainer_state.pt"), map_location=d.device, weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
    push_weights(llm, model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if start == 0 and cfg.val_every:  # the curve starts at the base model
        val_acc = validate(llm, tokenizer, val_rows, cfg, stop_ids, d, 0)
        if d.master_process:
            write_atomic(metrics_path, json.dumps({"step": 0, "val_acc": val_acc}) + "\n")
    bar = tqdm(range(start, steps), initial=start, total=steps, desc=part, disable=not d.master_process)
    for step in bar:
        timer = time.time()
        lr = cfg.lr * min(1.0, step / cfg.warmup_steps) if cfg.warmup_steps > 0 else cfg.lr  # 0 on step 1
        for group in optimizer.param_groups:
            group["lr"] = lr
        mine = step_prompts(len(rows), cfg.prompts_per_step, step, cfg.seed)[d.rank::d.world_size]  # this rank's share
        batch_rows = [rows[i] for i in mine]
        prompts = [render_prompt(tokenizer, row, cfg.prompt_template, cfg.max_prompt_len) for row in batch_rows]
        completions = generate(llm, prompts, cfg.n, cfg.temperature, cfg.top_p, cfg.max_response_len, stop_ids,
                               [seed_for(cfg.seed, part, step, row["id"]) for row in batch_rows])
        if torch.cuda.is_available():
            llm.sleep(level=2)  # drop vLLM's weights and KV cache while the trainer needs the memory
        t_generate, timer = time.time() - timer, time.time()

        rng = np.random.default_rng(seed_for(cfg.seed, part, step, d.rank))
        groups = [build_group(row, prompt_ids, group_ids, tokenizer, cfg, rng if replay else None)  # RLEP: replays
                  for row, prompt_ids, group_ids in zip(batch_rows, prompts, completions)]
        samples = [s for group in groups for s in group]
        fresh = [s for s in samples if not s.replay]
        totals = {"samples": len(samples), "fresh": len(fresh), "correct": sum(s.correct for s in fresh),
                  "tokens": sum(len(s.completion_ids) for s in fresh), "reward": sum(s.reward for s in samples),
                  "groups": len(groups), "zero_std": sum(all(s.advantage == 0 for s in g) for g in groups),
                  "rescued": sum(any(s.correct for s in g if s.replay)  # RLEP: fresh all wrong, replays right
                                 and not any(s.correct for s in g if not s.replay) for g in groups)}
        totals = {k: sum(rank_totals[k] for rank_totals in gather_lists([totals], d)) for k in totals}  # one collective
        t_score, timer = time.time() - timer, time.time()

        per_prompt = cfg.n + cfg.replay_m if replay and cfg.equal_updates else cfg.n  # RLEP: paper: 9 updates, not 8
        stats = ppo_update(policy, optimizer, samples, cfg.mini_batch_prompts * per_prompt, cfg, d, pad_id, rng)
        t_train, timer = time.time() - timer, time.time()
        push_weights(llm, model)
        t_sync = time.time() - timer

        record = {"step": step + 1, "lr": lr, "reward_mean": totals["reward"] / totals["samples"],
                  "acc_fresh": totals["correct"] / totals["fresh"], "response_len": totals["tokens"] / totals["fresh"],
                  "zero_std_frac": totals["zero_std"] / totals["groups"],
                  "replay_frac": 1 - totals["fresh"] / totals["samples"],  # RLEP: m / (n + m)
                  "rescued_prompts": totals["rescued"],  # RLEP: signal only from replays
                  **stats, "t_generate": t_generate, "t_score": t_score, "t_train": t_train, "t_sync": t_sync}
        if d.ddp:  # a cheap guard against silent desynchronisation: every rank must hold the same weights
            checksum = sum(p.double().sum().item() for p in model.parameters())
            record["ranks_in_sync"] = len(set(gather_lists([checksum], d))) == 1
        if cfg.val_every and (step + 1) % cfg.val_every == 0:
            record["val_acc"] = validate(llm, tokenizer, val_rows, cfg, stop_ids, d, step + 1)
        if d.master_process:
            append_jsonl(metrics_path, [record])
            append_jsonl(samples_path, [{"step": step + 1, "prompt": tokenizer.decode(s.prompt_ids),
                                         "response": s.text, "reward": s.reward} for s in fresh[:cfg.log_samples]])
            shown = [k for k in ("reward_mean", "acc_fresh", "response_len", "replay_frac", "clip_frac", "grad_norm",
                                 "val_acc", "t_generate", "t_train") if k in record]
            bar.write(f"{part} step {step + 1}/{steps} | " + " | ".join(f"{k} {record[k]:.3g}" for k in shown))
        if (step + 1) % cfg.save_every == 0 or step + 1 == steps:
            save_checkpoint(part_dir, step + 1, model, optimizer, tokenizer, cfg, d)
    if torch.cuda.is_available():
        llm.sleep(level=2)


# ----------------------------------------------------------------------------------------------------------------
# Collection: the phase-one checkpoint answers every training prompt K times; verified successes form the pool
def collect(cfg: Config, rows: list[dict], llm, tokenizer, stop_ids, d: Dist):
    """RLEP: build the experience pool from the phase-one checkpoint at `collect_step`. Each chunk's successes
    are appended to progress.jsonl, so a stopped collection resumes; pool.jsonl is written once, at the end."""
    from transformers import AutoModelForCausalLM

    out = os.path.join(cfg.out_dir, "collect")
    pool_path, progress_path = os.path.join(out, "pool.jsonl"), os.path.join(out, "progress.jsonl")
    if os.path.isfile(pool_path):
        return
    ckpt = checkpoint_path(os.path.join(cfg.out_dir, "phase1"), cfg.collect_step)
    if not os.path.isdir(ckpt):
        raise FileNotFoundError(f"{ckpt}: phase one has no checkpoint at --collect_step {cfg.collect_step}")
    os.makedirs(out, exist_ok=True)
    push_weights(llm, AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32))  # RLEP: the seed policy
    successes = dict(read_jsonl(progress_path))  # prompt id -> verified answers, from an earlier attempt
    todo = [row for row in rows if row["id"] not in successes]
    for start in tqdm(range(0, len(todo), cfg.prompts_per_step), desc="collect", disable=not d.master_process):
        records = sample_and_grade(llm, tokenizer, todo[start:start + cfg.prompts_per_step], cfg.collect_k, cfg,
                                   stop_ids, d, (cfg.seed, "collect"), cfg.collect_temperature, cfg.collect_top_p)
        found = [[r["id"], [t for t, ok in zip(r["responses"], r["correct"]) if ok]] for r in records]  # RLEP: verified
        successes.update(found)
        if d.master_process:
            append_jsonl(progress_path, found)
    if torch.cuda.is_available():
        llm.sleep(level=2)
    pool = [{**row, "responses": successes[row["id"]]} for row in rows
            if len(successes[row["id"]]) >= cfg.min_successes]  # RLEP: only prompts with >= 2 successes
    if not pool:
        raise RuntimeError(f"empty experience pool: no prompt got {cfg.min_successes} verified answers out of "
                           f"{cfg.collect_k} from {ckpt}. Train phase one longer or raise --collect_k.")
    if d.master_process:
        save_pool(pool_path, pool)
    barrier(d)


# ----------------------------------------------------------------------------------------------------------------
# Phase two: restart from the base model on the pool's prompts, each group n fresh + m replayed
def phase_two(cfg: Config, pool: list[dict], pool_path: str, llm, tokenizer, stop_ids, base_path: str, d: Dist,
              val_rows):
    """RLEP: the prompts of phase two are the pool's; its statistics are printed and saved first."""
    lengths = [len(tokenizer.encode(t, add_special_tokens=False)) for row in pool for t in row["responses"]]
    stats = {"pool": pool_path, "prompts": len(pool), "responses_per_prompt": len(lengths) / len(pool),
             "mean_response_tokens": float(np.mean(lengths))}
    if d.master_process:
        print(json.dumps(stats))
        write_atomic(os.path.join(cfg.out_dir, "pool_stats.json"), json.dumps(stats, indent=2))
    train(cfg, "phase2", pool, llm, tokenizer, stop_ids, base_path, d, val_rows, replay=True)  # RLEP: from π_θ0


# ----------------------------------------------------------------------------------------------------------------
# main: phase one, collection, phase two, in one command; each part resumes on its own
def run(cfg: Config, d: Dist):
    from transformers import AutoTokenizer

    config_path = os.path.join(cfg.out_dir, "config.json")
    if os.path.exists(config_path) and not cfg.resume:
        raise FileExistsError(f"{cfg.out_dir} already holds a run: pass --resume to continue it, or another --out_dir")
    barrier(d)  # every rank looks before rank 0 writes
    if d.master_process:
        os.makedirs(cfg.out_dir, exist_ok=True)
        write_atomic(config_path, json.dumps(asdict(cfg), indent=2))
    model_path = resolve_model(cfg.model_path, cfg.cache_dir, d)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    stop_ids = stop_token_ids(tokenizer)
    train_rows = read_rows(cfg.train_file) if cfg.phase in ("all", "1", "collect") else []
    val_rows = read_rows(cfg.val_file)[:cfg.val_max_problems or None] if cfg.val_every else []
    given_pool = load_pool(cfg.pool) if cfg.pool else None  # read once; a bad file stops the run now
    if given_pool is None and cfg.phase1_prompts == "pool" and cfg.phase in ("all", "1"):
        raise ValueError("--phase1_prompts pool needs --pool FILE (the prompt set to train the baseline on)")
    llm = build_engine(cfg, model_path, d)
    if torch.cuda.is_available():
        llm.sleep(level=2)  # free the GPU for the trainer; push_weights wakes it with the trainer's weights

    if cfg.phase in ("all", "1"):
        rows = given_pool if cfg.phase1_prompts == "pool" else train_rows
        train(cfg, "phase1", rows, llm, tokenizer, stop_ids, model_path, d, val_rows)
    if cfg.phase in ("all", "collect") and not cfg.pool:
        collect(cfg, train_rows, llm, tokenizer, stop_ids, d)
    if cfg.phase in ("all", "2"):
        pool_path = cfg.pool or os.path.join(cfg.out_dir, "collect", "pool.jsonl")
        pool = given_pool or load_pool(pool_path)
        phase_two(cfg, pool, pool_path, llm, tokenizer, stop_ids, model_path, d, val_rows)
    llm.llm_engine.engine_core.shutdown()  # before the process group goes: vLLM tears down its own groups
    if cfg.phase == "all" and cfg.val_every and d.master_process:  # the paper's comparison, for this run
        from eval import compare_phases
        print(compare_phases([cfg.out_dir], os.path.join(cfg.out_dir, "compare.png")))


def main(argv=None):
    cfg = parse_config(argv)
    d = setup_distributed()
    try:
        run(cfg, d)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
