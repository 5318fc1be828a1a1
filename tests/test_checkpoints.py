"""A long run's resources and restarts: old checkpoints pruned (the newest few, the
collection's kept), the disk budget (the peak of what pruning leaves, from what a resumed run
already holds) checked before anything is written, the collection's step always saved, the
leftovers of a stopped save or prune removed, rank 0's view of the run folder taken by every
rank, the phase-one policy freed before phase two builds its own.
Run: python -m pytest -q tests/test_checkpoints.py"""
import contextlib
import errno
import os
import pickle
import weakref

import pytest
import torch
import torch.distributed as dist
from transformers import AutoTokenizer

from machinery import (RunStopped, UserError, checkpoints, data, disk, files, preflight, ranks,
                       vllm_engine)
import forked
import rlep


def fake_checkpoint(part_dir, step, complete=True):
    """A checkpoint's files, empty; complete: with its record (checkpoint.json), as a finished
    save leaves it."""
    folder = checkpoints.checkpoint_path(str(part_dir), step)
    os.makedirs(os.path.join(folder, "optimizer"))
    open(os.path.join(folder, "model.safetensors"), "w").close()
    if complete:
        open(os.path.join(folder, "trainer_state.pt"), "w").close()
        checkpoints.write_record(folder, step)
    return folder


def test_pruning_keeps_the_newest_whole_and_the_protected_weights(tmp_path):
    for step in (20, 40, 60, 80):
        fake_checkpoint(tmp_path, step)
    in_flight = fake_checkpoint(tmp_path, 100, complete=False)
    os.rename(in_flight, in_flight + ".tmp")
    checkpoints.prune_checkpoints(str(tmp_path), keep=2, protected={20})
    assert checkpoints.complete_checkpoints(str(tmp_path)) == [20, 60, 80]
    with_optimizer = [s for s in (20, 60, 80)
                      if os.path.isdir(os.path.join(checkpoints.checkpoint_path(str(tmp_path), s),
                                                    "optimizer"))]
    # the newest two can be resumed from; the collection's keeps only its weights
    assert with_optimizer == [60, 80]
    # a save in flight is not a checkpoint, and is not touched
    assert os.path.isdir(in_flight + ".tmp")
    newest = checkpoints.checkpoint_path(str(tmp_path), 80)
    assert checkpoints.latest_checkpoint(str(tmp_path)) == (80, newest)


def fake_sized_checkpoint(part_dir, step, params):
    """A complete checkpoint whose files have a real one's sizes for `params` parameters:
    fp32 weights (4 bytes each, its record's bytes among them), AdamW's two moments (8)."""
    folder = fake_checkpoint(part_dir, step)
    record = os.path.getsize(os.path.join(folder, "checkpoint.json"))
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.truncate(4 * params - record)
    with open(os.path.join(folder, "optimizer", "0.distcp"), "wb") as f:
        f.truncate(8 * params)


def bytes_under(folder):
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(folder) for name in names)


def replay_saves(cfg, out_dir, params):
    """The saves of the command cfg.phase as save_checkpoint makes them (a new checkpoint
    whole beside the others, then checkpoints.prune_checkpoints), on fake checkpoints of real
    sizes: the most bytes the run's folder held."""
    peak = bytes_under(out_dir)
    parts = {"all": ["phase1", "phase2"], "1": ["phase1"], "2": ["phase2"]}[cfg.phase]
    for part in parts:
        part_dir = os.path.join(out_dir, part)
        done = checkpoints.latest_checkpoint(part_dir)[0]
        for step in [s for s in checkpoints.save_plan(cfg, part) if s > done]:
            fake_sized_checkpoint(part_dir, step, params)
            peak = max(peak, bytes_under(out_dir))
            protected = {cfg.collect_step} if part == "phase1" else set()
            checkpoints.prune_checkpoints(part_dir, cfg.keep_checkpoints, protected)
    return peak


