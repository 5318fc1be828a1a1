"""What a run computes or guarantees that a plausible one-line edit could change while the rest
of the suite stayed green: the side a long prompt is cut from, the token mean's N
with replays, π_θold's single pass, a save or prune stopped for real at each of its writes,
validation's order and average on 1 and 2 ranks, the paper's rule as math_dapo reads answers,
eval.py's protocol and its benchmarks per data source, main's clean-up of a stopped save.
Expected values are worked out here, by hand or from the rule written out.
Run: python -m pytest -q tests/test_guarantees.py"""
import gc
import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict

import numpy as np
import pytest
import torch
import torch.distributed as dist
from transformers import AutoTokenizer

from machinery import UserError, builtin, checkpoints, disk, hub, ranks, vllm_engine
import eval
import forked
import rlep
import verify

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
cpu = torch.device("cpu")
single = ranks.Dist(False, 0, 1, cpu, True)
# the tiny tokenizer spells text one character a token, and its chat template is Qwen's
chat_tail = "<|im_end|>\n<|im_start|>assistant\n"


def tiny(*flags):
    return rlep.parse_config(["--preset", "tiny", *flags])


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


# -----------------------------------------------------------------------------------------
# Prompts: a prompt longer than max_prompt_len keeps its end (the question and the
# generation prompt), as verl's left truncation; a chat row's own messages are its prompt

def test_a_long_prompt_keeps_its_end_and_loses_its_start(tokenizer):
    problem = "first words, then the question: what is 3+4?"
    row = {"id": "long", "problem": problem, "answer": "7"}
    full = "<|im_start|>user\n" + problem + chat_tail
    assert rlep.render_prompt(tokenizer, row, "{problem}", 200) == tokenizer.encode(full)
    # a token a character, the chat's markers one each: the tail is 13 tokens, and 23 keep
    # the question's last 10 characters
    kept = rlep.render_prompt(tokenizer, row, "{problem}", 23)
    assert kept == tokenizer.encode("at is 3+4?" + chat_tail)
    assert tokenizer.decode(kept) == "at is 3+4?" + chat_tail


def test_a_chat_row_is_rendered_from_its_own_messages_a_plain_one_templated(tokenizer):
    """DAPO's rows carry the chat prompt (its template already applied): it is used as given,
    not templated again, and ends with the generation prompt."""
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": "Q: 2+2?"}]
    row = {"id": "chat", "problem": "Q: 2+2?", "answer": "4", "prompt": messages}
    ids = rlep.render_prompt(tokenizer, row, "Solve {problem} now", 200)
    expected = ("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nQ: 2+2?" + chat_tail)
    assert tokenizer.decode(ids) == expected
    # a plain row: the template around its problem
    plain = rlep.render_prompt(tokenizer, {"id": "p", "problem": "2+2", "answer": "4"},
                               "Solve {problem} now", 200)
    assert tokenizer.decode(plain) == "<|im_start|>user\nSolve 2+2 now" + chat_tail


# -----------------------------------------------------------------------------------------
# The update: N counts every response token of the mini-batch, replays included; π_θold is
# one no-grad pass over every mini-batch but the first

def fixed_groups(lengths, n):
    """Groups whose samples have the given response lengths; the ones past n are replays."""
    rng = np.random.default_rng(4)
    groups = []
    for group_lengths in lengths:
        prompt = rng.integers(3, 200, 4).tolist()
        groups.append([rlep.Sample(prompt, rng.integers(3, 200, length).tolist(), False, 0.0,
                                   replay=i >= n, advantage=float(rng.normal()))
                       for i, length in enumerate(group_lengths)])
    return groups


# two prompts, each n = 2 fresh responses then m = 2 replays; their tokens by hand
two_prompts = [[3, 5, 7, 2], [4, 6, 8, 1]]


def recording_loss(calls):
    """rlep.policy_loss, appending each call's (N, response tokens of its micro-batch)."""
    real = rlep.policy_loss

    def loss(*args, **kwargs):
        call = inspect.signature(real).bind(*args, **kwargs).arguments
        calls.append((call.get("num_tokens"), int(call["mask"].sum())))
        return real(*args, **kwargs)
    return loss


