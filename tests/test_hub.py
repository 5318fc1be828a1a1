"""Data and models by hub name, offline: each test fills huggingface_hub's cache itself (the
layout hf_hub_download and snapshot_download read with HF_HUB_OFFLINE=1: refs/main naming a
commit, the files under snapshots/<commit>/). A hub data file (hf://datasets/ORG/NAME/PATH) reads
like its local copy, a file in pieces (NAME.part-*) is joined once, a hub model resolves to its
cached folder; a name that cannot be fetched is one line, and rlep.py exits 2 with nothing written.
Run: python -m pytest -q tests/test_hub.py"""
import json
import os
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from huggingface_hub import constants

from machinery import RunStopped, UserError, data, hub
import rlep

repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
commit = "0123456789abcdef0123456789abcdef01234567"


def fill_cache(cache, repo: str, files: dict, kind: str = "datasets", at: str = commit,
               ref: str = "main"):
    """A repository's files at commit `at`, which `ref` names, as huggingface_hub leaves them
    after a download."""
    folder = cache / f"{kind}--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / ref).write_text(at)
    for path, content in files.items():
        target = folder / "snapshots" / at / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):  # a folder to copy
            shutil.copy(content, target)
        else:
            target.write_bytes(content)


def dapo_parquet(path, problems):
    rows = [{"data_source": "math_dapo", "prompt": [{"role": "user", "content": p}],
             "reward_model": {"ground_truth": str(i), "candidates": [f"Answer: {i}"] * 2},
             "extra_info": {"index": i}} for i, p in enumerate(problems)]
    pq.write_table(pa.Table.from_pylist(rows), path)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    assert constants.HF_HUB_OFFLINE  # conftest: nothing reaches the network
    return cache


def test_a_hub_data_file_reads_like_its_local_copy(hub_cache, tmp_path):
    local = tmp_path / "train.parquet"
    dapo_parquet(local, [f"{a}+{a}" for a in range(5)] * 3)  # each problem three times
    fill_cache(hub_cache, "org/math", {"data/train.parquet": local.read_bytes()})
    rows = data.read_rows("hf://datasets/org/math/data/train.parquet")
    assert rows == data.read_rows(str(local)) and len(rows) == 5
    # a revision by name: refs/<revision>
    assert data.read_rows("hf://datasets/org/math@main/data/train.parquet") == rows


def test_a_file_in_pieces_is_joined_once_into_the_cache_folder(hub_cache, tmp_path):
    local = tmp_path / "pool.parquet"
    dapo_parquet(local, [f"{a}*3" for a in range(40)])
    whole = local.read_bytes()
    third = len(whole) // 3
    pieces = {"pool.parquet.part-aa": whole[:third], "pool.parquet.part-ab": whole[third:2 * third],
              "pool.parquet.part-ac": whole[2 * third:]}
    fill_cache(hub_cache, "org/pool", pieces)
    cache_dir = tmp_path / "rlep-cache"
    name = "hf://datasets/org/pool/pool.parquet.part-*"
    pool = data.load_pool(name, str(cache_dir))
    assert pool == data.load_pool(str(local)) and len(pool) == 40
    joined = cache_dir / "hub" / "org--pool" / commit / "pool.parquet"
    assert joined.read_bytes() == whole
    stamp = joined.stat().st_mtime_ns
    data.load_pool(name, str(cache_dir))
    assert joined.stat().st_mtime_ns == stamp  # read again, not joined again
    # a join the disk or the folder refuses (here a folder where the file goes): one line naming
    # the file, no half file left
    blocked = tmp_path / "other-cache" / "hub" / "org--pool" / commit / "pool.parquet"
    blocked.mkdir(parents=True)
    with pytest.raises(RunStopped, match=f"^{blocked}: cannot write \\("):
        data.load_pool(name, str(tmp_path / "other-cache"))
    assert os.listdir(blocked.parent) == ["pool.parquet"]


@pytest.mark.parametrize("name, message", [
    ("hf://datasets/org/math/data/missing.parquet", "cannot fetch it ("),
    ("hf://datasets/org/nothere/train.parquet", "cannot fetch it ("),
    ("hf://org/math/data/train.parquet", "a hub data file is hf://datasets/ORG/NAME"),
])
def test_a_name_that_cannot_be_fetched_is_one_line(hub_cache, tmp_path, name, message):
    local = tmp_path / "train.parquet"
    dapo_parquet(local, ["1+1"])
    fill_cache(hub_cache, "org/math", {"data/train.parquet": local.read_bytes()})
    with pytest.raises(UserError) as error:
        data.read_rows(name)
    line = str(error.value)
    assert line.startswith(f"{name}: ") and message in line and "\n" not in line


def test_a_hub_model_resolves_to_its_cached_folder(hub_cache, tiny_model, tmp_path):
    files = {name: os.path.join(tiny_model, name) for name in os.listdir(tiny_model)}
    fill_cache(hub_cache, "org/tiny-math", files, kind="models")
    folder = hub.model_folder("org/tiny-math", str(tmp_path))
    assert folder == str(hub_cache / "models--org--tiny-math" / "snapshots" / commit)
    assert sorted(os.listdir(folder)) == sorted(os.listdir(tiny_model))
    with pytest.raises(ValueError, match=r"^org/absent: cannot fetch it from the hub \("):
        hub.model_folder("org/absent", str(tmp_path))


class ChecksPassed(Exception):
    """A run got past the preflight: its engine is where the test stops it."""


def stop_at_the_engine(monkeypatch):
    def stop(*args):
        raise ChecksPassed
    monkeypatch.setattr(rlep, "build_engine", stop)


