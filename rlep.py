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
        --train_file dapo-math-17k.parquet --val_file dapo_format_aime2024_aime2025_amc2023.parquet
    torchrun --nnodes=8 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 rlep.py --preset paper ...
Every Config field is a flag (`--lr 2e-6`; `--phase 2 --pool FILE` runs one part); `--resume` continues a run.

Deviations from the paper (and its verl code):
1. torchrun and FSDP2 (weights, gradients, AdamW state sharded) with one in-process vLLM engine per rank, not Ray.
2. The loss is the exact token mean over each mini-batch; verl's per-micro-batch mean weighs long responses less.
3. The collection code was never published: ours keeps prompts with >= `min_successes` verified answers of K.
4. The tiny and cpu presets grade with verify.py's equivalence checker; the paper preset with the paper's rule.
5. A prompt with fewer than m pooled answers replays all it has; verl pads with empty responses scored -1.
6. Training prompts are de-duplicated and shuffled per epoch; the paper's file repeats each one ~100 times.
7. Mini-batches are whole groups in a seeded prompt order; verl's are ranges of a token-balanced order.
"""
import os

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine lives in this process: pushes pass tensors by reference
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; left unset, vLLM-CPU reserves 90 % of RAM
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # quiet by default; VLLM_LOGGING_LEVEL=INFO shows vLLM's log
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' load and save bars

import argparse, collections, contextlib, datetime, hashlib, json, logging, math, re, shutil, time, warnings
from dataclasses import asdict, dataclass, fields

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import verify

warnings.filterwarnings("ignore", category=FutureWarning, module="vllm")
logging.getLogger("torch._library.triton").setLevel(logging.ERROR)  # "Triton not available", when vLLM-CPU loads

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
    val_file: str = "dapo_format_aime2024_aime2025_amc2023.parquet"  # AIME-24, AIME-25, AMC-23: avg@val_k per source
    prompt_template: str = dapo_template  # user message for plain {"problem", "answer"} rows
    out_dir: str = "runs/paper"  # run folder: config, one subfolder per part, checkpoints, metrics
    # rollouts
    prompts_per_step: int = 512  # B, prompts per training step (train_batch_size)
    n: int = 16  # G, fresh rollouts per prompt
    temperature: float = 1.0  # T, sampling temperature; log-probs use logits / T
    top_p: float = 1.0  # nucleus sampling threshold
    max_prompt_len: int = 1024  # prompt tokens (longer prompts are cut from the left)
    max_response_len: int = 3072  # L_max, response tokens including the final EOS
    stop_token: str = ""  # "": a response ends at the model's EOS, as the authors'; else at this token too
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
    micro_batch_size: int = 8  # sequences per forward/backward on one rank (memory, not math: README budget)
    share_prompts: bool = False  # one row per prompt and its responses (block-causal mask): for short responses
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
    verify_mode: str = "dapo"  # reward and metric: "dapo" (the paper's string match) or "default" (equivalence)
    # system
    phase: str = "all"  # all | 1 | collect | 2
    resume: bool = False  # continue the run in out_dir from its last checkpoints
    seed: int = 1  # every random draw derives from (seed, step, ...): see seed_for
    dtype: str = "auto"  # compute (autocast) and vLLM dtype; "auto": bf16 where the hardware has it, else fp32
    gradient_checkpointing: bool = True  # recompute activations in backward: memory for compute
    gpu_memory_utilization: float = 0.55  # vLLM's share of each GPU (weights + KV cache; README budget)
    timeout_minutes: int = 180  # collective timeout: ranks wait this long for one that generates longer
    save_every: int = 20  # checkpoint every N steps (and at the end of each part)
    log_samples: int = 2  # completions written to samples.jsonl per step
    cache_dir: str = ".cache/rlep"  # where built-in models are built or converted
    preset: str = "cpu"  # paper | tiny | cpu (applied before the other command-line flags)

presets = {
    "paper": {},
    # A tiny random Qwen2 given a few seconds of supervised warm-up, on single-digit sums: tests and smoke runs.
    "tiny": dict(model_path="builtin:tiny", train_file="builtin:tiny:train", val_file="builtin:tiny:val",
                 prompt_template="{problem}", out_dir="runs/tiny", prompts_per_step=8, n=8, max_prompt_len=32,
                 max_response_len=16, overlong_buffer=4, lr=3e-4, warmup_steps=0, mini_batch_prompts=4,
                 micro_batch_size=16, share_prompts=True, phase1_steps=4, collect_step=4, collect_k=16, phase2_steps=4,
                 val_every=2, val_k=4, verify_mode="default", dtype="float32", save_every=2, log_samples=1),
    # SmolLM2-135M-Instruct (shipped on PyPI as GGUF) on built-in arithmetic: the real thing on a laptop CPU.
    "cpu": dict(model_path="builtin:smollm2", train_file="builtin:arith:train", val_file="builtin:arith:val",
                out_dir="runs/cpu", prompts_per_step=8, n=8, max_prompt_len=160, max_response_len=48,
                overlong_buffer=16, lr=1e-5, warmup_steps=0, mini_batch_prompts=8, micro_batch_size=40,
                share_prompts=True, phase1_steps=6, collect_step=6, collect_k=8, phase2_steps=6, val_every=2,
                val_k=4, verify_mode="default", gradient_checkpointing=False, save_every=6, log_samples=2),
}

def parse_config(argv=None) -> Config:
    """Config defaults <- preset <- command line. Every field is a `--flag`; booleans also take `--no-flag`."""
    parser = argparse.ArgumentParser(description="RLEP: GRPO with experience replay (see the module docstring)")
    choices = {"preset": sorted(presets), "phase": ["all", "1", "collect", "2"], "verify_mode": ["dapo", "default"]}
    for field in fields(Config):
        kind = dict(action=argparse.BooleanOptionalAction) if field.type is bool else dict(type=field.type)
        parser.add_argument(f"--{field.name}", default=None, choices=choices.get(field.name), **kind)
    args = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    return Config(**{**presets[args.get("preset", Config.preset)], **args})

def resolve_dtype(dtype: str, device: torch.device) -> tuple[str, str]:
    """'auto': bfloat16 on a GPU or a CPU with native bf16 matmuls, else float32 (emulated bf16 is ~5x slower)."""
    native = (torch.backends.cpu.get_cpu_capability() == "AVX512"  # ATEN_CPU_CAPABILITY=avx2 makes it say AVX2
              and (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()))  # AVX512-BF16, AMX
    if dtype != "auto" or device.type == "cuda":
        return (dtype, "set by --dtype") if dtype != "auto" else ("bfloat16", "GPU")
    return ("bfloat16", "this CPU has native bf16 matmuls") if native else \
        ("float32", "this CPU has no native bf16 matmul (AVX512-BF16 or AMX); --dtype bfloat16 overrides")

# ----------------------------------------------------------------------------------------------------------------
# Distributed setup, nanoGPT style: torchrun sets RANK; a plain `python rlep.py` gets the same names.
# ddp: under torchrun (the policy is sharded with FSDP2); master_process: rank 0, which alone prints and writes files
Dist = collections.namedtuple("Dist", ["ddp", "rank", "world_size", "device", "master_process"])

def setup_distributed(timeout_minutes: int = 180) -> Dist:
    if int(os.environ.get("RANK", -1)) == -1:
        return Dist(False, 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu"), True)
    rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    timeout = datetime.timedelta(minutes=timeout_minutes)  # NCCL's default can be shorter than a rank's generation
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device, timeout=timeout)
    else:  # vLLM reuses this group; with TP=1 it must exist before the engine is built (VLLM_CPU.md)
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    return Dist(True, rank, world_size, device, rank == 0)

def gather_lists(items: list, d: Dist) -> list:
    """Every rank's list, concatenated in rank order, on every rank."""
    if not d.ddp:
        return items
    gathered = [None] * d.world_size
    dist.all_gather_object(gathered, items)
    return [x for part in gathered for x in part]

