"""Why rlep.py sums gradients with one all_reduce per optimizer step instead of wrapping in DDP.

    OMP_NUM_THREADS=1 python benchmarks/bench_grad_copies.py ddp    # DDP, bucket views, no_sync
    OMP_NUM_THREADS=1 python benchmarks/bench_grad_copies.py plain  # what rlep.py does

It prints the bytes of the distinct storages behind the gradients of a 256 MiB fp32 model (what a
GPU allocator would hold), on a one-rank gloo group. With DDP, a mini-batch that starts from grads
set to None backpropagates under no_sync into new tensors beside DDP's buckets: two copies of the
gradients. For Qwen2.5-Math-7B that is an extra 28 GiB per GPU (docs/gpu.md: Memory budget).
"""
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
# 16 layers of 16 MiB
model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048, bias=False) for _ in range(16)])
x = torch.randn(4, 2048)


def grad_storages() -> dict:
    """{data_ptr: bytes} of the storages behind the gradients."""
    return {p.grad.untyped_storage().data_ptr(): p.grad.untyped_storage().nbytes()
            for p in model.parameters() if p.grad is not None}


def mib(storages: dict) -> int:
    return sum(storages.values()) // 2 ** 20


if sys.argv[1] == "ddp":
    policy = DDP(model, gradient_as_bucket_view=True)
    for _ in range(2):  # synced, twice: DDP rebuilds its buckets at the second forward
        policy(x).sum().backward()  # the gradients become views of DDP's buckets
    buckets = grad_storages()
    policy.zero_grad(set_to_none=True)  # a new mini-batch starts from None
    with policy.no_sync():
        policy(x).sum().backward()
    grads = grad_storages()
    in_buckets = {ptr: size for ptr, size in grads.items() if ptr in buckets}
    print(f"ddp: buckets {mib(buckets)} MiB (alive while DDP is), "
          f"grads after a no_sync backward {mib(grads)} MiB, "
          f"of which in the buckets {mib(in_buckets)} MiB")
    policy(x).sum().backward()
    grads = grad_storages()
    print(f"ddp: after the synced backward, grads {mib(grads)} MiB, "
          f"all in the buckets: {set(grads) <= set(buckets)}")
else:
    model(x).sum().backward()
    model(x).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    print(f"plain: grads after two backwards and the all-reduce {mib(grad_storages())} MiB, "
          "no other copy")
    model.zero_grad(set_to_none=True)
    print(f"plain: after zero_grad(set_to_none=True) {mib(grad_storages())} MiB")
dist.destroy_process_group()
