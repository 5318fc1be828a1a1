"""Checkpoints: a part's step_NNNNNN folders, written whole (a .tmp folder renamed) and
complete once trainer_state.pt is in them; HF weights gathered to rank 0, AdamW's state a file per
rank (torch.distributed.checkpoint, resharded on resume); the newest few kept, the collection's
step kept as weights. disk.py sizes them against the disk before a run."""
import json
import os
import shutil
from dataclasses import asdict

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_optimizer_state_dict)

from machinery.files import write_atomic


def checkpoint_path(part_dir: str, step: int) -> str:
    return os.path.join(part_dir, f"step_{step:06d}")


def complete_checkpoints(part_dir: str) -> list[int]:
    """The steps of a part's complete checkpoints, oldest first. A save cut short left only a
    `.tmp` folder, which is not one."""
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


def resume_point(part_dir: str) -> tuple[int, str | None, int]:
    """latest_checkpoint's (step, folder) and the round of prompts the next step starts at (the
    training rows' pass, which dynamic sampling can run ahead of the step); a checkpoint older
    than --dynamic_sampling: the step."""
    step, folder = latest_checkpoint(part_dir)
    if folder is None:
        return step, folder, step
    state = torch.load(os.path.join(folder, "trainer_state.pt"), map_location="cpu")
    return step, folder, state.get("prompt_round", step)


def pruned(steps: list[int], keep: int) -> list[int]:
    """The steps, oldest first, that lose their place once the newest `keep` are whole; keep 0
    keeps all."""
    return steps[:-keep] if keep else []


def prune_checkpoints(part_dir: str, keep: int, protected: set[int]):
    """After a save completes: the newest `keep` checkpoints stay whole (a resume reads one); an
    older protected step keeps its weights only (the collection reads them, no resume needs its
    AdamW state); the rest go."""
    for step in pruned(complete_checkpoints(part_dir), keep):
        folder = checkpoint_path(part_dir, step)
        if step in protected:
            shutil.rmtree(os.path.join(folder, "optimizer"), ignore_errors=True)
        else:
            # renamed first: a crash mid-delete leaves no half checkpoint under a step's name
            os.replace(folder, folder + ".deleting")
            shutil.rmtree(folder + ".deleting")


def leftovers(out_dir: str) -> list[str]:
    """A stopped prune's `step_*.deleting` folders and a stopped save's `step_*.tmp`: dead
    weight, which the disk check counts as free."""
    found = []
    for part in ("phase1", "phase2"):
        part_dir = os.path.join(out_dir, part)
        names = os.listdir(part_dir) if os.path.isdir(part_dir) else []
        found += [os.path.join(part_dir, name) for name in sorted(names)
                  if name.startswith("step_") and name.endswith((".deleting", ".tmp"))]
    return found


def remove_leftovers(out_dir: str):
    """The leftovers, removed by rank 0 before the run writes."""
    found = leftovers(out_dir)
    for folder in found:
        shutil.rmtree(folder)
    if found:
        names = ", ".join(os.path.relpath(f, out_dir) for f in found)
        print(f"removed what a stopped save or prune left: {names}", flush=True)


def save(part_dir: str, step: int, policy, optimizer, tokenizer, cfg, d,
         protected: set[int] = frozenset(), prompt_round: int = None):
    """rlep.py's policy (FSDP2 or not): HF weights gathered to rank 0's CPU, AdamW as a file per
    rank (DCP), the step and the run's config (cfg, a dataclass); written to a `.tmp` folder and
    renamed: a crash keeps the last good one. Then old checkpoints are pruned. policy: its
    `.model`; d: ranks.Dist."""
    final = checkpoint_path(part_dir, step)
    tmp = final + ".tmp"
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(policy.model, options=options)
    # a tied weight (SmolLM2's head) comes back gathered under both names, in two copies that
    # save_pretrained would both write: keep the first name, as an unsharded save does
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
    if d.distributed:
        dist.barrier()
    optimizer_state = get_optimizer_state_dict(policy, optimizer)
    dcp.save({"optimizer": optimizer_state}, checkpoint_id=os.path.join(tmp, "optimizer"))
    if d.master_process:
        # data order and replay draws derive from the step; the RNG state is kept for safety
        state = {"step": step, "torch_rng": torch.get_rng_state(),
                 # the next step's first round of prompts (resume_point)
                 "prompt_round": step if prompt_round is None else prompt_round}
        torch.save(state, os.path.join(tmp, "trainer_state.pt"))
        # the same step saved again after a resume
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        prune_checkpoints(part_dir, cfg.keep_checkpoints, protected)
    if d.distributed:
        dist.barrier()


def load_trainer_state(ckpt: str, policy, optimizer):
    """AdamW's state (resharded to this run's ranks) and the RNG state, read to the CPU
    (set_rng_state fails on a GPU tensor)."""
    state = {"optimizer": get_optimizer_state_dict(policy, optimizer)}
    dcp.load(state, checkpoint_id=os.path.join(ckpt, "optimizer"))
    set_optimizer_state_dict(policy, optimizer, state["optimizer"])
    trainer_state = torch.load(os.path.join(ckpt, "trainer_state.pt"), map_location="cpu")
    torch.set_rng_state(trainer_state["torch_rng"])


def protected_steps(cfg, part: str) -> set[int]:
    """The steps whose weights pruning keeps: phase one's collect_step, which the collection
    reads (cfg: the run's config, its collect_step)."""
    return {cfg.collect_step} if part == "phase1" else set()


def save_plan(cfg, part: str) -> list[int]:
    """The steps a part saves (cfg: phase1_steps, phase2_steps, save_every, collect_step): every
    save_every-th and its last; phase one also collect_step, which the collection reads."""
    steps = cfg.phase1_steps if part == "phase1" else cfg.phase2_steps
    plan = set(range(cfg.save_every, steps + 1, cfg.save_every)) | {steps}
    if part == "phase1":
        plan.add(cfg.collect_step)
    # a step past the part is never reached (check_save_plan refuses it where it matters)
    return sorted(step for step in plan if 1 <= step <= steps)