def barrier(d: Dist):
    if d.ddp:
        dist.barrier()

def seed_for(*keys) -> int:
    """A stable 31-bit seed. Every random draw is a function of (seed, step, ...): a resumed run draws the same."""
    return int.from_bytes(hashlib.sha256(repr(keys).encode()).digest()[:4], "little") >> 1

time_spent = collections.Counter()  # seconds per part of this process's run: the time table at its end
base_scores = {}  # base model -> its validation at step 0: one run's phases share it

@contextlib.contextmanager
def clock(part: str, step_times: dict = None):
    start = time.perf_counter()
    yield
    time_spent[part] += time.perf_counter() - start
    if step_times is not None:
        step_times[f"t_{part}"] = time.perf_counter() - start

def write_atomic(path: str, text: str):
    """Write a file so that a crash leaves either the old file or the new one, never half of one."""
    with open(f"{path}.tmp{os.getpid()}", "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(f"{path}.tmp{os.getpid()}", path)

def read_jsonl(path: str) -> list:
    """The rows of a JSONL file (none if it is missing), without a last line cut short by a kill."""
    rows = []
    for line in open(path) if os.path.isfile(path) else ():
        with contextlib.suppress(json.JSONDecodeError):
            rows.append(json.loads(line))
    return rows

def append_jsonl(path: str, rows: list):
    with open(path, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
        f.flush()
        os.fsync(f.fileno())

# ----------------------------------------------------------------------------------------------------------------
# Data: rows are {"id", "problem", "answer"}, plus "prompt" (chat messages) and "responses" (a pool) if given
def normalize_row(raw: dict, where: str) -> dict:
    """A DAPO row (prompt, reward_model.ground_truth [.candidates]) or {"problem", "answer" [, "responses"]}."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    if "reward_model" in raw:  # the DAPO schema
        messages, reward_model = raw.get("prompt"), raw["reward_model"]
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and {"role", "content"} <= set(m) for m in messages):
            raise ValueError(f"{where}: 'prompt' must be a non-empty list of {{role, content}} messages")
        if not isinstance(reward_model, dict) or reward_model.get("ground_truth") in (None, ""):
            raise ValueError(f"{where}: missing 'reward_model.ground_truth'")
        raw = {**raw, "problem": messages[-1]["content"], "answer": reward_model["ground_truth"],
               "prompt": [{"role": m["role"], "content": m["content"]} for m in messages],
               "responses": reward_model.get("candidates")}
    for key in ("problem", "answer"):
        if raw.get(key) in (None, ""):
            raise ValueError(f"{where}: missing '{key}' (or use the DAPO schema: prompt + reward_model)")
    responses = raw.get("responses")
    if responses is not None and not (isinstance(responses, (list, tuple))
                                      and all(isinstance(r, str) for r in responses)):
        raise ValueError(f"{where}: responses/candidates must be a list of strings")
    row = {"id": str(raw.get("id") or hashlib.sha1(str(raw["problem"]).encode()).hexdigest()[:12]),
           "problem": str(raw["problem"]), "answer": str(raw["answer"]),
           "prompt": raw["prompt"] if isinstance(raw.get("prompt"), list) else None,
           "responses": None if responses is None else list(responses),
           "data_source": str(raw["data_source"]) if raw.get("data_source") else None}  # validation: per source
    return {k: v for k, v in row.items() if v is not None}

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

def end_token_id(tokenizer, stop_token: str) -> int:
    """The token that ends a response, fresh or replayed: EOS (the authors pass no stop tokens) or `stop_token`."""
    token_id = tokenizer.convert_tokens_to_ids(stop_token) if stop_token else tokenizer.eos_token_id
    if not isinstance(token_id, int) or (stop_token and token_id == tokenizer.unk_token_id):
        raise ValueError(f"--stop_token {stop_token!r}: not a single token of {tokenizer.name_or_path}")
    return token_id

# ----------------------------------------------------------------------------------------------------------------
# Rollouts: one vLLM engine per rank, in this process, sharing the device with the trainer
class Engine:
    """The rank's vLLM engine. `sleeps` is the one switch for the GPU-only behaviour (a level-2 sleep while training);
    guards make its silent failures loud: a weight a push missed, `generate` while asleep (it would hang)."""

    def __init__(self, llm, sleeps: bool):
        self.llm, self.sleeps, self.dtype = llm, sleeps, llm.llm_engine.model_config.dtype

    def sleep(self):
        if self.sleeps:
            self.llm.sleep(level=2)

    def load(self, model: torch.nn.Module = None, path: str = None):
        """The trainer's weights (a full tensor at a time, FSDP gathering each) or a checkpoint folder, in place."""
        if self.llm.llm_engine.is_sleeping():
            torch.cuda.empty_cache()  # hand the trainer's freed blocks back before vLLM re-allocates
            self.llm.wake_up(tags=["weights"])
        pushed = collections.defaultdict(lambda: [0, 0.0])  # engine parameter -> [elements, float64 sum] pushed

        def weights():
            for name, tensor in model.state_dict().items():  # tied weights too: a level-2 sleep dropped them all
                full = (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().to(self.dtype)
                key = re.sub(r"\.[qkv]_proj\.", ".qkv_proj.", re.sub(r"\.(gate|up)_proj\.", ".gate_up_proj.", name))
                pushed[key][0] += full.numel()  # vLLM fuses q/k/v and gate/up into one parameter each
                pushed[key][1] += full.sum(dtype=torch.float64).item()
                yield name, full
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights()} if model else
                                {"weights_path": path})  # `load_weights` breaks on CPU; then the push is checked

        def engine_sums(engine_model):  # in the worker; vLLM-CPU's repacked linear weights are not Parameters
            return {name: p.flatten()[:pushed[name][0] if name in pushed else None].sum(dtype=torch.float64).item()
                    for name, p in engine_model.named_parameters() if p.numel()}
        wrong = [name for name, total in (self.llm.apply_model(engine_sums)[0] if model else {}).items()
                 if name not in pushed or not math.isclose(total, pushed[name][1], rel_tol=1e-9, abs_tol=1e-12)]
        if wrong:
            raise RuntimeError(f"vLLM's weights differ from the trainer's after a push, in {', '.join(wrong[:4])}: "
                               "a parameter the push missed (after a level-2 sleep it holds garbage)")
        if self.llm.llm_engine.is_sleeping():
            self.llm.wake_up(tags=["kv_cache"])  # the scheduler resumes only when fully awake
        self.llm.reset_prefix_cache()  # cached prompt KV was computed by the old weights

    def generate(self, prompts: list[list[int]], n: int, temperature: float, top_p: float, max_tokens: int,
                 stop_ids: list[int], seeds: list[int], logprobs: bool = False) -> list[list[tuple]]:
        """n (token ids, vLLM's log-probs or None) per prompt, seeded per prompt: the same for any batch or ranks."""
        from vllm import SamplingParams
        if self.llm.llm_engine.is_sleeping():
            raise RuntimeError("vLLM is asleep (weights or KV cache): generate would wait forever; push weights first")
        params = [SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed,
                                 stop_token_ids=stop_ids, detokenize=False, logprobs=0 if logprobs else None)
                  for seed in seeds]
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [[(list(c.token_ids), [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)] if logprobs else None)
                 for c in out.outputs] for out in outputs]

    def shutdown(self):
        if self.llm.llm_engine.is_sleeping():
            self.llm.wake_up()  # shutting down asleep can print CUDA errors
        self.llm.llm_engine.engine_core.shutdown()  # also ends the process group vLLM shares with torchrun

