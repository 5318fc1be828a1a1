"""The quick tier's guard (tests/conftest.py): a test marked quick that would start a vLLM engine,
a run of rlep.py or eval.py, torchrun or ranks fails, one that starts an ordinary process passes.
Run: python -m pytest -q tests/test_quick_tier.py"""
import os
import shutil
import subprocess
import sys
import textwrap

tests = os.path.dirname(os.path.abspath(__file__))
repo = os.path.dirname(tests)


def test_a_quick_test_that_starts_an_engine_a_run_or_ranks_fails(tmp_path):
    # conftest's guard on a copy of a quick file (by its name), in a session of its own
    for name in ("conftest.py", "forked.py"):
        shutil.copy(os.path.join(tests, name), tmp_path / name)
    (tmp_path / "test_loss.py").write_text(textwrap.dedent("""\
        import subprocess, sys
        import torch.multiprocessing as mp
        import forked
        from machinery import vllm_engine
        def test_engine(): vllm_engine.start()
        def test_forked_script(): forked.script("rlep.py", [], "stderr.txt")
        def test_forked_ranks(): forked.spawn(print)
        def test_spawned_ranks(): mp.spawn(print)
        def test_run(): subprocess.run([sys.executable, "rlep.py", "--help"])
        def test_eval(): subprocess.run([sys.executable, "eval.py", "--help"])
        def test_torchrun(): subprocess.run([sys.executable, "-m", "torch.distributed.run"])
        def test_a_process(): subprocess.run([sys.executable, "-c", "pass"], check=True)
        """))
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "quick", "-p",
                             "no:cacheprovider", "-rf", str(tmp_path)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": repo})
    failed = sorted(line.split("::")[1].split(" ")[0] for line in result.stdout.splitlines()
                    if line.startswith("FAILED"))
    assert failed == ["test_engine", "test_eval", "test_forked_ranks", "test_forked_script",
                      "test_run", "test_spawned_ranks", "test_torchrun"], result.stdout[-3000:]
    assert "7 failed, 1 passed" in result.stdout
