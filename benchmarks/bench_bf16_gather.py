"""What FSDP2's bf16 gathers change in a bf16 update: the same groups through one ppo_update of
2 optimizer steps on 1 rank (no FSDP: fp32 weights, autocast casts them) and on 2 gloo ranks,
with rlep.build_policy's MixedPrecisionPolicy (bf16 gathers, fp32 gradient reduction) and without
it (FSDP2's default: fp32 gathers, as before), on the tiny preset's model. Prints the 2-rank
weights' distance to the 1-rank ones, beside the same for float32 and for bf16 against float32
on 1 rank (the scale of bf16's own rounding):

    bf16, bf16 gathers: 2 ranks vs 1    max |dw| 3.6e-03, gap 9.5e-02 of the update

max |dw|: the largest difference of a single weight; gap: |w2 - w1| / |w1 - w0| over all
weights (w0 the start, w1 the 1-rank run's). Each run again once: the noise of bf16 kernels.
Run: OMP_NUM_THREADS=1 python benchmarks/bench_bf16_gather.py   (2 minutes on 2 cores)"""
import copy
import gc
import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy

repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [repo_root, os.path.join(repo_root, "tests")]
from machinery import fsdp, hub, ranks
import rlep  # noqa: E402
from test_update import held, make_groups  # noqa: E402  (the tests' groups)

cpu = torch.device("cpu")


def update(rank, world, port, model_path, cfg, groups, gathers, out):
    """One ppo_update (2 optimizer steps) on this rank's groups; rank 0 saves the full weights.
    gathers "fp32": FSDP2's default policy in place of build_policy's."""
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
    if gathers == "fp32":
        fsdp.MixedPrecisionPolicy = lambda **kwargs: MixedPrecisionPolicy()
    d = ranks.Dist(world > 1, rank, world, cpu, rank == 0)
    policy, optimizer = rlep.build_policy(model_path, cfg, d)
    rlep.ppo_update(policy, optimizer, copy.deepcopy(held(groups, rank, world)),
                    cfg.mini_batch_prompts * cfg.n, cfg, d, 0, seed=7)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(policy.model, options=options)
    if rank == 0:
        torch.save(weights, out)
    del policy, optimizer
    gc.collect()
    if world > 1:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(folder, model_path, dtype, world, gathers="bf16"):
    cfg = rlep.parse_config(["--preset", "tiny", "--lr", "1e-3", "--dtype", dtype,
                             "--mini_batch_prompts", "4", "--micro_batch_size", "5"])
    groups = make_groups(8, cfg.n, seed=3)  # 8 prompts, 4 a mini-batch: 2 optimizer steps
    out = os.path.join(folder, f"{dtype}-{world}-{gathers}.pt")
    args = (world, free_port(), model_path, cfg, groups, gathers, out)
    if world == 1:
        update(0, *args)
    else:
        mp.spawn(update, args=args, nprocs=world)
    return torch.load(out)


def compare(label, a, b, start):
    update_norm = sum(((a[k] - start[k]) ** 2).sum() for k in start).sqrt()
    gap = sum(((a[k] - b[k]) ** 2).sum() for k in start).sqrt()
    max_diff = max(float((a[k] - b[k]).abs().max()) for k in start)
    print(f"{label:<46} max |dw| {max_diff:.1e}, gap {gap / update_norm:.1e} of the update")


def main():
    with tempfile.TemporaryDirectory() as folder:
        model_path = hub.model_folder("builtin:tiny", os.path.join(folder, "cache"))
        cfg = rlep.parse_config(["--preset", "tiny"])
        policy = rlep.build_policy(model_path, cfg, ranks.Dist(False, 0, 1, cpu, True))[0]
        start = {k: v.clone() for k, v in policy.model.state_dict().items()}
        one = run(folder, model_path, "bfloat16", 1)
        largest = max(float((one[k] - start[k]).abs().max()) for k in start)
        # AdamW's first steps move a weight by about lr a step whatever its gradient's size,
        # so a gradient near 0 that changes sign moves a weight by up to 2 x lr the other way
        print(f"the 1-rank bf16 update: largest |w1 - w0| {largest:.1e} (lr 1e-3, 2 steps)")
        two = run(folder, model_path, "bfloat16", 2)
        compare("bf16, bf16 gathers: 2 ranks vs 1", two, one, start)
        compare("bf16, fp32 gathers (before): 2 ranks vs 1",
                run(folder, model_path, "bfloat16", 2, gathers="fp32"), one, start)
        compare("bf16, bf16 gathers: 2 ranks, run again", run(folder, model_path, "bfloat16", 2),
                two, start)
        compare("bf16: 1 rank, run again", run(folder, model_path, "bfloat16", 1), one, start)
        one32 = run(folder, model_path, "float32", 1)
        compare("float32: 2 ranks vs 1", run(folder, model_path, "float32", 2), one32, start)
        compare("1 rank: bf16 vs float32", one, one32, start)


if __name__ == "__main__":
    main()