def build_engine(cfg: Config, model_path: str, d: Dist) -> Engine:
    from vllm import LLM  # imported here so the trainer's functions run on machines without vLLM
    on_gpu = d.device.type == "cuda"
    llm = LLM(model=model_path, dtype=cfg.dtype, seed=cfg.seed + d.rank, tensor_parallel_size=1,
              max_model_len=cfg.max_prompt_len + cfg.max_response_len,
              distributed_executor_backend="external_launcher" if d.ddp else None,  # one engine per rank
              enable_prefix_caching=True, enforce_eager=not on_gpu,
              enable_chunked_prefill=on_gpu,  # on CPU, per-request seeds crash with chunked prefill
              block_size=None if on_gpu else 32,  # CPU's 128-token default: a shorter prompt is never shared by its n
              enable_sleep_mode=on_gpu,  # not supported on CPU
              logprobs_mode="processed_logprobs",  # after the temperature, as the trainer's logits / T
              gpu_memory_utilization=cfg.gpu_memory_utilization, use_tqdm_on_load=False)
    return Engine(llm, sleeps=on_gpu)

def sample_and_grade(engine: Engine, tokenizer, rows: list[dict], k: int, cfg: Config, stop_ids: list[int], d: Dist,
                     seed_key: tuple, temperature: float = None, top_p: float = None) -> list[dict]:
    """k graded responses per row, rows sharded over ranks (validation, eval.py, collection); all records, in order."""
    mine = rows[d.rank::d.world_size]
    prompts = [render_prompt(tokenizer, row, cfg.prompt_template, cfg.max_prompt_len) for row in mine]
    completions = engine.generate(prompts, k, cfg.temperature if temperature is None else temperature,
                                  cfg.top_p if top_p is None else top_p, cfg.max_response_len, stop_ids,
                                  [seed_for(*seed_key, row["id"]) for row in mine]) if mine else []
    records = []
    for row, group in zip(mine, completions):
        texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids, _ in group]
        records.append({"id": row["id"], "problem": row["problem"], "gold": row["answer"], "responses": texts,
                        "lengths": [len(ids) for ids, _ in group], "answers": [verify.extract_answer(t) for t in texts],
                        "correct": [verify.verify(t, row["answer"], mode=cfg.verify_mode) for t in texts]})
    order = {row["id"]: j for j, row in enumerate(rows)}
    return sorted(gather_lists(records, d), key=lambda r: order[r["id"]])