def test_a_run_takes_hub_names_and_saves_them_as_given(hub_cache, tiny_model, tmp_path,
                                                      monkeypatch):
    """The tiny preset with its model and both files by hub name: past the checks (the engine
    is where this test stops), config.json keeps the names, not the cache's paths."""
    model_files = {name: os.path.join(tiny_model, name) for name in os.listdir(tiny_model)}
    fill_cache(hub_cache, "org/tiny-math", model_files, kind="models")
    lines = {split: "".join(json.dumps(r) + "\n" for r in data.read_rows(f"builtin:tiny:{split}"))
             for split in ("train", "val")}
    fill_cache(hub_cache, "org/sums", {f"{split}.jsonl": text.encode()
                                       for split, text in lines.items()})

    stop_at_the_engine(monkeypatch)
    out = tmp_path / "run"
    names = ["--model_path", "org/tiny-math", "--train_file", "hf://datasets/org/sums/train.jsonl",
             "--val_file", "hf://datasets/org/sums/val.jsonl"]
    with pytest.raises(ChecksPassed):
        rlep.main(["--preset", "tiny", "--out_dir", str(out), *names])
    saved = json.load(open(out / "config.json"))
    assert [saved[k] for k in ("model_path", "train_file", "val_file")] == names[1::2]


def test_a_revision_is_read_at_it_and_a_resume_on_a_moved_name_is_refused(
        hub_cache, tiny_model, tmp_path, monkeypatch):
    """A cache holding two commits of a dataset: @REVISION reads its commit's file, not main's;
    a run started on main, resumed once main names the other commit, is refused (its line names
    both commits), and with --override continues, config.json recording the new commit."""
    rows = data.read_rows("builtin:tiny:train")
    older = "".join(json.dumps(r) + "\n" for r in rows)
    newer = "".join(json.dumps({**r, "answer": "1"}) + "\n" for r in rows)
    other = "fedcba9876543210fedcba9876543210fedcba98"
    fill_cache(hub_cache, "org/sums", {"train.jsonl": older.encode()})
    fill_cache(hub_cache, "org/sums", {"train.jsonl": newer.encode()}, at=other, ref="v2")
    name = "hf://datasets/org/sums/train.jsonl"
    assert data.read_rows(name) == rows
    assert data.read_rows("hf://datasets/org/sums@v2/train.jsonl")[0]["answer"] == "1"
    assert data.read_rows(f"hf://datasets/org/sums@{commit}/train.jsonl") == rows

    stop_at_the_engine(monkeypatch)
    out = tmp_path / "run"
    command = ["--preset", "tiny", "--out_dir", str(out), "--cache_dir",
               os.path.dirname(tiny_model), "--train_file", name]
    with pytest.raises(ChecksPassed):
        rlep.main(command)
    assert json.load(open(out / "config.json"))["hub_commits"][name] == commit
    (hub_cache / "datasets--org--sums" / "refs" / "main").write_text(other)  # main moved
    with pytest.raises(UserError, match=f"read {name} at {commit[:12]} \\(now {other[:12]}\\)"):
        rlep.main(command + ["--resume"])
    with pytest.raises(ChecksPassed):
        rlep.main(command + ["--resume", "--override"])
    saved = json.load(open(out / "config.json"))
    assert saved["hub_commits"][name] == other
    assert [c["field"] for c in saved["overrides"]] == [name, "train_file rows"]


def test_rlep_py_refuses_an_unfetchable_name_with_exit_2_and_writes_nothing(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "empty-cache")}
    out = tmp_path / "run"
    name = "hf://datasets/org/absent/train.parquet"
    result = subprocess.run([sys.executable, os.path.join(repo_root, "rlep.py"), "--preset",
                             "tiny", "--out_dir", str(out), "--cache_dir", str(tmp_path / "c"),
                             "--train_file", name], capture_output=True, text=True, env=env,
                            timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith(f"rlep.py: {name}: cannot fetch it (")
    assert not out.exists()


def test_eval_py_takes_a_hub_model_and_records_its_name(hub_cache, tiny_model, tmp_path,
                                                         monkeypatch):
    """eval.py --model ORG/NAME (the authors' released checkpoint, say): the cached folder is what
    the engine reads; settings.json keeps the name, not the cache's path."""
    import eval
    files = {name: os.path.join(tiny_model, name) for name in os.listdir(tiny_model)}
    fill_cache(hub_cache, "org/tiny-math", files, kind="models")
    (tmp_path / "sums.jsonl").write_text(json.dumps({"problem": "1+2", "answer": "3"}) + "\n")
    read = []

    class EngineReached(Exception):
        pass

    def stop(cfg, model_dir, d):
        read.append(model_dir)
        raise EngineReached
    monkeypatch.setattr(rlep, "build_engine", stop)
    out = tmp_path / "eval"
    with pytest.raises(EngineReached):
        eval.main(["--model", "org/tiny-math", "--data", str(tmp_path / "sums.jsonl"), "--k", "2",
                   "--out_dir", str(out)])
    assert read == [str(hub_cache / "models--org--tiny-math" / "snapshots" / commit)]
    assert json.load(open(out / "settings.json"))["model"] == "org/tiny-math"
    with pytest.raises(UserError, match=r"^org/absent: cannot fetch it from the hub \("):
        eval.main(["--model", "org/absent", "--data", str(tmp_path / "sums.jsonl"),
                   "--out_dir", str(tmp_path / "absent")])
    assert not (tmp_path / "absent").exists()