def test_a_resumed_part_keeps_the_logs_of_its_checkpoints_steps_and_a_fresh_start_none(tmp_path):
    """train's start (files.forget_after): from a checkpoint at step 2, the rows of steps 0-2
    stay; with none (step 0), no row stays, so the base model's step 0, logged again, is there
    once."""
    def write_logs():
        files.write_atomic(str(tmp_path / "metrics.jsonl"),
                           "".join(f'{{"step": {step}}}\n' for step in range(4)))
        files.write_atomic(str(tmp_path / "samples.jsonl"),
                           "".join(f'{{"step": {step}}}\n' for step in range(1, 4)))

    def steps(name):
        return [row["step"] for row in files.read_jsonl(str(tmp_path / name))]
    write_logs()
    files.forget_after(str(tmp_path), 2)
    assert (steps("metrics.jsonl"), steps("samples.jsonl")) == ([0, 1, 2], [1, 2])
    write_logs()
    files.forget_after(str(tmp_path), 0)
    assert (steps("metrics.jsonl"), steps("samples.jsonl")) == ([], [])


@pytest.mark.parametrize("flags, peak", [
    # the paper preset's schedule, shortened: 8 steps a part, a save every 2. Phase one ends
    # with its newest 2 (the collection's among them), phase two writes a third beside its 2
    (["--phase", "all"], 5 * 12),
    # one part: 2 kept and the one being written
    (["--phase", "1"], 3 * 12), (["--phase", "2"], 3 * 12),
    # keep-all: every save of both parts, 4 + 4
    (["--phase", "all", "--keep_checkpoints", "0"], 8 * 12),
    # a collection step between saves, keep 1: its weights stay beside phase one's newest,
    # and phase two writes its second checkpoint beside its first
    (["--phase", "all", "--collect_step", "3", "--keep_checkpoints", "1"], 4 + 3 * 12)])
def test_the_disk_budget_is_the_peak_of_what_pruning_leaves(tmp_path, flags, peak):
    """In bytes a parameter: 12 a whole checkpoint, 4 the collection's weights alone."""
    params = 1000
    cfg = rlep.parse_config(["--preset", "paper", "--out_dir", str(tmp_path), "--phase1_steps",
                             "8", "--phase2_steps", "8", "--collect_step", "8", "--save_every",
                             "2", *flags])
    size = disk.CheckpointSize(whole=12 * params, weights=4 * params)
    budget = disk.disk_budget(cfg, size, disk.held_checkpoints(str(tmp_path)))
    assert budget["per_checkpoint"] == 12 * params and budget["on_disk"] == 0
    assert budget["peak"] == budget["need"] == peak * params
    # the same saves and prunes on files of real sizes
    assert replay_saves(cfg, str(tmp_path), params) == peak * params


def test_a_resumed_run_is_budgeted_for_what_it_still_writes(tmp_path, tiny_model, monkeypatch,
                                                            capsys):
    """Phase two stopped after its step 4: phase one's last two checkpoints (the collection's
    among them) and phase two's two are on disk; the run needs room for one more."""
    params = 1000
    cfg = rlep.parse_config(["--preset", "paper", "--out_dir", str(tmp_path), "--phase1_steps",
                             "8", "--phase2_steps", "8", "--collect_step", "8", "--save_every",
                             "2", "--resume"])
    for part, steps in (("phase1", (6, 8)), ("phase2", (2, 4))):
        for step in steps:
            fake_sized_checkpoint(tmp_path / part, step, params)
    size = disk.CheckpointSize(whole=12 * params, weights=4 * params)
    held = disk.held_checkpoints(str(tmp_path))
    budget = disk.disk_budget(cfg, size, held)
    # measured, as held: 12 bytes a parameter in these
    assert budget["on_disk"] == bytes_under(tmp_path) == 4 * 12 * params
    # one more checkpoint, then the oldest of phase two is pruned
    assert budget["need"] == 12 * params

    def free_space(free):
        usage = type("Usage", (), {"free": free})()
        monkeypatch.setattr(disk.shutil, "disk_usage", lambda path: usage)
    # check_disk: the tiny model's checkpoint, and the metrics, samples and pool beside
    need = disk.disk_budget(cfg, disk.checkpoint_size(tiny_model), held)["need"]
    need += disk.log_bytes(cfg, num_rows=0)
    free_space(need)
    assert "of them on disk already" in disk.check_disk(cfg, tiny_model)
    free_space(need - 1)
    with pytest.raises(UserError, match="need .* more") as error:
        disk.check_disk(cfg, tiny_model)
    assert str(tmp_path) in str(error.value)
    # the rest of the run, saved and pruned
    assert replay_saves(cfg, str(tmp_path), params) == budget["peak"]