# ----------------------------------------------------------------------------------------------------------------
# Rewards and advantages (DAPO soft overlong punishment; GRPO group standardisation)
@dataclass
class Sample:
    prompt_ids: list[int]
    completion_ids: list[int]
    correct: bool
    reward: float
    replay: bool = False
    advantage: float = 0.0
    vllm_logprobs: list = None  # the engine's log-prob of each sampled token (fresh samples)
    old_logprobs: torch.Tensor = None  # (T_i,) log π_θold, set at the start of the update

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
    """L(θ) = -1/N Σ_i Σ_t m_it · min( r_it Â_i, clip(r_it, 1 - ε_low, 1 + ε_high) Â_i ),  r_it = π_θ / π_θold
    with dual clip: where Â_i < 0 the per-token loss is capped at -c·Â_i (huge ratios cannot blow it up).
    N is the token-count normalizer: all response tokens of the mini-batch, on all ranks (DAPO's token mean).
    It is an argument because a micro-batch sees only part of the mini-batch; default: mask.sum().
    logprobs, old_logprobs, mask: (B, T); advantages: (B,). Returns (loss, metrics)."""
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
    """log π_θ(o_t | q, o_<t) per response token, logits / T; the LM head on chunks (all logits: the largest tensor)."""

    def __init__(self, model, temperature: float, chunk_tokens: int = 1024):
        super().__init__()
        self.model, self.temperature, self.chunk_tokens = model, temperature, chunk_tokens

    def _chunk_logps(self, hidden, targets):  # (N, H), (N,) -> (N,)
        logits = self.model.lm_head(hidden).float() / self.temperature  # (N, V)
        return logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (N,)

    def forward(self, batch: dict) -> torch.Tensor:  # -> (B, T), 0 after each response's end
        hidden = self.model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                  position_ids=batch["position_ids"]).last_hidden_state  # (R, L, H)
        hidden, targets = hidden.flatten(0, 1)[batch["sources"]], batch["targets"]  # (N, H), (N,)
        logps = [torch.utils.checkpoint.checkpoint(  # recomputed in backward: one chunk of logits at a time
            self._chunk_logps, hidden[i:i + self.chunk_tokens], targets[i:i + self.chunk_tokens], use_reentrant=False)
            for i in range(0, targets.numel(), self.chunk_tokens)]
        out = hidden.new_zeros(batch["completion_mask"].shape, dtype=torch.float32)  # (B, T)
        out[batch["completion_mask"].bool()] = torch.cat(logps)
        return out

def collate(samples: list[Sample], pad_id: int, device, share_prompts: bool = False) -> dict:
    """A micro-batch as tensors; a row is [prompt | response], positions from 0 as in vLLM. With share_prompts a row
    holds a prompt once and then each response to it, seeing only the prompt and itself (a block-causal mask): the
    prompt's forward and backward run once, not n times. Otherwise the mask stays 2-D (fused attention kernels)."""
    rows = collections.defaultdict(list)  # row -> its samples' indices
    for i, s in enumerate(samples):
        rows[tuple(s.prompt_ids) if share_prompts else i].append(i)
    tokens, positions, segments, sources = [], [], [], [None] * len(samples)  # per row; segment 0 is the prompt
    for ids in rows.values():
        prompt, p = samples[ids[0]].prompt_ids, len(samples[ids[0]].prompt_ids)
        tokens.append(list(prompt))
        positions.append(list(range(p)))
        segments.append([0] * p)
        for j, i in enumerate(ids):  # response j: positions continue the prompt's; state t - 1 predicts token t
            completion = samples[i].completion_ids
            sources[i] = [(len(tokens) - 1, p - 1)] + [(len(tokens) - 1, len(tokens[-1]) + t)
                                                       for t in range(len(completion) - 1)]
            tokens[-1] += completion
            positions[-1] += range(p, p + len(completion))
            segments[-1] += [j + 1] * len(completion)
    length = max(map(len, tokens))

    def pad(rows, value):  # (R, L)
        return torch.tensor([row + [value] * (length - len(row)) for row in rows])
    segments = pad(segments, -1)  # -1: padding
    query, key = segments.unsqueeze(2), segments.unsqueeze(1)  # (R, L, 1), (R, 1, L)
    lengths = torch.tensor([len(s.completion_ids) for s in samples])  # (B,)
    completion_mask = torch.arange(int(lengths.max())) < lengths.unsqueeze(1)  # (B, T)
    batch = {"input_ids": pad(tokens, pad_id), "position_ids": pad(positions, 0),
             "attention_mask": ((key == 0) | (key == query)).tril().unsqueeze(1) if share_prompts  # (R, 1, L, L)
             else (segments >= 0).long(),  # (R, L)
             "sources": torch.tensor([r * length + t for s in sources for r, t in s]),  # (N,) into (R * L)
             "targets": torch.tensor([t for s in samples for t in s.completion_ids]),  # (N,)
             "completion_mask": completion_mask.long(),  # (B, T)
             "advantages": torch.tensor([s.advantage for s in samples], dtype=torch.float32)}  # (B,)
    if all(s.old_logprobs is not None for s in samples):  # later epochs: π_θold of the step's start
        batch["old_logprobs"] = torch.zeros(completion_mask.shape)  # (B, T)
        batch["old_logprobs"][completion_mask] = torch.cat([s.old_logprobs for s in samples])
    return {**{k: v.to(device) for k, v in batch.items()}, "samples": samples}

