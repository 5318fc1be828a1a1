"""The disk a command needs, before it writes: the peak of its checkpoints (written whole
beside the others, then the older ones pruned), metrics, samples and pool, against the free
space of the output folder's disk."""
import functools
import os
import shutil
from typing import NamedTuple

import torch

from machinery.checkpoints import (checkpoint_path, complete_checkpoints, leftovers,
                                   protected_steps, pruned, save_plan)
from machinery import UserError


def folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(folder) for name in names)


def held_checkpoints(out_dir: str) -> dict:
    """{(part, step): (bytes, bytes without AdamW's state)} of a run's complete checkpoints,
    measured."""
    held = {}
    for part in ("phase1", "phase2"):
        part_dir = os.path.join(out_dir, part)
        for step in complete_checkpoints(part_dir):
            folder = checkpoint_path(part_dir, step)
            size = folder_bytes(folder)
            held[part, step] = (size, size - folder_bytes(os.path.join(folder, "optimizer")))
    return held


@functools.lru_cache(maxsize=2)
def meta_model(model_path: str):
    """The model a folder's config.json describes, on the meta device: its shapes, no memory;
    built once a process (a second for 7B: the preflight's shape check and the disk's size share
    it)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))


class CheckpointSize(NamedTuple):
    whole: int  # bytes: weights, AdamW's state, tokenizer, trainer state
    weights: int  # without AdamW's state (the collection's step, once pruned)


def checkpoint_size(model_path: str, ranks: int = 1) -> CheckpointSize:
    """A checkpoint's bytes before one is written: fp32 weights (4 bytes a parameter), AdamW's
    two moments (8), a tensor's records (1 KiB in safetensors' header, 8 KiB a rank in DCP's
    files), the model folder's other files (tokenizer, config), 16 KiB of trainer state. The tiny
    model: 1,662,188 B; 1,576,574 B measured. The model is built on the meta device."""
    tensors = list(meta_model(model_path).parameters())  # tied ones once, as a checkpoint saves
    params = sum(p.numel() for p in tensors)
    weights = 4 * params + (1 << 10) * len(tensors) + (16 << 10)
    # a folder: the preflight's check_model refused anything else before; a file through its
    # link, as huggingface_hub's cache holds them
    weights += sum(entry.stat().st_size for entry in os.scandir(model_path) if entry.is_file()
                   and not entry.name.endswith((".safetensors", ".bin", ".pt", ".pth", ".gguf")))
    return CheckpointSize(weights + 8 * params + (8 << 10) * len(tensors) * ranks, weights)


# the parts each --phase trains, in order
trained_parts = {"all": ["phase1", "phase2"], "1": ["phase1"], "2": ["phase2"], "collect": []}


def collects(cfg) -> bool:
    """Whether the command collects a pool: not --phase 1 or 2, nor a run given --pool."""
    return cfg.phase in ("all", "collect") and not cfg.pool


def disk_budget(cfg, size: CheckpointSize, held: dict) -> dict:
    """Bytes of checkpoints, at their peak, of the parts this command runs (cfg.phase), from what
    the run holds now (`held`, from held_checkpoints) and a new checkpoint's `size`. The saves
    are replayed as checkpoints.save and prune_checkpoints make them: a new checkpoint is written
    whole beside the others, then the older ones are pruned. Phase one's checkpoints stay through
    phase two."""
    held = dict(held)  # {(part, step): (bytes now, bytes without AdamW's state)}, replayed
    on_disk = peak = sum(now for now, _ in held.values())
    for part in trained_parts[cfg.phase]:
        # a part resumes after its newest checkpoint (rlep.train)
        done = max([step for p, step in held if p == part], default=0)
        for step in [step for step in save_plan(cfg, part) if step > done]:
            held[part, step] = size
            peak = max(peak, sum(now for now, _ in held.values()))
            for old in pruned(sorted(s for p, s in held if p == part), cfg.keep_checkpoints):
                _, weights = held.pop((part, old))
                if old in protected_steps(cfg, part):  # its weights stay, its AdamW state goes
                    held[part, old] = (weights, weights)
    return {"per_checkpoint": size.whole, "peak": peak, "on_disk": on_disk,
            "need": peak - on_disk}


def log_bytes(cfg, num_rows: int) -> int:
    """What a run writes beside its checkpoints, generously: a step's metrics (2 kB, 120 B a
    prompt) and samples (8 B a token), the collection's progress.jsonl and pool.jsonl (each
    prompt's K answers at L_max tokens of 4 B: both copies of the right ones, if at most half
    are), 1 MB for config.json, timings.json, curves.png."""
    steps = sum(getattr(cfg, f"{part}_steps") for part in trained_parts[cfg.phase])
    sample = 8 * (cfg.max_prompt_len + cfg.max_response_len)
    per_step = 2000 + 120 * cfg.prompts_per_step + cfg.log_samples * sample
    pool = 4 * cfg.collect_k * cfg.max_response_len * num_rows
    return steps * per_step + collects(cfg) * pool + 10**6


def show_bytes(n: float) -> str:
    """GB, MB below a GB, kB below an MB."""
    size, unit = next(x for x in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (0, "B")) if n >= x[0])
    return f"{n / max(size, 1):.1f} {unit}"


def check_disk(cfg, model_path: str, num_rows: int = 0, ranks: int = 1) -> str:
    """Refuse a command whose checkpoints, metrics, samples and pool would not fit on the output
    disk (num_rows: the training prompts the collection answers). Called before anything is
    written, so that a refused start leaves no run behind. Returns the line that says so, for
    the run's start."""
    need = disk_budget(cfg, checkpoint_size(model_path, ranks), held_checkpoints(cfg.out_dir))
    logs = log_bytes(cfg, num_rows)
    # the output folder may not exist yet: the disk it will be on, the nearest folder above it
    # that exists (preflight.check_folder walks up as this does)
    where = os.path.abspath(cfg.out_dir)
    while not os.path.isdir(where):
        where = os.path.dirname(where)
    free = shutil.disk_usage(where).free + sum(map(folder_bytes, leftovers(cfg.out_dir)))
    if need["need"] + logs > free:
        raise UserError(f"--out_dir {cfg.out_dir}: {show_bytes(free)} free, this command's "
                        f"checkpoints and logs need {show_bytes(need['need'] + logs)} more: free "
                        "some, lower --keep_checkpoints, or use another --out_dir")
    return (f"disk: checkpoints peak at {show_bytes(need['peak'])} "
            f"({show_bytes(need['per_checkpoint'])} each, --keep_checkpoints "
            f"{cfg.keep_checkpoints}), {show_bytes(need['on_disk'])} of them on disk already; "
            f"metrics, samples and the pool up to {show_bytes(logs)}; {show_bytes(free)} free in "
            f"{where}")