def test_a_refused_start_leaves_no_run_behind(tmp_path, tiny_model, monkeypatch):
    """The disk check comes before config.json: the same command, given room, starts; it
    does not fail with "already holds a run"."""
    no_room = type("Usage", (), {"free": 0})()
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda path: no_room)
    out = tmp_path / "run"
    command = ["--preset", "tiny", "--out_dir", str(out),
               "--cache_dir", os.path.dirname(tiny_model)]
    for _ in range(2):
        with pytest.raises(UserError, match="free"):
            rlep.main(command)
    assert not out.exists()


def test_a_full_disk_in_a_save_stops_in_one_line_and_keeps_the_last_checkpoint(
        tmp_path, tiny_model, monkeypatch):
    """The disk fills as step 4's trainer state is written: the run stops (RunStopped, one line
    naming the folder and the space a checkpoint needs); no .tmp is left, step 2 stays whole."""
    cfg = rlep.parse_config(["--preset", "tiny"])
    d = ranks.Dist(False, 0, 1, torch.device("cpu"), True)
    policy, optimizer = rlep.build_policy(tiny_model, cfg, d)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    part = str(tmp_path / "phase1")
    checkpoints.save(part, 2, policy, optimizer, tokenizer, cfg, d)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(RunStopped) as stopped:
        checkpoints.save(part, 4, policy, optimizer, tokenizer, cfg, d)
    line = str(stopped.value)
    assert line.startswith(f"{part}: the disk filled during step 4's save: a checkpoint needs "
                           "about 0.0 GB") and "then --resume" in line and "\n" not in line
    assert sorted(os.listdir(part)) == ["step_000002"]
    assert checkpoints.damage(checkpoints.checkpoint_path(part, 2)) == ""


def test_the_checkpoint_estimate_covers_a_real_one(tmp_path, tiny_model):
    """A tiny checkpoint as save_checkpoint writes it (weights, AdamW's state, tokenizer,
    trainer state): the estimate is at least its bytes, and at most 10 % over (weights
    alone: 20 %)."""
    cfg = rlep.parse_config(["--preset", "tiny"])
    d = ranks.Dist(False, 0, 1, torch.device("cpu"), True)
    policy, optimizer = rlep.build_policy(tiny_model, cfg, d)
    sum(p.sum() for p in policy.parameters()).backward()
    optimizer.step()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    checkpoints.save(str(tmp_path / "phase1"), 2, policy, optimizer, tokenizer, cfg, d)
    folder = checkpoints.checkpoint_path(str(tmp_path / "phase1"), 2)
    whole = bytes_under(folder)
    weights = whole - bytes_under(os.path.join(folder, "optimizer"))
    size = disk.checkpoint_size(tiny_model)
    assert whole <= size.whole <= 1.1 * whole and weights <= size.weights <= 1.2 * weights
    # a checkpoint on disk is measured
    assert disk.held_checkpoints(str(tmp_path)) == {("phase1", 2): (whole, weights)}
    assert disk.show_bytes(size.whole) == f"{size.whole / 1e6:.1f} MB"
    assert disk.show_bytes(2.5e9) == "2.5 GB" and disk.show_bytes(0) == "0.0 B"