def ppo_update(policy, optimizer, groups: list[list[Sample]], sequences_per_update: int, cfg: Config, d: Dist,
               pad_id: int, seed: int) -> dict:
    """One step; rank r holds the groups of prompts r, r + W, ... Mini-batches are whole groups in a seeded prompt
    order, alike for any number of ranks. π_θold once, before any update, in the same layout: the first ratio is 1."""
    autocast = torch.autocast(d.device.type, dtype=getattr(torch, cfg.dtype), enabled=cfg.dtype != "float32",
                              cache_enabled=False)  # a cache of bf16 weight copies would cost 13 GiB for 7B
    mine = {j * d.world_size + d.rank: group for j, group in enumerate(groups)}  # position in the step -> group
    sizes = dict(gather_lists([(p, (len(g), sum(len(s.completion_ids) for s in g))) for p, g in mine.items()], d))
    num_updates = max(1, round(sum(n for n, _ in sizes.values()) / sequences_per_update))
    idle = Sample([pad_id], [pad_id], False, 0.0)  # Â = 0: an exactly zero gradient, for a rank with no sample
    stats = collections.defaultdict(list)

    def remember(batch, old_logprobs):  # (B, T) π_θold, for the loss and, per sample, for later epochs
        batch["old_logprobs"] = old_logprobs
        for s, row in zip(batch["samples"], old_logprobs):
            s.old_logprobs = row[:len(s.completion_ids)].cpu()
    for epoch in range(cfg.epochs):
        mini_batches = []
        for chunk in np.array_split(np.random.default_rng(seed_for(seed, epoch)).permutation(len(sizes)), num_updates):
            samples = [s for p in chunk if p in mine for s in mine[p]]  # whole groups: a prompt stays together
            micro = [samples[i:i + cfg.micro_batch_size] for i in range(0, len(samples), cfg.micro_batch_size)]
            most = max(math.ceil(sum(sizes[p][0] for p in chunk if p % d.world_size == r) / cfg.micro_batch_size)
                       for r in range(d.world_size))  # micro-batches on the busiest rank
            micro += [[idle]] * (most - len(micro))  # FSDP's collectives need as many passes on every rank
            num_tokens = sum(sizes[p][1] for p in chunk)  # N: response tokens of the mini-batch on all ranks
            mini_batches.append((num_tokens, [collate(m, pad_id, d.device, cfg.share_prompts) for m in micro]))
        if epoch == 0:  # π_θold: the policy at the step's start, for every sequence, replays included
            with torch.no_grad(), autocast:
                for _, batches in mini_batches[1:]:  # the first mini-batch uses its own: the policy has not moved
                    for batch in batches:
                        remember(batch, policy(batch))
        for num_tokens, batches in mini_batches:
            for batch in batches:
                with autocast:
                    logprobs = policy(batch)  # (B, T)
                    if "old_logprobs" not in batch:
                        remember(batch, logprobs.detach())
                    loss, metrics = policy_loss(logprobs, batch["old_logprobs"], batch["advantages"],
                                                batch["completion_mask"], cfg.clip_low, cfg.clip_high, cfg.clip_c,
                                                num_tokens=num_tokens)
                (loss * d.world_size).backward()  # FSDP2 averages over ranks; the sum of their shares is the mean
                for key, value in metrics.items() if batch["samples"][0] is not idle else ():
                    stats[key].append(value)
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
            grad_norm = (grad_norm.full_tensor() if isinstance(grad_norm, DTensor) else grad_norm).item()
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

def build_group(row: dict, prompt_ids: list[int], completions: list[tuple], tokenizer, cfg: Config, end_id: int,
                replay_rng: np.random.Generator | None = None) -> list[Sample]:
    """A prompt's group: n fresh rollouts (token ids, vLLM log-probs), plus in phase two m replayed successes,
    re-tokenized, ended like fresh responses, cut to L_max. Each gets R = ±1 (verify.py) + the overlong penalty
    (its length counts the end token); advantages are standardised over the whole group."""
    replays = draw_replays(row["responses"], cfg.replay_m, replay_rng) if replay_rng is not None else []  # RLEP: m
    replayed = [((tokenizer.encode(text, add_special_tokens=False) + [end_id])[:cfg.max_response_len], None)
                for text in replays]  # RLEP: re-tokenized, the end token appended
    group = []
    for (ids, logprobs), replay in [(c, False) for c in completions] + [(c, True) for c in replayed]:  # RLEP: n + m
        text = tokenizer.decode(ids, skip_special_tokens=True)
        correct = verify.verify(text, row["answer"], mode=cfg.verify_mode)
        penalty = overlong_penalty(len(ids), cfg.max_response_len, cfg.overlong_buffer, cfg.overlong_factor)
        group.append(Sample(prompt_ids, ids, correct, (1.0 if correct else -1.0) + penalty, replay,
                            vllm_logprobs=logprobs))
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

