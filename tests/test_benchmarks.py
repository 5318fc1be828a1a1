"""The first device hour's script (benchmarks/bench_trainer.py) runs where a GPU machine is lent:
torch and transformers, no vLLM, no network. On the CPU its smoke mode runs the same code on tiny
shapes with vLLM and the CPU presets' packages made unimportable; a GPU's numbers come only from a
GPU. Run: python -m pytest -q tests/test_benchmarks.py"""
import os
import re
import subprocess
import sys

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what a lent GPU machine lacks: `import vllm` and the rest raise ImportError
hidden = ["vllm", "pyarrow", "latex2sympy2_extended", "antlr4", "gguf", "accelerate", "wandb",
          "matplotlib", "scipy"]


def test_the_first_device_hours_script_runs_without_vllm_and_prints_both_presets():
    script = os.path.join(repo, "benchmarks", "bench_trainer.py")
    prelude = (f"import runpy, sys; sys.modules.update(dict.fromkeys({hidden!r})); "
               f"sys.argv = [{script!r}, '--smoke', '--steps', '1']; "
               f"runpy.run_path({script!r}, run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", prelude], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1",
                                              "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    for preset, whose in (("gpu", "the whole step"), ("node", "a node rank's share")):
        block = re.search(rf"^{preset} preset, {whose} on one CPU: .*\n  measured: ([\d.]+) s a "
                          r"step .* ([\d,]+) tokens/s.*\n  estimate: ([\d.]+) s a step .* peak "
                          r"([\d.]+) GiB", result.stdout, re.M)
        assert block, result.stdout
        seconds, tokens_s, estimate, gib = block.groups()
        assert float(seconds) > 0 and int(tokens_s.replace(",", "")) > 0
        assert float(estimate) > 0 and 20 < float(gib) < 80  # the 1.5B update's (est.)