@pytest.mark.parametrize("collect_step", [0, 5])
def test_a_collection_step_phase_one_never_reaches_is_refused(collect_step):
    cfg = rlep.parse_config(["--preset", "tiny", "--collect_step", str(collect_step)])
    assert cfg.phase1_steps == 4
    with pytest.raises(ValueError, match="--collect_step"):
        preflight.check_save_plan(cfg)
    with pytest.raises(ValueError, match="--collect_step"):
        preflight.check_save_plan(rlep.parse_config(["--preset", "tiny", "--phase", "collect",
                                                "--collect_step", str(collect_step)]))
    # no collection: phase one or two alone, or a run given its pool
    for flags in (["--phase", "1"], ["--phase", "2"], ["--pool", "pool.jsonl"]):
        preflight.check_save_plan(rlep.parse_config(["--preset", "tiny", "--collect_step",
                                                str(collect_step), *flags]))
    # a step phase one never reaches is not budgeted as a save
    assert checkpoints.save_plan(cfg, "phase1") == [2, 4]


def test_phase_one_saves_the_collection_step_between_saves(tiny_engine, tiny_model, tmp_path):
    """collect_step 1 with a save every 2 steps: step 1 is saved all the same, and pruning
    keeps its weights for the collection beside the newest."""
    cfg = rlep.parse_config(["--preset", "tiny", "--out_dir", str(tmp_path), "--val_every", "0",
                             "--phase1_steps", "2", "--collect_step", "1",
                             "--keep_checkpoints", "1"])
    assert cfg.save_every == 2 and checkpoints.save_plan(cfg, "phase1") == [1, 2]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rows = data.read_rows(cfg.train_file)
    rlep.train(cfg, "phase1", rows, tiny_engine, tokenizer, tokenizer.eos_token_id, tiny_model,
               ranks.setup_distributed(), [], rlep.RunState())
    part_dir = str(tmp_path / "phase1")
    assert checkpoints.complete_checkpoints(part_dir) == [1, 2]
    collected = checkpoints.checkpoint_path(part_dir, 1)
    assert os.path.isfile(os.path.join(collected, "model.safetensors"))
    assert not os.path.isdir(os.path.join(collected, "optimizer"))