def save_checkpoint(part_dir: str, step: int, policy, optimizer, tokenizer, cfg: Config, d: Dist):
    """HF weights (gathered to rank 0's CPU), AdamW as a file per rank, the step; a crash keeps the last good one."""
    final, tmp = checkpoint_path(part_dir, step), checkpoint_path(part_dir, step) + ".tmp"
    weights = get_model_state_dict(policy.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if d.master_process:
        shutil.rmtree(tmp, ignore_errors=True)
        policy.model.save_pretrained(tmp, state_dict=weights)
        tokenizer.save_pretrained(tmp)
        write_atomic(os.path.join(tmp, "rlep_config.json"), json.dumps(asdict(cfg), indent=2))
    barrier(d)
    dcp.save({"optimizer": get_optimizer_state_dict(policy, optimizer)}, checkpoint_id=os.path.join(tmp, "optimizer"))
    if d.master_process:  # data order and replay draws derive from the step; the RNG state is kept for safety
        torch.save({"step": step, "torch_rng": torch.get_rng_state()}, os.path.join(tmp, "trainer_state.pt"))
        shutil.rmtree(final, ignore_errors=True)  # the same step saved again after a resume
        os.replace(tmp, final)
    barrier(d)

def load_trainer_state(ckpt: str, policy, optimizer):
    """AdamW's state (resharded to this run's ranks) and the RNG state, read to the CPU (set_rng_state fails on GPU)."""
    state = {"optimizer": get_optimizer_state_dict(policy, optimizer)}
    dcp.load(state, checkpoint_id=os.path.join(ckpt, "optimizer"))
    set_optimizer_state_dict(policy, optimizer, state["optimizer"])
    torch.set_rng_state(torch.load(os.path.join(ckpt, "trainer_state.pt"), map_location="cpu")["torch_rng"])

def build_policy(path: str, cfg: Config, d: Dist):
    """The policy (float32 master weights) and AdamW; FSDP2 shards them under torchrun, a unit per decoder layer."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")  # sdpa: a
    model.config.use_cache = False  # boolean 4-D mask (share_prompts) reads as "may attend"
    model.to("cpu" if d.ddp else d.device)  # under torchrun FSDP2 moves each unit to the GPU as it shards it
    model.train()  # from_pretrained returns eval mode, where transformers skips gradient checkpointing
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy = TokenLogProbs(model, cfg.temperature)
    if d.ddp:  # the root unit (this module) gathers the embeddings, final norm and LM head in its forward
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(policy)
    return policy, torch.optim.AdamW(policy.parameters(), lr=cfg.lr, betas=(0.9, 0.999), weight_decay=cfg.weight_decay)

def step_prompts(num_rows: int, prompts_per_step: int, step: int, seed: int) -> list[int]:
    """Row indices of a training step: each epoch visits every row once, in its own random order."""
    epoch, offset = divmod(step, num_rows // prompts_per_step)
    order = np.random.default_rng(seed_for(seed, "epoch", epoch)).permutation(num_rows)
    return order[offset * prompts_per_step:(offset + 1) * prompts_per_step].tolist()

def validate(engine, tokenizer, val_rows, cfg, stop_ids, d, step) -> dict:
    """avg@val_k (overall and per data source), no replays, seeded by the step: both phases draw the same numbers."""
    with clock("validation"):
        records = sample_and_grade(engine, tokenizer, val_rows, cfg.val_k, cfg, stop_ids, d, (cfg.seed, "val", step))
    by_source = collections.defaultdict(list)
    for row, record in zip(val_rows, records):
        by_source[f"val_acc/{row.get('data_source')}"] += record["correct"]
    return {"val_acc": float(np.mean([c for r in records for c in r["correct"]])),
            **({k: float(np.mean(v)) for k, v in by_source.items()} if len(by_source) > 1 else {})}

def step_counts(groups: list[list[Sample]], tokenizer, cfg: Config, stop_ids: list[int]) -> dict:  # this rank's
    fresh = [s for g in groups for s in g if not s.replay]
    gaps = [abs(a - b) for s in fresh for a, b in zip(s.old_logprobs.tolist(), s.vllm_logprobs)]  # vLLM's sampling
    ends = collections.Counter(  # log-probs against π_θold catch stale weights, a wrong T or stop, a precision drift
        tokenizer.convert_ids_to_tokens(s.completion_ids[-1]) if s.completion_ids[-1] in stop_ids
        or len(s.completion_ids) < cfg.max_response_len else "length" for s in fresh)  # a stop token, or cut at L_max
    return {"samples": sum(map(len, groups)), "fresh": len(fresh), "correct": sum(s.correct for s in fresh),
            "tokens": sum(len(s.completion_ids) for s in fresh), "reward": sum(s.reward for g in groups for s in g),
            "groups": len(groups), "zero_std": sum(all(s.advantage == 0 for s in g) for g in groups),
            "rescued": sum(any(s.correct for s in g if s.replay)  # RLEP: fresh all wrong, replays right
                           and not any(s.correct for s in g if not s.replay) for g in groups),
            "gap_sum": sum(gaps), "gap_max": max(gaps, default=0.0), **{f"end {k}": v for k, v in ends.items()}}

def train(cfg: Config, part: str, rows: list[dict], engine: Engine, tokenizer, end_id: int, base_path: str, d: Dist,
          val_rows: list[dict], replay: bool = False):
    """Train from the base model (or the part's last checkpoint); with replay, rows carry pooled responses."""
    part_dir, steps = os.path.join(cfg.out_dir, part), cfg.phase2_steps if replay else cfg.phase1_steps
    start, ckpt = latest_checkpoint(part_dir)
    if start >= steps:
        return
    if len(rows) < cfg.prompts_per_step or cfg.prompts_per_step % d.world_size:
        raise ValueError(f"{part}: {len(rows)} prompts; prompts_per_step={cfg.prompts_per_step} must be at most "
                         f"that and a multiple of the {d.world_size} ranks")
    os.makedirs(part_dir, exist_ok=True)
    metrics_path, samples_path = os.path.join(part_dir, "metrics.jsonl"), os.path.join(part_dir, "samples.jsonl")
    for path in (metrics_path, samples_path) if d.master_process else ():  # forget steps logged after the
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in read_jsonl(path) if r["step"] <= start))  # ckpt
    policy, optimizer = build_policy(ckpt or base_path, cfg, d)
    if ckpt:
        load_trainer_state(ckpt, policy, optimizer)
    stop_ids, pad_id = [end_id], tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_id
    with clock("push"):
        engine.load(policy.model)
    if start == 0 and cfg.val_every:  # the curve starts at the base model (validated once for both phases)
        if base_path not in base_scores:
            base_scores[base_path] = validate(engine, tokenizer, val_rows, cfg, stop_ids, d, 0)
        if d.master_process:
            write_atomic(metrics_path, json.dumps({"step": 0, **base_scores[base_path]}) + "\n")
    for step in range(start, steps):
        lr, times = cfg.lr * min(1.0, step / cfg.warmup_steps) if cfg.warmup_steps > 0 else cfg.lr, {}  # 0 on step 1
        for group in optimizer.param_groups:
            group["lr"] = lr
        order = step_prompts(len(rows), cfg.prompts_per_step, step, cfg.seed)  # the step's prompts, seeded order
        batch_rows = [rows[i] for i in order[d.rank::d.world_size]]  # this rank's share: every W-th
        with clock("generation", times):
            prompts = [render_prompt(tokenizer, row, cfg.prompt_template, cfg.max_prompt_len) for row in batch_rows]
            completions = engine.generate(prompts, cfg.n, cfg.temperature, cfg.top_p, cfg.max_response_len, stop_ids,
                                          [seed_for(cfg.seed, part, step, row["id"]) for row in batch_rows], True)
            engine.sleep()  # GPU: free vLLM's memory for the trainer
        with clock("scoring", times):
            groups = [build_group(row, prompt_ids, group_ids, tokenizer, cfg, end_id,  # RLEP: replays, drawn per prompt
                                  np.random.default_rng(seed_for(cfg.seed, part, step, row["id"])) if replay else None)
                      for row, prompt_ids, group_ids in zip(batch_rows, prompts, completions)]
        with clock("training", times):
            per_prompt = cfg.n + cfg.replay_m if replay and cfg.equal_updates else cfg.n  # RLEP: the paper's: 9 not 8
            stats = ppo_update(policy, optimizer, groups, cfg.mini_batch_prompts * per_prompt, cfg, d, pad_id,
                               seed_for(cfg.seed, part, step, "update"))
        with clock("push", times):
            engine.load(policy.model)
        ranks = gather_lists([step_counts(groups, tokenizer, cfg, stop_ids)], d)
        total = collections.Counter()
        for counts in ranks:
            total.update(counts)  # update adds negative sums too (a Counter's + would drop them)
        record = {"step": step + 1, "lr": lr, "reward_mean": total["reward"] / total["samples"],
                  "acc_fresh": total["correct"] / total["fresh"], "response_len": total["tokens"] / total["fresh"],
                  "zero_std_frac": total["zero_std"] / total["groups"],
                  "replay_frac": 1 - total["fresh"] / total["samples"],  # RLEP: m / (n + m)
                  "rescued_prompts": total["rescued"],  # RLEP: signal only from replays
                  "ends": {k[4:]: v / total["fresh"] for k, v in total.items() if k.startswith("end ")},
                  "logprob_gap_mean": total["gap_sum"] / total["tokens"],
                  "logprob_gap_max": max(r["gap_max"] for r in ranks), **stats, **times}
        if cfg.val_every and (step + 1) % cfg.val_every == 0:
            record.update(validate(engine, tokenizer, val_rows, cfg, stop_ids, d, step + 1))
        if d.master_process:
            fresh = [s for g in groups for s in g if not s.replay][:cfg.log_samples]
            append_jsonl(metrics_path, [record])
            append_jsonl(samples_path, [{"step": step + 1, "prompt": tokenizer.decode(s.prompt_ids), "reward": s.reward,
                                         "response": tokenizer.decode(s.completion_ids)} for s in fresh])
            print(f"{part} step {step + 1}/{steps} | " + " | ".join(f"{k} {record[k]:.3g}" for k in (
                "reward_mean", "acc_fresh", "response_len", "replay_frac", "clip_frac", "grad_norm", "logprob_gap_max",
                "val_acc", "t_generation", "t_training") if k in record), flush=True)
        if (step + 1) % cfg.save_every == 0 or step + 1 == steps:
            save_checkpoint(part_dir, step + 1, policy, optimizer, tokenizer, cfg, d)
    engine.sleep()

