"""Checkpoints: a part's step_NNNNNN folders, written whole (a .tmp folder renamed) with their
own record, checkpoint.json, written last: every file with its size, so a checkpoint proves it is
whole (damage names what is missing or cut). HF weights gathered to rank 0, AdamW's state a file
per rank (torch.distributed.checkpoint, resharded on resume); the newest few kept, the
collection's step kept as weights. disk.py sizes them against the disk before a run; a disk that
fills during a save stops the run in one line."""
import errno
import glob
import json
import os
import re
import shutil
import traceback
from dataclasses import asdict

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_optimizer_state_dict)

from machinery import RunStopped, UserError
from machinery.files import write_atomic
from machinery.ranks import barrier


def checkpoint_path(part_dir: str, step: int) -> str:
    return os.path.join(part_dir, f"step_{step:06d}")


def step_folders(part_dir: str) -> list[int]:
    """The steps of a part's step_NNNNNN folders, oldest first (a save cut short left only a
    `.tmp` folder, which is not one)."""
    # glob finds nothing in a folder not there yet; ASCII digits: \d and str.isdigit take "²",
    # which int() refuses
    return sorted(int(name.removeprefix("step_"))
                  for name in glob.glob("step_*", root_dir=part_dir)
                  if re.fullmatch("step_[0-9]+", name))


def complete_checkpoints(part_dir: str) -> list[int]:
    """The steps of a part's complete checkpoints, oldest first: those holding their record
    (damage says whether each file it lists is still there)."""
    return [step for step in step_folders(part_dir)
            if os.path.isfile(os.path.join(checkpoint_path(part_dir, step), "checkpoint.json"))]


def latest_checkpoint(part_dir: str) -> tuple[int, str | None]:
    """(step, folder) of the newest complete checkpoint, or (0, None)."""
    steps = complete_checkpoints(part_dir)
    if not steps:
        return 0, None
    return steps[-1], checkpoint_path(part_dir, steps[-1])


def write_record(folder: str, step: int):
    """checkpoint.json: the step and every file of the folder with its size, written last."""
    # sorted: in the order of their names within the folder
    paths = sorted(os.path.join(root, name) for root, _, names in os.walk(folder)
                   for name in names if name != "checkpoint.json")
    sizes = {os.path.relpath(path, folder): os.path.getsize(path) for path in paths}
    write_atomic(os.path.join(folder, "checkpoint.json"),
                 json.dumps({"step": step, "files": sizes}, indent=1))


