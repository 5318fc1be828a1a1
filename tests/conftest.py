"""Environment for the tests: set before torch is imported. vLLM runs in-process on the CPU."""
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")  # 2 shared cores: more threads only spin (VLLM_CPU.md)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """The tiny preset's model, built once per test session (5 s) into a temporary cache."""
    import rlep
    cache = tmp_path_factory.mktemp("cache")
    return rlep.resolve_model("builtin:tiny", str(cache), rlep.Dist(False, 0, 1, None, True))