# ----------------------------------------------------------------------------------------------------------------
# Collection: the phase-one checkpoint answers every training prompt K times; verified successes form the pool
def collect(cfg: Config, rows: list[dict], engine: Engine, tokenizer, end_id: int, d: Dist):
    """RLEP: the pool, from the phase-one checkpoint at `collect_step`; progress.jsonl lets a stopped one resume."""
    out = os.path.join(cfg.out_dir, "collect")
    pool_path, progress_path = os.path.join(out, "pool.jsonl"), os.path.join(out, "progress.jsonl")
    if os.path.isfile(pool_path):
        return
    ckpt = checkpoint_path(os.path.join(cfg.out_dir, "phase1"), cfg.collect_step)
    if not os.path.isdir(ckpt):
        raise FileNotFoundError(f"{ckpt}: phase one has no checkpoint at --collect_step {cfg.collect_step}")
    os.makedirs(out, exist_ok=True)
    successes = {row[0]: row[1] for row in read_jsonl(progress_path)}  # prompt id -> verified answers, so far
    todo = [row for row in rows if row["id"] not in successes]
    with clock("collection"):
        engine.load(path=ckpt)  # RLEP: the seed policy, read by vLLM in its own dtype (no trainer copy on any rank)
        for start in range(0, len(todo), cfg.prompts_per_step):
            records = sample_and_grade(engine, tokenizer, todo[start:start + cfg.prompts_per_step], cfg.collect_k,
                                       cfg, [end_id], d, (cfg.seed, "collect"), cfg.collect_temperature,
                                       cfg.collect_top_p)
            found = [[r["id"], [t for t, ok in zip(r["responses"], r["correct"]) if ok], sum(r["lengths"])]
                     for r in records]  # RLEP: only verified answers
            successes.update((row[0], row[1]) for row in found)
            if d.master_process:
                append_jsonl(progress_path, found)
    engine.sleep()
    pool = [{**row, "responses": successes[row["id"]]} for row in rows
            if len(successes[row["id"]]) >= cfg.min_successes]  # RLEP: only prompts with >= 2 successes
    if not pool:
        raise RuntimeError(f"empty experience pool: no prompt got {cfg.min_successes} verified answers out of "
                           f"{cfg.collect_k} from {ckpt}. Train phase one longer or raise --collect_k.")
    if d.master_process:
        save_pool(pool_path, pool)
    barrier(d)