def test_n_counts_the_replays_tokens(tiny_model, monkeypatch):
    """Phase two's mini-batch of 2 prompts x (2 fresh + 2 replays): N = 3 + 5 + 7 + 2 +
    4 + 6 + 8 + 1 = 36, the tokens the loss sums; the fresh alone would give 18."""
    cfg = tiny("--n", "2", "--replay_m", "2", "--micro_batch_size", "3")
    policy, optimizer = rlep.build_policy(tiny_model, cfg, single)
    calls = []
    monkeypatch.setattr(rlep, "policy_loss", recording_loss(calls))
    # a mini-batch of 8 sequences: the whole step, one update
    rlep.ppo_update(policy, optimizer, dict(enumerate(fixed_groups(two_prompts, 2))), 8, cfg,
                    single, 0, seed=0)
    assert len(calls) > 1 and all(n == 36 for n, _ in calls)
    assert sum(own for _, own in calls) == 36


def test_the_first_update_is_the_token_mean_policy_gradient(tiny_model):
    """Before any update r = 1, inside the clip: the gradient of the step's one update is
    -1/N Σ_i Â_i Σ_t ∇ log π(o_it), N = 36 tokens, replays included. π_θold's shortcut
    (the forward's own log-probs) must not carry a gradient: r would stay 1 with none."""
    cfg = tiny("--n", "2", "--replay_m", "2", "--micro_batch_size", "3", "--grad_clip", "1e9")
    policy, optimizer = rlep.build_policy(tiny_model, cfg, single)
    groups = fixed_groups(two_prompts, 2)
    samples = [s for g in groups for s in g]
    batch = rlep.collate(samples, 0, cpu)
    logprobs = policy(batch)
    advantages = torch.tensor([s.advantage for s in samples])
    (-(advantages[:, None] * logprobs * batch["completion_mask"]).sum() / 36).backward()
    expected = [p.grad.clone() for p in policy.parameters()]
    optimizer.zero_grad()
    seen = []
    optimizer.step = lambda: seen.append([p.grad.clone() for p in policy.parameters()])
    rlep.ppo_update(policy, optimizer, dict(enumerate(groups)), 8, cfg, single, 0, seed=0)
    (got,) = seen
    norm = torch.sqrt(sum((e ** 2).sum() for e in expected))
    gap = torch.sqrt(sum(((g - e) ** 2).sum() for g, e in zip(got, expected)))
    assert norm > 1e-3 and gap / norm < 1e-5


def test_old_logprobs_take_one_pass_and_none_for_the_first_mini_batch(tiny_model,
                                                                      monkeypatch):
    """π_θold of the first mini-batch is its own training forward (the policy has not moved):
    the no-grad pass runs over the other mini-batches only, once each."""
    cfg = tiny("--n", "2", "--micro_batch_size", "2")
    policy, optimizer = rlep.build_policy(tiny_model, cfg, single)
    forwards = []
    real_forward = policy.forward

    def forward(batch):
        forwards.append((torch.is_grad_enabled(), len(batch["samples"])))
        return real_forward(batch)
    policy.forward = forward
    groups = fixed_groups([[3, 5], [4, 6], [2, 2]], 2)
    # 3 prompts of 2: three updates of one prompt, a micro-batch each
    rlep.ppo_update(policy, optimizer, dict(enumerate(groups)), 2, cfg, single, 0, seed=0)
    no_grad = [size for grad, size in forwards if not grad]
    trained = [size for grad, size in forwards if grad]
    assert trained == [2, 2, 2] and no_grad == [2, 2]


# -----------------------------------------------------------------------------------------
# Validation: avg@k over every sample of every problem, per data source on its own rows, on
# any number of ranks

# six problems, sources interleaved so that on 2 ranks each rank holds all three; right
# answers of k = 4: A gets 4 + 2 of 8, B 0 + 3, C 1 + 1
val_sources = ["A", "B", "C", "A", "B", "C"]
val_right = [4, 0, 1, 2, 3, 1]
val_rows = [{"id": f"v{i}", "problem": f"q{i}", "answer": str(10 + i), "data_source": source}
            for i, source in enumerate(val_sources)]
