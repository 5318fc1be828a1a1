"""The first device hour's script (benchmarks/bench_trainer.py) runs where a GPU machine is lent:
torch and transformers, no vLLM, no network. On the CPU its smoke mode runs the same code on tiny
shapes with every package the lent image lacks made unimportable (vLLM, pydantic, W&B, the
verifier's LaTeX parser, the CPU presets' own); a GPU's numbers come only from a GPU.
Run: python -m pytest -q tests/test_benchmarks.py"""
import os
import re
import subprocess
import sys
from importlib import metadata

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what a lent GPU machine holds: these distributions and what they require
image = ["torch", "transformers", "huggingface_hub", "safetensors", "filelock", "tqdm", "numpy",
         "scipy", "sympy", "matplotlib", "pandas", "pyarrow"]
# and what it lacks though a requirement here names it (typer's pydantic)
absent = ["vllm", "pydantic", "pydantic_core", "wandb", "latex2sympy2_extended", "antlr4"]


def lacking_from_the_image() -> list[str]:
    """The top-level modules installed here that no distribution of the image provides: on the
    image, `import vllm`, `import pydantic`, `import wandb` and the rest raise ImportError."""
    held, todo = set(), list(image)
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in held:
            continue
        held.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:  # one the image has and this machine lacks
            continue
        todo += [re.match(r"[A-Za-z0-9_.-]+", r).group() for r in requires if "extra ==" not in r]
    provided = metadata.packages_distributions()
    return sorted(set(absent) | {module for module, dists in provided.items()
                                 if module.isidentifier() and module not in sys.stdlib_module_names
                                 and all(re.sub(r"[-_.]+", "-", d).lower() not in held
                                         for d in dists)})


def test_the_first_device_hours_script_runs_without_vllm_and_prints_both_presets():
    script = os.path.join(repo, "benchmarks", "bench_trainer.py")
    hidden = lacking_from_the_image()
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
