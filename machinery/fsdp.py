"""The policy's weights on the devices: the precision it computes in (bfloat16 on a GPU; on a CPU
whichever trains faster here, measured: a CPU may emulate bf16 several times slower than float32),
a causal LM in float32 read by rank 0 alone, sharded by FSDP2 over the ranks (weights, gradients
and AdamW's state)."""
import timeit
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from machinery.ranks import Dist


def load_model(path: str, d: Dist, gradient_checkpointing: bool):
    """A causal LM for training, float32, in train mode: read from `path` by rank 0 (or the one
    process); under torchrun the other ranks build it on the meta device and receive their shards
    in shard() (one host copy of the weights, not W)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    # sdpa reads a boolean 4-D mask (share_prompts) as "may attend"
    settings = dict(dtype=torch.float32, attn_implementation="sdpa")
    if d.master_process:  # also the one process of a plain run
        model = AutoModelForCausalLM.from_pretrained(path, **settings)
    else:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path),
                                                     **settings)
    model.config.use_cache = False
    # from_pretrained returns eval mode, where transformers skips gradient checkpointing
    model.train()
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def shard(policy: torch.nn.Module, model, d: Dist, gather_bf16: bool):
    """The policy on the rank's device. Under torchrun FSDP2 shards its weights, gradients and
    AdamW state, a unit per decoder layer, and rank 0's weights fill every rank's shards."""
    if not d.distributed:
        model.to(d.device)
        return
    full_weights = model.state_dict() if d.master_process else {}
    # bf16 runs gather bf16 weights (half the bytes; autocast casts them anyway) and reduce
    # gradients in fp32, as verl; the batch's floats are the loss's
    mp_policy = MixedPrecisionPolicy()
    if gather_bf16:
        mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                         cast_forward_inputs=False)
    # a unit per decoder layer, then the root unit (the policy): it gathers the embeddings, final
    # norm and LM head
    for unit in [*model.model.layers, policy]:
        fully_shard(unit, mp_policy=mp_policy)
    # rank 0's full weights into every rank's shards; the other ranks built on meta
    if not d.master_process:
        model.to_empty(device=d.device)
    set_model_state_dict(model, full_weights, options=StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=True))
    # buffers outside the state dict (rotary inv_freq) were not sent: rank 0's go now, in the
    # order of the modules, the same on every rank (one architecture)
    for buffer in model.buffers():
        dist.broadcast(buffer, src=0)


def weights_finite(model: torch.nn.Module) -> bool:
    """Whether every weight is finite, on every rank alike: their global norm, torch's own (as the
    gradient clip's; FSDP2's shards: one reduction), is finite. A norm past float32's range (a
    weight near 1e19) counts as diverged too."""
    return bool(full(torch.nn.utils.get_total_norm(model.parameters())).isfinite())


def full(tensor):
    """A DTensor's full value (a norm over FSDP2's shards: their reduction), else the tensor."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def peak_memory(device: torch.device) -> dict:
    """On a GPU, torch's peak allocation so far on this rank in GiB (the first step's: the
    update's, against the preset's estimate); {} on a CPU."""
    if device.type != "cuda":
        return {}
    return {"peak_gib": torch.cuda.max_memory_allocated(device) / 2**30}


def linear_gflops(dtype: str, model_path: str, tokens: int = 1024) -> float:
    """GFLOP/s of a forward and backward through the model's MLP up-projection on the CPU, as the
    trainer runs it: float32 weights, bf16 through autocast."""
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(model_path)
    x = torch.randn(tokens, config.hidden_size, requires_grad=True)
    weight = torch.randn(config.intermediate_size, config.hidden_size,
                         requires_grad=True)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16,
                              enabled=dtype == "bfloat16", cache_enabled=False)

    def forward_and_backward():
        with autocast:
            out = torch.nn.functional.linear(x, weight)  # (tokens, I)
        out.float().sum().backward()
    # four timed passes; the first warms the kernels up: not counted
    seconds = timeit.repeat(forward_and_backward, number=1, repeat=4)
    # 2 FLOPs a weight and token forward, twice that backward
    return 3 * 2 * tokens * config.hidden_size * config.intermediate_size / min(seconds[1:]) / 1e9


class DtypeChoice(NamedTuple):
    dtype: str
    why: str
    gflops: dict  # on a CPU: linear_gflops by dtype, measured here


def resolve_dtype(dtype: str, device: torch.device, model_path: str) -> DtypeChoice:
    """'auto': bfloat16 on a GPU; on a CPU whichever trains faster here, measured. Without
    AVX512-BF16 or AMX bf16 is emulated (~5x slower); with them it is not always fast either."""
    gflops = {name: linear_gflops(name, model_path) for name in ("float32", "bfloat16")
              if device.type == "cpu"}
    measured = "measured here, GFLOP/s: " + ", ".join(f"{name} {speed:.0f}"
                                                      for name, speed in gflops.items())
    if dtype != "auto":
        return DtypeChoice(dtype, "set by --dtype", gflops)
    if device.type == "cuda":
        return DtypeChoice("bfloat16", "GPU", gflops)
    # bf16 rounds the log-probs (a gap to vLLM's of ~0.3, not ~1e-5): it must be 1.5x faster
    if gflops["bfloat16"] >= 1.5 * gflops["float32"]:
        return DtypeChoice("bfloat16", measured, gflops)
    return DtypeChoice("float32", f"{measured}; bf16 must be 1.5x faster", gflops)