val_expected = {"val_acc": 11 / 24, "val_acc/A": 6 / 8, "val_acc/B": 3 / 8, "val_acc/C": 2 / 8}


class VerdictEngine:
    """generate answers problem q<i> right in its first val_right[i] samples, wrong after."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompts, n, *args, **kwargs):
        out = []
        for prompt in prompts:
            i = int(re.search(r"q(\d+)", self.tokenizer.decode(prompt)).group(1))
            texts = [f"Answer: {10 + i if j < val_right[i] else 99}" for j in range(n)]
            out.append([vllm_engine.Completion(self.tokenizer.encode(t), None) for t in texts])
        return out


def test_val_acc_is_the_mean_over_all_samples_of_all_problems(tokenizer):
    """avg@k, the paper's avg@32: 11 right of 6 x 4, not pass@k (5 of the 6 problems)."""
    cfg = tiny("--val_k", "4", "--verify_mode", "dapo", "--prompt_template", "{problem}")
    scores = rlep.validate(VerdictEngine(tokenizer), tokenizer, val_rows, cfg, [0], single,
                           step=0)
    assert scores == pytest.approx(val_expected, abs=1e-12)


def on_two_ranks(rank, port, model_path, out):
    """Validation with the verdict engine, then one update of 4 prompts with replays."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    d = ranks.Dist(True, rank, 2, cpu, rank == 0)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    cfg = tiny("--val_k", "4", "--verify_mode", "dapo", "--prompt_template", "{problem}",
               "--n", "2", "--replay_m", "2", "--micro_batch_size", "3")
    scores = rlep.validate(VerdictEngine(tokenizer), tokenizer, val_rows, cfg, [0], d, step=0)
    policy, optimizer = rlep.build_policy(model_path, cfg, d)
    calls = []
    rlep.policy_loss = recording_loss(calls)
    groups = fixed_groups(two_prompts + [[1, 1, 9, 3], [2, 5, 4]], 2)
    # rank r holds the prompts r, r + 2; one update of all 15 sequences
    rlep.ppo_update(policy, optimizer, dict(list(enumerate(groups))[rank::2]), 15, cfg, d, 0,
                    seed=0)
    torch.save({"scores": scores, "losses": calls}, f"{out}.{rank}")
    del policy, optimizer
    gc.collect()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tiny_model, tmp_path_factory):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path_factory.mktemp("two_ranks") / "rank")
    forked.spawn(on_two_ranks, args=(port, tiny_model, out), nprocs=2)
    return [torch.load(f"{out}.{rank}") for rank in (0, 1)]


def test_on_two_ranks_each_sources_accuracy_is_its_own(two_ranks):
    """Rank 0 answers q0, q2, q4 (A, C, B), rank 1 q1, q3, q5 (B, A, C): taken in rank order,
    A's accuracy would be scored on q0 and q2. Rank 0 logs them; rank 1 receives none."""
    scores = [result["scores"] for result in two_ranks]
    assert scores[0] == pytest.approx(val_expected, abs=1e-12) and scores[1] == {}


def test_on_two_ranks_n_counts_every_ranks_tokens_replays_included(two_ranks):
    """N = 17 + 14 (rank 0's prompts 0 and 2) + 19 + 11 (rank 1's 1 and 3) = 61 on both."""
    for result in two_ranks:
        assert result["losses"] and all(n == 61 for n, _ in result["losses"])
    assert sum(own for result in two_ranks for _, own in result["losses"]) == 61


# -----------------------------------------------------------------------------------------
# Checkpoints: a save or a prune killed at any of its writes leaves no step_NNNNNN folder
# that is not a whole checkpoint (eval.py lists every one, a resume reads the newest)

