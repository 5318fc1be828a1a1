"""Optional W&B logging (--wandb_project): off by default without importing wandb; on, rank 0
writes one run whose history holds metrics.jsonl's numbers, each part under its own name
(phase1/..., phase2/...), continued by --resume. Offline (WANDB_MODE=offline): the run's
.wandb file is read back record by record.
Run: python -m pytest -q tests/test_wandb.py"""
import glob
import json
import os
import subprocess
import sys

import pytest
from transformers import AutoTokenizer

from machinery import UserError, files, fsdp
import rlep
from test_paper import StubEngine

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wandb_records(path):
    """The protobuf records of a .wandb file: a 7-byte header (':W&B', magic, version), then
    32 KiB blocks of chunks, each a 7-byte header (CRC, length, kind) and its bytes; kind 1
    is a whole record, 2, 3, 4 its first, middle and last pieces (LevelDB's log format)."""
    from wandb.proto import wandb_internal_pb2
    raw = open(path, "rb").read()
    assert raw[:4] == b":W&B"
    block, pos, pieces, records = 32768, 7, b"", []
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # a block's tail too short for a header: zeros
            pos += block - pos % block
            continue
        length = int.from_bytes(raw[pos + 4:pos + 6], "little")
        kind = raw[pos + 6]
        pieces += raw[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            records.append(record)
            pieces = b""
    return records


def history(out_dir):
    """Every history row of every offline run in out_dir, as {key: value}, in order."""
    rows = []
    for path in sorted(glob.glob(os.path.join(out_dir, "wandb", "offline-run-*", "*.wandb"))):
        for record in wandb_records(path):
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return rows


def test_without_a_project_wandb_is_never_imported():
    code = ("import sys, rlep, eval, machinery.metrics; rlep.parse_config([]); "
            "print('wandb' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False"


def test_a_missing_wandb_is_one_line_before_anything_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rlep.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit) as stopped:
        rlep.main(["--preset", "tiny", "--out_dir", str(tmp_path / "run"),
                   "--wandb_project", "rlep-test"])
    assert stopped.value.code == 2
    assert "--wandb_project: wandb is not installed (pip install wandb)" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_wandb_that_cannot_start_is_refused_before_anything_is_written(tmp_path, tiny_model,
                                                                      monkeypatch):
    """Online without a key (none in the environment, none in this HOME): the preflight's
    login fails, in one line, before config.json."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "home" / "wandb"))
    out = tmp_path / "run"
    try:
        with pytest.raises(UserError, match=r"^--wandb_project rlep-test: W&B cannot start \(No "
                                            "API key"):
            rlep.main(["--preset", "tiny", "--out_dir", str(out), "--cache_dir",
                       os.path.dirname(tiny_model), "--wandb_project", "rlep-test"])
    finally:
        import wandb
        wandb.teardown()  # its settings (online) stay in the process otherwise
    assert not out.exists()


def test_the_offline_run_holds_the_numbers_of_metrics_jsonl(tmp_path, tiny_model, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    engine = StubEngine(AutoTokenizer.from_pretrained(tiny_model))
    monkeypatch.setattr(rlep, "build_engine", lambda *args, **kwargs: engine)
    monkeypatch.setattr(fsdp, "linear_gflops", lambda *args, **kwargs: 100.0)
    out = tmp_path / "run"
    flags = ["--preset", "tiny", "--out_dir", str(out), "--cache_dir",
             os.path.dirname(tiny_model), "--wandb_project", "rlep-test"]
    rlep.main(flags + ["--phase1_steps", "2", "--phase2_steps", "2", "--collect_step", "2"])
    run_id = (out / "wandb_id").read_text()
    # a resumed command (two steps more, so --override) continues the same W&B run
    rlep.main(flags + ["--phase1_steps", "2", "--phase2_steps", "4", "--collect_step", "2",
                       "--resume", "--override"])
    assert (out / "wandb_id").read_text() == run_id
    # W&B's service writes a run's file as it goes and its last records when it closes the
    # file, after finish() returns: its teardown waits for that (else a busy machine reads a
    # file cut short)
    import wandb
    wandb.teardown()
    runs = glob.glob(str(out / "wandb" / "offline-run-*"))
    assert len(runs) == 2 and all(path.endswith(run_id) for path in runs)
    logged = history(str(out))
    for part in ("phase1", "phase2"):
        expected = files.read_jsonl(str(out / part / "metrics.jsonl"))
        got = {}  # the last logged row of each step (a resumed step is logged again)
        for row in logged:
            if f"{part}/step" in row:
                got[row[f"{part}/step"]] = row
        assert sorted(got) == [r["step"] for r in expected]
        for want in expected:
            numbers = {f"{part}/{k}": v for k, v in want.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)}
            assert {k: got[want["step"]][k] for k in numbers} == pytest.approx(numbers)
    # the comparison table, once, at the end of the command that printed it
    tables = [row for row in logged if row.get("comparison/_type") == "table-file"]
    assert [(t["comparison/nrows"], t["comparison/ncols"]) for t in tables] == [(1, 7)] * 2