def damage(folder: str, weights_only: bool = False) -> str:
    """What makes a checkpoint less than whole ("" if nothing): its record missing, a file it
    lists missing or of another size; a resume needs AdamW's state and the trainer state too,
    the collection and eval.py the weights (weights_only: pruning keeps only them at the
    collection's step)."""
    try:
        with open(os.path.join(folder, "checkpoint.json")) as f:
            listed = json.load(f)["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return "no readable checkpoint.json (a save cut short, or files removed by hand)"
    # a record edited by hand: its sizes are compared, and a resume reads what it must list
    if not isinstance(listed, dict) or any(type(size) is not int for size in listed.values()):
        return "checkpoint.json's files is not {file: its size in bytes}"
    if not any(name.endswith(".safetensors") for name in listed):
        return "checkpoint.json does not list its weights"
    if not weights_only and "trainer_state.pt" not in listed:
        return "checkpoint.json does not list its trainer_state.pt"
    for name, size in listed.items():
        if weights_only and (name.startswith("optimizer") or name == "trainer_state.pt"):
            continue
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            return f"{name} is missing"
        if os.path.getsize(path) != size:
            return f"{name} holds {os.path.getsize(path):,} bytes, its record {size:,}"
    return ""


def check_resume(part_dir: str):
    """Refuse to resume a part whose newest checkpoint is damaged, naming what is missing and the
    step a resume would fall back to once it is moved away."""
    steps = step_folders(part_dir)
    if not steps or not (what := damage(checkpoint_path(part_dir, steps[-1]))):
        return
    older = [step for step in steps[:-1] if not damage(checkpoint_path(part_dir, step))]
    fallback = (f"to resume from step {older[-1]}, the newest whole one" if older else
                "to start the part over (no whole checkpoint is older)")
    raise UserError(f"{checkpoint_path(part_dir, steps[-1])}: damaged, {what}: move it away "
                    f"{fallback}")


def resume_point(part_dir: str) -> tuple[int, str | None, int]:
    """latest_checkpoint's (step, folder) and the round of prompts the next step starts at (the
    training rows' pass, which dynamic sampling can run ahead of the step); a checkpoint older
    than --dynamic_sampling: the step."""
    step, folder = latest_checkpoint(part_dir)
    # no checkpoint: step 0, at round 0
    state = (torch.load(os.path.join(folder, "trainer_state.pt"), map_location="cpu") if folder
             else {})
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
            try:
                os.replace(folder, folder + ".deleting")
                shutil.rmtree(folder + ".deleting")
            except OSError as e:  # a folder made read-only, another user's files
                raise RunStopped(f"{folder}: pruning cannot remove it ({e.strerror}): make it "
                                 "removable, then --resume (the newest checkpoints are whole)")


def leftovers(out_dir: str) -> list[str]:
    """A stopped prune's `step_*.deleting` folders and a stopped save's `step_*.tmp`: dead
    weight, which the disk check counts as free."""
    return [os.path.join(out_dir, name)
            for name in sorted(glob.glob("phase[12]/step_*", root_dir=out_dir))
            if name.endswith((".deleting", ".tmp"))]


def remove_leftovers(out_dir: str):
    """The leftovers, removed by rank 0 before the run writes."""
    if found := leftovers(out_dir):
        for folder in found:
            shutil.rmtree(folder)
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
    weights = get_model_state_dict(
        policy.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    # a tied weight (SmolLM2's head) comes back gathered under both names, in two copies that
    # save_pretrained would both write: keep the first name, as an unsharded save does (the one
    # named_parameters gives, which lists a shared parameter once)
    first_names = dict(policy.model.named_parameters())
    for name, _ in policy.model.named_parameters(remove_duplicate=False):
        if name not in first_names:
            weights.pop(name, None)
    try:
        if d.master_process:
            shutil.rmtree(tmp, ignore_errors=True)
            policy.model.save_pretrained(tmp, state_dict=weights)
            tokenizer.save_pretrained(tmp)
            write_atomic(os.path.join(tmp, "rlep_config.json"), json.dumps(asdict(cfg), indent=2))
        # rank 0's full copy goes before AdamW's state is gathered
        del weights
        barrier(d)
        dcp.save({"optimizer": get_optimizer_state_dict(policy, optimizer)},
                 checkpoint_id=os.path.join(tmp, "optimizer"))
        if d.master_process:
            # data order and replay draws derive from the step; the RNG state is kept for safety
            torch.save({"step": step, "torch_rng": torch.get_rng_state(),
                        # the next step's first round of prompts (resume_point)
                        "prompt_round": step if prompt_round is None else prompt_round},
                       os.path.join(tmp, "trainer_state.pt"))
            # last: the record that makes it whole
            write_record(tmp, step)
    except BaseException as e:  # DCP's CheckpointException is one, not an Exception
        # ENOSPC, raised as it is (an OSError's text holds its strerror) or inside a library's
        # error (safetensors', DCP's, which carries each rank's in its text)
        if os.strerror(errno.ENOSPC) not in "".join(traceback.format_exception(e)):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        params = sum(p.numel() for p in policy.parameters())
        free = shutil.disk_usage(part_dir).free
        raise RunStopped(f"{part_dir}: the disk filled during step {step}'s save: a checkpoint "
                         f"needs about {12 * params / 1e9:.1f} GB, {free / 1e9:.1f} GB are free; "
                         "free some, then --resume (the newest whole checkpoint is kept)") from None
    if d.master_process:
        # the same step saved again after a resume
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        prune_checkpoints(part_dir, cfg.keep_checkpoints, protected)
    barrier(d)


def divergence_line(part_dir: str, step: int, grad_norm: float, lr: float) -> str:
    """What a run that diverged at `step` says: the cause the numbers point to, the last good
    checkpoint and how to go on from it."""
    last = latest_checkpoint(part_dir)[0]
    where = (f"the last good checkpoint is {os.path.basename(part_dir)} step {last}: continue "
             "from it with a lower --lr (--resume --override --lr ...)" if last else
             "no checkpoint was saved before it: start again with a lower --lr")
    return (f"{os.path.basename(part_dir)} step {step}: the update diverged (grad_norm "
            f"{grad_norm:.3g}, the loss or the weights no longer finite); the likely cause is "
            f"the learning rate, --lr {lr:g}; {where}")


def load_trainer_state(ckpt: str, policy, optimizer):
    """AdamW's state (resharded to this run's ranks) and the RNG state, read to the CPU
    (set_rng_state fails on a GPU tensor)."""
    state = {"optimizer": get_optimizer_state_dict(policy, optimizer)}
    dcp.load(state, checkpoint_id=os.path.join(ckpt, "optimizer"))
    set_optimizer_state_dict(policy, optimizer, state["optimizer"])
    torch.set_rng_state(torch.load(os.path.join(ckpt, "trainer_state.pt"),
                                   map_location="cpu")["torch_rng"])


def protected_steps(cfg, part: str) -> set[int]:
    """The steps whose weights pruning keeps: phase one's collect_step, which the collection
    reads (cfg: the run's config, its collect_step)."""
    return {cfg.collect_step} if part == "phase1" else set()


def save_plan(cfg, part: str) -> list[int]:
    """The steps a part saves (cfg: phase1_steps, phase2_steps, save_every, collect_step): every
    save_every-th and its last; phase one also collect_step, which the collection reads."""
    steps = getattr(cfg, f"{part}_steps")
    # the protected step: phase one's collect_step
    plan = (set(range(cfg.save_every, steps + 1, cfg.save_every)) | {steps}
            | protected_steps(cfg, part))
    # a step past the part is never reached (check_save_plan refuses it where it matters)
    return sorted(step for step in plan if 1 <= step <= steps)