def write_events(out):
    """Counts the writes of a save as they start, while state["active"]: Python's opens for
    writing, renames and deletes (audit events) and the writers in C and Rust (torch.save,
    safetensors); SIGKILLs this process at the write numbered state["kill_at"]."""
    import safetensors.torch
    state = {"active": False, "kill_at": None, "events": []}

    def event(what):
        state["events"].append(what)
        if len(state["events"]) == state["kill_at"]:
            os.kill(os.getpid(), signal.SIGKILL)

    def audit(name, args):
        if not state["active"]:
            return
        if name == "open" and isinstance(args[0], str) and args[0].startswith(out):
            mode, flags = args[1] or "", args[2] or 0
            if any(c in mode for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR):
                event(f"open {args[0]}")
        elif name in ("os.rename", "os.remove", "os.rmdir"):
            # rmtree deletes by name within a folder's descriptor
            event(f"{name} {args[0]}")
    sys.addaudithook(audit)
    for module, name in ((torch, "save"), (safetensors.torch, "serialize_file")):
        def wrapper(*args, _real=getattr(module, name), _name=name, **kwargs):
            # a file's path, not a stream (DCP's, safetensors' bytes)
            if state["active"] and isinstance(args[1], (str, os.PathLike)):
                event(f"{_name} {args[1]}")
            return _real(*args, **kwargs)
        setattr(module, name, wrapper)
    return state


def kill_saves(model_path, out):
    """Run as a script: a complete checkpoint at step 2, then the save of step 4 (keep 1, so
    it prunes step 2) once whole, then again in a forked child killed at each write."""
    cfg = tiny("--keep_checkpoints", "1")
    policy, optimizer = rlep.build_policy(model_path, cfg, single)
    sum(p.sum() for p in policy.parameters()).backward()
    optimizer.step()  # AdamW's moments exist
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    base = os.path.join(out, "base")
    checkpoints.save(os.path.join(base, "phase1"), 2, policy, optimizer, tokenizer, cfg,
                         single)
    state = write_events(out)

    def save(run):
        shutil.copytree(base, run)
        state["active"] = True
        checkpoints.save(os.path.join(run, "phase1"), 4, policy, optimizer, tokenizer, cfg,
                             single)
        state["active"] = False
    save(os.path.join(out, "whole"))
    events = [e.replace(os.path.join(out, "whole"), "RUN") for e in state["events"]]
    killed = []
    for k in range(1, len(events) + 1):
        pid = os.fork()
        if pid == 0:
            state.update(kill_at=k, events=[])
            try:
                save(os.path.join(out, f"kill{k}"))
            finally:
                os._exit(0)  # not killed (it ended or raised): the test fails on it
        _, status = os.waitpid(pid, 0)
        killed.append(os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL)
    json.dump({"events": events, "killed": killed}, open(os.path.join(out, "report.json"), "w"))


def files_under(folder):
    return sorted(os.path.relpath(os.path.join(root, name), folder)
                  for root, _, names in os.walk(folder) for name in names)


