"""The run folder's files: written so that a crash never leaves one half-written (a temporary
name, then a rename), JSONL read past a last line cut short by a kill, a resumed part's logs cut
back to its checkpoint, the run's config.json, and the lock by which one process writes a run
folder."""
import contextlib
import json
import os
import socket

from filelock import FileLock, Timeout

from machinery import RunStopped, UserError


def write_atomic(path: str, text):
    """Write a file so that a crash leaves either the old file or the new one, never half of one;
    a full disk or a folder gone under the run stops it in one line (the old file kept). text:
    the file's text, or a function that writes the file at the path it is given (a figure)."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        if callable(text):
            text(tmp)
        else:
            with open(tmp, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise cannot_write(path, e) from None


def cannot_write(path: str, error: OSError) -> RunStopped:
    """A run's write the disk or the folder refused: one line naming the path."""
    return RunStopped(f"{path}: cannot write ({error.strerror}): free the disk or restore the "
                      "folder, then --resume (what is saved is kept)")


def read_jsonl(path: str) -> list:
    """The rows of a JSONL file (none if it is missing), without a last line cut short by a kill."""
    if not os.path.isfile(path):
        return []
    rows = []
    for line in open(path):
        with contextlib.suppress(json.JSONDecodeError):
            rows.append(json.loads(line))
    return rows


def save_config(out_dir: str, config: dict, saved: dict, changes: list[dict], commits: dict,
                digests: dict):
    """config.json: the run's Config; "hub_commits", the commit each hub name resolved to;
    "data_digests", each data file's rows' SHA-256 (the saved ones, then this command's
    `digests`: a part's command reads only its files); with "overrides", every --override's
    changes (the saved ones, then this command's `changes`) and the steps they took effect at."""
    os.makedirs(out_dir, exist_ok=True)
    records = {"hub_commits": commits,
               "data_digests": {**saved.get("data_digests", {}), **digests},
               "overrides": saved.get("overrides", []) + changes}
    # each record where there is one
    record = {**config, **{name: value for name, value in records.items() if value}}
    write_atomic(os.path.join(out_dir, "config.json"), json.dumps(record, indent=2))


def append_jsonl(path: str, rows: list):
    """Rows appended: a full disk or a folder gone under the run stops it in one line (a line cut
    short is dropped on reading, read_jsonl)."""
    try:
        with open(path, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise cannot_write(path, e) from None


def forget_after(part_dir: str, step: int):
    """A resumed part's metrics.jsonl and samples.jsonl without the steps logged after `step`, the
    checkpoint it resumes from; at step 0 (no checkpoint) without any row, the base model's step
    0 too, which the part logs again (each file written, empty where it keeps none)."""
    for name in ("metrics.jsonl", "samples.jsonl"):
        path = os.path.join(part_dir, name)
        kept = [json.dumps(r) + "\n" for r in read_jsonl(path) if step and r["step"] <= step]
        write_atomic(path, "".join(kept))


# the run folder this process holds, {lock file: its FileLock} (hold_run_folder)
held_folder = {}


def hold_run_folder(out_dir: str):
    """One process writes a run folder: rank 0 takes filelock's exclusive lock (an flock, which
    the kernel lets go however the process ends, a SIGKILL too) on its rlep.lock before the first
    write and holds it for the process's life; the file names the holder. A second process on the
    folder is refused: a --resume while torchrun's ranks, orphaned by a SIGKILL of their launcher
    (each rank is in a session of its own), still write the run."""
    path = os.path.realpath(os.path.join(out_dir, "rlep.lock"))
    if path in held_folder:
        return  # an earlier main in this process holds it
    os.makedirs(out_dir, exist_ok=True)
    lock = FileLock(path, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        holder = open(path).read().strip() or "another process"
        raise UserError(f"--out_dir {out_dir}: in use by {holder} (it holds {path}): one "
                        "process writes a run; wait for it to end, or stop it") from None
    with open(path, "w") as f:
        f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    # an earlier main's folder, in this process, is let go (it holds one at most)
    if held_folder:
        held_folder.popitem()[1].release()
    held_folder[path] = lock