# ----------------------------------------------------------------------------------------------------------------
# Phase two (`train` with replay=True, from the base model, on the pool's prompts: see main) and main
def comparison_table(run_dirs: list[str]) -> str:
    """The paper's comparison per run and validation metric: peaks, when RLEP first reaches the baseline's, finals."""
    def cell(point):
        return f"{100 * point[1]:.1f} (step {point[0]})" if point else "n/a"
    lines = ["| run | metric | baseline peak | RLEP reaches it at | RLEP peak | baseline final | RLEP final |",
             "|---" * 7 + "|"]
    for run_dir in run_dirs:
        curves = {part: collections.defaultdict(list) for part in ("phase1", "phase2")}  # part -> metric -> points
        for part, found in curves.items():
            for row in read_jsonl(os.path.join(run_dir, part, "metrics.jsonl")):
                for key in (k for k in row if k.startswith("val_acc")):
                    found[key].append((row["step"], row[key]))
        if not any(curves.values()):
            raise ValueError(f"{run_dir}: no val_acc in phase1/metrics.jsonl or phase2/metrics.jsonl")
        for key in sorted(set(curves["phase1"]) | set(curves["phase2"])):
            base, ours = curves["phase1"].get(key), curves["phase2"].get(key)
            peaks = [max(c, key=lambda point: (point[1], -point[0])) if c else None for c in (base, ours)]  # earliest
            reached = next((f"step {s}" for s, v in ours if v >= peaks[0][1]), "never") if base and ours else "n/a"
            cells = [os.path.basename(os.path.normpath(run_dir)), key, cell(peaks[0]), reached, cell(peaks[1]),
                     cell(base[-1] if base else None), cell(ours[-1] if ours else None)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)

def main(argv=None):
    """Phase one, the collection, phase two (each part resumes on its own); the comparison; where the time went."""
    from transformers import AutoTokenizer
    started, cfg = time.perf_counter(), parse_config(argv)
    d = setup_distributed(cfg.timeout_minutes)
    cfg.dtype, why = resolve_dtype(cfg.dtype, d.device)
    config_path = os.path.join(cfg.out_dir, "config.json")
    if os.path.exists(config_path) and not cfg.resume:
        raise FileExistsError(f"{cfg.out_dir} already holds a run: pass --resume to continue it, or another --out_dir")
    barrier(d)  # every rank looks before rank 0 writes
    if d.master_process:
        print(f"rlep: preset {cfg.preset}, {d.world_size} rank(s) on {d.device.type}, dtype {cfg.dtype} ({why}), "
              f"torch threads {torch.get_num_threads()}, output in {cfg.out_dir}", flush=True)
        os.makedirs(cfg.out_dir, exist_ok=True)
        write_atomic(config_path, json.dumps(asdict(cfg), indent=2))
    from builtin import resolve_model  # a folder as given, or a built-in model made once (by rank 0) in cache_dir
    model_path = resolve_model(cfg.model_path, cfg.cache_dir, build=d.master_process)
    barrier(d)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    end_id = end_token_id(tokenizer, cfg.stop_token)
    train_rows = read_rows(cfg.train_file) if cfg.phase in ("all", "1", "collect") else []
    val_rows = read_rows(cfg.val_file) if cfg.val_every else []
    given_pool = load_pool(cfg.pool) if cfg.pool else None  # read once; a bad file stops the run now
    if given_pool is None and cfg.phase1_prompts == "pool" and cfg.phase in ("all", "1"):
        raise ValueError("--phase1_prompts pool needs --pool FILE (the prompt set to train the baseline on)")
    engine = build_engine(cfg, model_path, d)
    engine.sleep()  # free the GPU for the trainer; the first push wakes it with the trainer's weights
    try:
        if cfg.phase in ("all", "1"):
            rows = given_pool if cfg.phase1_prompts == "pool" else train_rows
            train(cfg, "phase1", rows, engine, tokenizer, end_id, model_path, d, val_rows)
        if cfg.phase in ("all", "collect") and not cfg.pool:
            collect(cfg, train_rows, engine, tokenizer, end_id, d)
        if cfg.phase in ("all", "2"):  # RLEP: restart from the base model π_θ0 on the pool's prompts, groups n + m
            pool = given_pool or load_pool(cfg.pool or os.path.join(cfg.out_dir, "collect", "pool.jsonl"))
            train(cfg, "phase2", pool, engine, tokenizer, end_id, model_path, d, val_rows, replay=True)  # RLEP
    finally:
        engine.shutdown()  # before the process group goes: vLLM tears down its own groups
        if dist.is_initialized():
            dist.destroy_process_group()
    total = time.perf_counter() - started
    parts = {**time_spent, "start-up, loading, saving": total - sum(time_spent.values())}
    if d.master_process and cfg.phase == "all" and cfg.val_every:
        print(comparison_table([cfg.out_dir]))  # the paper's comparison
    if d.master_process:  # where the time went, printed and saved beside the run
        print(f"time: {total:.0f} s | " + " | ".join(f"{k} {v:.0f} s ({100 * v / total:.0f} %)" for k, v in
                                                     parts.items()))
        write_atomic(os.path.join(cfg.out_dir, "timings.json"), json.dumps({"total_s": total, "parts_s": parts}))

if __name__ == "__main__":
    main()
