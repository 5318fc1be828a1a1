"""The precision a run trains in: bfloat16 on a GPU; on a CPU whichever trains faster here,
measured (a CPU may emulate bf16 several times slower than float32)."""
import time
from typing import NamedTuple

import torch


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
    """'auto': bfloat16 on a GPU; on a CPU whichever trains faster here, measured. Without
    AVX512-BF16 or AMX bf16 is emulated (~5x slower); with them it is not always fast either."""
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
