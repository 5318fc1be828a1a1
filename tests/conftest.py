"""Environment for the tests: set before torch is imported. vLLM runs in-process on the CPU."""
import os
import sys

# 2 shared cores: more threads only spin (docs/cpu.md: vLLM on a CPU)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """The tiny preset's model, built once per test session (5 s) into a temporary cache."""
    from machinery import hub, ranks
    cache = tmp_path_factory.mktemp("cache")
    return hub.model_folder("builtin:tiny", str(cache))


engines = {}


@pytest.fixture
def tiny_engine(tiny_model):
    """One vLLM-CPU engine on the tiny model for the in-process tests: vLLM's parallel state is
    process-wide, so a second engine's teardown breaks the first. eval.main's in-process runs
    build and shut down engines of their own: after one, a new shared engine is built. Tests push
    the weights they need before generating."""
    import torch
    from vllm.distributed import parallel_state

    import rlep
    from machinery import ranks
    if "tiny" not in engines or not parallel_state.model_parallel_is_initialized():
        cfg = rlep.parse_config(["--preset", "tiny"])
        cpu = ranks.Dist(False, 0, 1, torch.device("cpu"), True)
        engines["tiny"] = rlep.build_engine(cfg, tiny_model, cpu)
    return engines["tiny"]


@pytest.fixture
def free_port():
    """A local TCP port free right now: for a process group's store or a torchrun rendezvous."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