def test_the_collection_gathers_only_the_verified_answers(tiny_engine, tiny_model, monkeypatch):
    """The gather of the collection carries progress rows (ids, verified answers, token
    counts), not the K responses of every prompt."""
    cfg = rlep.parse_config(["--preset", "tiny"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tiny_engine.push(path=tiny_model)
    rows = data.read_rows(cfg.train_file)[:6]
    d = ranks.setup_distributed()
    def sample(keep=None):
        return rlep.sample_and_grade(tiny_engine, tokenizer, rows, 8, cfg,
                                     [tokenizer.eos_token_id], d, (1, "collect"), keep=keep)
    full = sample()
    gathered = []
    real_gather = ranks.gather_to_rank0

    def spy(items, d):
        gathered.extend(items)
        return real_gather(items, d)
    monkeypatch.setattr(ranks, "gather_to_rank0", spy)
    kept = sample(keep=rlep.verified_answers)
    assert gathered == kept and [set(r) for r in kept] == [{"id", "successes", "tokens"}] * 6
    # the same seeded samples: the verified texts of each prompt, the tokens of all 8
    for record, row in zip(full, kept):
        right = [t for t, ok in zip(record["responses"], record["correct"]) if ok]
        assert row == {"id": record["id"], "successes": right, "tokens": sum(record["lengths"])}
    # some right, some wrong: the filter has something to do
    assert 0 < sum(map(len, (r["successes"] for r in kept))) < 6 * 8


def test_stopped_saves_and_prunes_are_removed(tmp_path, capsys):
    kept = fake_checkpoint(tmp_path / "phase1", 4)
    deleting = fake_checkpoint(tmp_path / "phase1", 2)
    os.rename(deleting, deleting + ".deleting")
    saving = fake_checkpoint(tmp_path / "phase2", 6, complete=False)
    os.rename(saving, saving + ".tmp")
    pool = tmp_path / "collect" / "pool.jsonl"
    pool.parent.mkdir()
    pool.write_text("")
    checkpoints.remove_leftovers(str(tmp_path))
    left = sorted(os.path.relpath(os.path.join(root, d), tmp_path)
                  for root, dirs, _ in os.walk(tmp_path) for d in dirs if d.startswith("step_"))
    assert left == [os.path.relpath(kept, tmp_path)] and pool.exists()
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 1 and "step_000002.deleting" in printed[0]
    assert "step_000006.tmp" in printed[0]
    checkpoints.remove_leftovers(str(tmp_path))
    assert capsys.readouterr().out == ""


def decide_on_rank(rank, port, folders, out):
    """Each rank looks at its own copy of the run folder (a stale listing on NFS): the
    resume step and the finished collection must be rank 0's on both."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    d = ranks.Dist(True, rank, 2, torch.device("cpu"), rank == 0)
    cfg = rlep.parse_config(["--preset", "tiny", "--out_dir", folders[rank]])
    built = []

    def build_policy(path, *args):
        built.append(path)
        raise StopIteration  # the decision is made: no need to train
    rlep.build_policy = build_policy
    rows = data.read_rows(cfg.train_file)
    with contextlib.suppress(StopIteration):
        rlep.train(cfg, "phase1", rows, None, None, 0, "base", d, [], rlep.RunState())
    # rank 1 sees no pool: deciding alone it would go on to collect, and fail
    rlep.collect(cfg, rows, None, None, 0, d, rlep.RunState())
    torch.save({"built": built}, f"{out}.{rank}")
    dist.destroy_process_group()


def test_every_rank_takes_rank_0s_view_of_the_run(tmp_path, free_port):
    folders = [str(tmp_path / "rank0"), str(tmp_path / "rank1")]
    for rank, step in ((0, 2), (1, 4)):
        folder = fake_checkpoint(tmp_path / f"rank{rank}" / "phase1", step)
        # what the resume reads of it (checkpoints.resume_point)
        torch.save({"step": step}, os.path.join(folder, "trainer_state.pt"))
    pool = tmp_path / "rank0" / "collect" / "pool.jsonl"
    pool.parent.mkdir()
    pool.write_text("")
    forked.spawn(decide_on_rank, args=(free_port, folders, str(tmp_path / "built")), nprocs=2)
    ckpt = checkpoints.checkpoint_path(os.path.join(folders[0], "phase1"), 2)
    for rank in (0, 1):
        assert torch.load(tmp_path / f"built.{rank}")["built"] == [ckpt]


def test_the_phase_one_policy_is_freed_when_its_part_ends(tiny_engine, tiny_model, tmp_path,
                                                          monkeypatch):
    """FSDP2 modules and their optimizer sit in reference cycles: without an explicit
    collection, phase one's policy would still hold its memory while phase two builds."""
    built = []
    real_build = rlep.build_policy

    def build_and_watch(*args, **kwargs):
        policy, optimizer = real_build(*args, **kwargs)
        built.append((weakref.ref(policy), weakref.ref(optimizer)))
        return policy, optimizer

    monkeypatch.setattr(rlep, "build_policy", build_and_watch)
    cfg = rlep.parse_config(["--preset", "tiny", "--out_dir", str(tmp_path), "--val_every", "0"])
    cfg.phase1_steps = 1
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rows = data.read_rows(cfg.train_file)
    d = ranks.setup_distributed()
    rlep.train(cfg, "phase1", rows, tiny_engine, tokenizer, tokenizer.eos_token_id, tiny_model,
               d, [], rlep.RunState())
    assert len(built) == 1
    policy, optimizer = built[0]
    assert policy() is None and optimizer() is None


class AnsweringEngine:
    """A stand-in for vLLM that answers every prompt k times with its row's gold answer."""

    def __init__(self, tokenizer, answers: dict):
        self.tokenizer = tokenizer
        self.answers = answers  # prompt token ids -> the gold answer's text

    def push(self, model=None, path=None):
        pass

    def sleep(self):
        pass

    def generate(self, prompts, n, *args, **kwargs):
        groups = []
        for prompt in prompts:
            ids = self.tokenizer.encode(self.answers[tuple(prompt)], add_special_tokens=False)
            groups.append([vllm_engine.Completion(ids, None)] * n)
        return groups


def collect_on_rank(rank, port, model_path, out_dir, out):
    """A resumed collection on 2 ranks; rank 1 records the bytes of every object it receives."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    d = ranks.Dist(True, rank, 2, torch.device("cpu"), rank == 0)
    received = []
    for name in ("broadcast_object_list", "all_gather_object", "gather_object"):
        def spy(*args, real=getattr(dist, name), **kwargs):
            result = real(*args, **kwargs)
            # each collective's filled list is its first argument
            received.append(pickle.dumps(args[0]))
            return result
        setattr(dist, name, spy)
    cfg = rlep.parse_config(["--preset", "tiny", "--out_dir", out_dir])
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    rows = data.read_rows(cfg.train_file)[:8]
    answers = {tuple(rlep.render_prompt(tokenizer, row, cfg.prompt_template,
                                        cfg.max_prompt_len)): row["answer"] for row in rows}
    rlep.collect(cfg, rows, AnsweringEngine(tokenizer, answers), tokenizer,
                 tokenizer.eos_token_id, d, rlep.RunState())
    if rank == 1:
        torch.save({"received": received}, out)
    dist.destroy_process_group()


def test_the_other_ranks_never_receive_rank_0s_collected_answers(tiny_model, tmp_path,
                                                                  free_port):
    """A resumed collection: rank 0 reads the answers collected so far and keeps them; rank 1
    is told only which prompts are done, and the pool rank 0 writes holds both kinds."""
    out_dir = tmp_path / "run"
    fake_checkpoint(out_dir / "phase1", rlep.parse_config(["--preset", "tiny"]).collect_step)
    rows = data.read_rows("builtin:tiny:train")[:8]
    secret = [f"rank 0's answer {i} of {row['id']}" for i, row in enumerate(rows[:3])]
    progress = [{"id": row["id"], "successes": [text, text], "tokens": 4}
                for row, text in zip(rows[:3], secret)]
    (out_dir / "collect").mkdir()
    files.append_jsonl(str(out_dir / "collect" / "progress.jsonl"), progress)
    forked.spawn(collect_on_rank, nprocs=2,
                 args=(free_port, tiny_model, str(out_dir), str(tmp_path / "received")))
    received = torch.load(tmp_path / "received")["received"]
    assert received  # the spies saw the collectives
    assert not any(text.encode() in blob for blob in received for text in secret)
    pool = {row["id"]: row["responses"] for row in files.read_jsonl(
        str(out_dir / "collect" / "pool.jsonl"))}
    # the 3 resumed prompts with their answers, the 5 sampled now with k gold answers each
    assert [pool[row["id"]] for row in rows[:3]] == [[text, text] for text in secret]
    k = rlep.parse_config(["--preset", "tiny"]).collect_k
    assert [pool[row["id"]] for row in rows[3:]] == [[row["answer"]] * k for row in rows[3:]]


def decide_or_refuse(rank, port, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    d = ranks.Dist(True, rank, 2, torch.device("cpu"), rank == 0)
    calls = []

    def decide():
        calls.append(rank)
        return {"step": 4}

    def refuse():
        raise ValueError("--n 0: must be at least 1")
    answer = ranks.rank0_decides(decide, d)
    with pytest.raises(ValueError) as refused:
        ranks.rank0_decides(refuse, d)
    torch.save({"answer": answer, "calls": calls, "error": str(refused.value)}, f"{out}.{rank}")
    dist.destroy_process_group()


def test_rank_0s_answer_or_refusal_reaches_every_rank(tmp_path, free_port):
    """decide() runs on rank 0 alone; every rank returns its answer, or raises its error (a
    refusal on rank 0 alone would leave the other ranks waiting in the next collective)."""
    forked.spawn(decide_or_refuse, args=(free_port, str(tmp_path / "decided")), nprocs=2)
    seen = [torch.load(tmp_path / f"decided.{rank}") for rank in (0, 1)]
    assert [s["answer"] for s in seen] == [{"step": 4}] * 2
    assert [s["calls"] for s in seen] == [[0], []]
    assert [s["error"] for s in seen] == ["--n 0: must be at least 1"] * 2