def test_a_save_or_prune_killed_at_any_write_leaves_only_whole_checkpoints(tiny_model,
                                                                           tmp_path):
    """A save written in place, or renamed before its last file, or a prune deleting in
    place, would leave a step_NNNNNN folder that eval.py evaluates and a resume may read.
    Each kill falls on one write of step 4's save (or of step 2's prune) as it starts."""
    out = str(tmp_path)
    command = [sys.executable, __file__, tiny_model, out]
    env = {**os.environ, "PYTHONPATH": repo, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.load(open(tmp_path / "report.json"))
    events = report["events"]
    assert all(report["killed"]) and len(report["killed"]) == len(events)
    # the kills fall on every file of a checkpoint and on the prune's deletes
    whole = str(tmp_path / "whole" / "phase1" / "step_000004")
    reference = files_under(whole)
    for name in ("model.safetensors", "config.json", "tokenizer_config.json",
                 "rlep_config.json", "trainer_state.pt", "optimizer/.metadata"):
        assert name in reference
    written = " ".join(events)
    for name in ("model.safetensors", "config.json", "tokenizer_config.json", "rlep_config",
                 "trainer_state.pt", "optimizer/", "os.rename", "os.remove"):
        assert name in written, name
    base_step = str(tmp_path / "base" / "phase1" / "step_000002")
    steps_seen, leftovers_seen = set(), set()
    for k in range(1, len(events) + 1):
        run = str(tmp_path / f"kill{k}")
        part = os.path.join(run, "phase1")
        folders = sorted(n for n in os.listdir(part) if re.fullmatch(r"step_\d{6}", n))
        leftovers_seen.update(n[len("step_000000"):] for n in os.listdir(part)
                              if n not in folders)
        for name in folders:
            # whole: every file of a finished save; step 2 as it was
            assert files_under(os.path.join(part, name)) == reference, (k, events[k - 1])
            if name == "step_000002":
                for f in reference:
                    with open(os.path.join(part, name, f), "rb") as a, \
                            open(os.path.join(base_step, f), "rb") as b:
                        assert a.read() == b.read(), (k, f)
        steps = [int(n[len("step_"):]) for n in folders]
        steps_seen.add(tuple(steps))
        assert steps in ([2], [4], [2, 4]), (k, events[k - 1], steps)
        assert eval.run_checkpoints(run) == [os.path.join(part, n) for n in folders]
        step, ckpt = checkpoints.latest_checkpoint(part)
        assert (step, ckpt) == (steps[-1], os.path.join(part, folders[-1]))
        assert torch.load(os.path.join(ckpt, "trainer_state.pt"))["step"] == step
        # what the kill left is removed at the next start
        checkpoints.remove_leftovers(run)
        assert sorted(os.listdir(part)) == folders
    # kills before the rename, between it and the prune, and in the prune
    assert steps_seen == {(2,), (2, 4), (4,)}
    assert leftovers_seen == {".tmp", ".deleting"}


# -----------------------------------------------------------------------------------------
# main: a stopped save's leftovers count as free space, and go only once the checks pass

def test_a_stopped_saves_leftovers_count_as_free_and_go_only_after_the_checks(tmp_path,
                                                                              tiny_model,
                                                                              monkeypatch):
    out = tmp_path / "run"
    stopped = out / "phase1" / "step_000004.tmp"
    (stopped / "optimizer").mkdir(parents=True)
    (stopped / "model.safetensors").write_bytes(b"\0" * 64)
    free = {"bytes": 0}

    def disk_usage(path):
        return type("Usage", (), {"total": 1 << 40, "used": 1 << 40, "free": free["bytes"]})()
    monkeypatch.setattr(disk.shutil, "disk_usage", disk_usage)
    flags = ["--preset", "tiny", "--out_dir", str(out), "--cache_dir",
             os.path.dirname(tiny_model), "--resume"]
    # the run whose save stopped: its config.json, written at its start
    (out / "config.json").write_text(json.dumps(asdict(rlep.parse_config(flags))))
    monkeypatch.setattr(rlep, "build_engine", lambda *a, **k: pytest.fail("built an engine"))
    # a full disk: the leftover's 64 bytes are the free space, and a refusal deletes nothing
    with pytest.raises(UserError, match=r"^--out_dir .*: 64\.0 B free"):
        rlep.main(flags)
    assert stopped.exists()
    # room enough: the checks pass, then the leftover goes before the engine starts
    free["bytes"] = 1 << 40
    seen = []

    def engine_start(*args, **kwargs):
        seen.append(stopped.exists())
        raise KeyboardInterrupt
    monkeypatch.setattr(rlep, "build_engine", engine_start)
    with pytest.raises(KeyboardInterrupt):
        rlep.main(flags)
    assert seen == [False]


# -----------------------------------------------------------------------------------------
# A built-in model made by two processes at once (two runs started side by side in a fresh
# clone, as the studies' two streams): the second waits for the first's lock and builds nothing

def test_a_built_in_model_is_built_once_under_a_lock_and_no_temporary_is_left(
        tmp_path, monkeypatch):
    import threading
    from filelock import FileLock
    cache = tmp_path / "cache"
    builds = []

    def build(out_dir):
        builds.append(out_dir)
        os.makedirs(out_dir)
        open(os.path.join(out_dir, "weights"), "w").write("second")
    monkeypatch.setattr(builtin, "build_tiny_model", build)
    cache.mkdir()
    (cache / "tiny.tmp").mkdir()  # a build killed before its rename
    rival = FileLock(str(cache / "tiny.lock"))
    rival.acquire()  # the first run is building
    second = threading.Thread(target=hub.model_folder, args=("builtin:tiny", str(cache)))
    second.start()
    second.join(timeout=1)
    assert second.is_alive() and builds == []  # waiting, not building beside it
    (cache / "tiny.tmp").rename(cache / "tiny")
    (cache / "tiny" / "weights").write_text("first")
    rival.release()
    second.join(timeout=30)
    assert builds == [] and (cache / "tiny" / "weights").read_text() == "first"
    # alone, a build clears a killed build's leftovers and leaves no temporary
    other = tmp_path / "other"
    (other / "tiny.tmp").mkdir(parents=True)
    assert hub.model_folder("builtin:tiny", str(other)) == str(other / "tiny")
    assert builds == [str(other / "tiny.tmp")] and sorted(os.listdir(other)) == ["tiny",
                                                                                  "tiny.lock"]


# -----------------------------------------------------------------------------------------
# The paper's rule, as the authors' math_dapo.compute_score reads an answer: the last
# "(?i)Answer\s*:" line of the last 300 characters, after "=", normalised as Minerva, gold too

@pytest.mark.parametrize("response, gold, expected", [
    ("so\nanswer: 7", "7", True),  # (?i): any case
    ("so\nANSWER: 7", "7", True),
    ("so\nAnswer : 7", "7", True),  # \s* before the colon
    ("so\nAnswer: x = 7", "7", True),  # the part after the last "="
    ("so\nAnswer: \\boxed{7}", "7", True),  # a box on the answer line is opened
    ("so\nAnswer: the total is $7$", "7", True),  # the first $...$ span
    ("so\nAnswer: \\frac{1}{2}", "\\frac12", True),  # the gold is normalised as well
    ("so\nAnswer: 7", "$7$", True),
    ("so\nAnswers 7", "7", False),  # no colon: no answer line
    ("so\nAnswer: 8", "7", False),
])
def test_the_paper_rule_reads_answers_as_math_dapo(response, gold, expected):
    assert verify.verify(response, gold, mode="dapo") is expected


def test_a_lower_case_answer_line_is_rewarded_under_the_paper_rule(tokenizer):
    cfg = tiny("--n", "2", "--verify_mode", "dapo", "--overlong_buffer", "0")
    row = {"id": "q", "problem": "3+4", "answer": "7"}
    ids = [tokenizer.encode(t) + [tokenizer.eos_token_id] for t in ("answer: 7", "answer: 8")]
    group = rlep.build_group(row, [1, 2], [(i, None) for i in ids], tokenizer, cfg,
                             tokenizer.eos_token_id)
    assert [s.reward for s in group] == [1.0, -1.0]


# -----------------------------------------------------------------------------------------
# eval.py: the paper's protocol by default, a benchmark per data source of a file

def test_eval_defaults_are_the_papers_protocol():
    """docs/paper.md: avg@32 at temperature 1.0 and top-p 1.0, 3072 new tokens after a
    prompt of up to 1024, the training prompt template."""
    args = eval.parse_args(["--model", "m", "--data", "d.jsonl"])
    assert (args.k, args.temperature, args.top_p) == (32, 1.0, 1.0)
    assert (args.max_new_tokens, args.max_prompt_len) == (3072, 1024)
    assert args.prompt_template == rlep.parse_config(["--preset", "paper"]).prompt_template


def test_a_file_of_several_sources_is_a_benchmark_each_with_its_own_rows(tmp_path):
    """The authors' validation file holds AIME-2024, AIME-2025 and AMC-2023, interleaved."""
    rows = [{"problem": f"p{i}", "answer": str(i), "data_source": s}
            for i, s in enumerate(["aime24", "amc23", "aime24", "aime25", "amc23"])]
    path = tmp_path / "val.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    single_path = tmp_path / "math.jsonl"
    single_path.write_text(json.dumps({"problem": "q", "answer": "1"}) + "\n")
    benchmarks = eval.load_benchmarks([str(path), str(single_path)])
    assert {name: [r["problem"] for r in rs] for name, rs in benchmarks.items()} == {
        "val/aime24": ["p0", "p2"], "val/amc23": ["p1", "p4"], "val/aime25": ["p3"],
        "math": ["q"]}


if __name__ == "__main__":
    kill_saves(sys.argv[1], sys.argv[2])
