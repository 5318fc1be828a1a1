"""A long run's resources: old checkpoints pruned (the newest few, the collection's kept),
the disk checked before a run starts, the phase-one policy freed before phase two builds
its own. Run: python -m pytest -q tests/test_checkpoints.py"""
import os
import weakref

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

import data
import rlep


def fake_checkpoint(part_dir, step, complete=True):
    folder = rlep.checkpoint_path(str(part_dir), step)
    os.makedirs(os.path.join(folder, "optimizer"))
    open(os.path.join(folder, "model.safetensors"), "w").close()
    if complete:
        open(os.path.join(folder, "trainer_state.pt"), "w").close()
    return folder


def test_pruning_keeps_the_newest_whole_and_the_protected_weights(tmp_path):
    for step in (20, 40, 60, 80):
        fake_checkpoint(tmp_path, step)
    in_flight = fake_checkpoint(tmp_path, 100, complete=False)
    os.rename(in_flight, in_flight + ".tmp")
    data.prune_checkpoints(str(tmp_path), keep=2, protected={20})
    assert data.complete_checkpoints(str(tmp_path)) == [20, 60, 80]
    with_optimizer = [s for s in (20, 60, 80)
                      if os.path.isdir(os.path.join(rlep.checkpoint_path(str(tmp_path), s),
                                                    "optimizer"))]
    # the newest two can be resumed from; the collection's keeps only its weights
    assert with_optimizer == [60, 80]
    # a save in flight is not a checkpoint, and is not touched
    assert os.path.isdir(in_flight + ".tmp")
    assert rlep.latest_checkpoint(str(tmp_path)) == (80, rlep.checkpoint_path(str(tmp_path), 80))


def test_a_run_whose_checkpoints_would_not_fit_refuses_to_start(tmp_path, tiny_model, monkeypatch,
                                                               capsys):
    budget = data.disk_budget(tiny_model, keep=2)
    params = AutoModelForCausalLM.from_pretrained(tiny_model).num_parameters()
    # fp32 weights and AdamW's two fp32 moments
    assert budget["per_checkpoint"] == 12 * params
    # a part: 3 checkpoints while a save is in flight; phase one's collection weights on top
    assert budget["total"] == 2 * 3 * 12 * params + 4 * params
    data.check_disk(str(tmp_path), tiny_model, keep=2)
    assert "GiB of checkpoints" in capsys.readouterr().out
    too_small = type("Usage", (), {"free": budget["total"] - 1})()
    monkeypatch.setattr(data.shutil, "disk_usage", lambda path: too_small)
    with pytest.raises(RuntimeError, match="need up to") as error:
        data.check_disk(str(tmp_path), tiny_model, keep=2)
    assert str(tmp_path) in str(error.value)


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
    rows = rlep.read_rows(cfg.train_file)
    d = rlep.setup_distributed()
    rlep.train(cfg, "phase1", rows, tiny_engine, tokenizer, tokenizer.eos_token_id, tiny_model,
               d, [])
    assert len(built) == 1
    policy, optimizer = built[0]
    assert policy() is None and optimizer() is None
