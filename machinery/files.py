"""Files a crash never leaves half-written (a temporary name, then a rename), JSONL read past a
last line cut short by a kill, the run's config.json, and hub dataset files fetched once into
huggingface_hub's cache (hf://datasets/ORG/NAME[@REVISION]/PATH)."""
import contextlib
import glob
import json
import os
import re
import shutil

from machinery.errors import UserError


def write_atomic(path: str, text: str):
    """Write a file so that a crash leaves either the old file or the new one, never half of one."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_jsonl(path: str) -> list:
    """The rows of a JSONL file (none if it is missing), without a last line cut short by a kill."""
    if not os.path.isfile(path):
        return []
    rows = []
    for line in open(path):
        with contextlib.suppress(json.JSONDecodeError):
            rows.append(json.loads(line))
    return rows


def save_config(out_dir: str, config: dict, saved: dict, changes: list[dict]):
    """config.json: the run's Config; with "overrides", every --override's changes (the saved
    ones, then this command's `changes`) and the steps they took effect at."""
    os.makedirs(out_dir, exist_ok=True)
    overrides = saved.get("overrides", []) + changes
    record = {**config, **({"overrides": overrides} if overrides else {})}
    write_atomic(os.path.join(out_dir, "config.json"), json.dumps(record, indent=2))


def append_jsonl(path: str, rows: list):
    with open(path, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
        f.flush()
        os.fsync(f.fileno())


# A hub dataset file, in huggingface_hub's convention: hf://datasets/ORG/NAME[@REVISION]/PATH
hub_file = re.compile(r"hf://datasets/([\w.-]+/[\w.-]+)(?:@([^/]+))?/(.+)")


def local_file(path: str, cache_dir: str) -> str:
    """A data file on this machine: `path` itself, or a hub dataset file (hub_file) fetched once
    into huggingface_hub's cache, where a later run (HF_HUB_OFFLINE=1 too) finds it. A PATH
    ending in `.part-*` names the pieces of one file (the authors' pool ships so): each fetched,
    then joined in name order into cache_dir, once."""
    if not path.startswith("hf://"):
        return path
    match = hub_file.fullmatch(path)
    if not match:
        raise UserError(f"{path}: a hub data file is hf://datasets/ORG/NAME[@REVISION]/PATH")
    repo, revision, name = match.groups()
    from huggingface_hub import hf_hub_download, snapshot_download
    try:
        if not name.endswith(".part-*"):
            return hf_hub_download(repo, name, repo_type="dataset", revision=revision)
        folder = snapshot_download(repo, repo_type="dataset", revision=revision,
                                   allow_patterns=[name])
    except Exception as e:  # offline and not cached, no such repo or file, no network
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{path}: cannot fetch it ({reason})") from None
    pieces = sorted(glob.glob(os.path.join(folder, glob.escape(name[:-1]) + "*")))
    if not pieces:
        raise UserError(f"{path}: no such pieces in {repo}")
    # the snapshot's folder name is its commit: another revision joins anew
    joined = os.path.join(cache_dir, "hub", repo.replace("/", "--"),
                          os.path.basename(folder), name[:-len(".part-*")])
    if not os.path.isfile(joined):
        os.makedirs(os.path.dirname(joined), exist_ok=True)
        with open(f"{joined}.tmp{os.getpid()}", "wb") as out:
            for piece in pieces:
                with open(piece, "rb") as f:
                    shutil.copyfileobj(f, out)
        os.replace(f"{joined}.tmp{os.getpid()}", joined)
        print(f"{path}: {len(pieces)} pieces joined into {joined}", flush=True)
    return joined
