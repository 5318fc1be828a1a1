"""The archive (--archive DIR): each finished run, reduced to what the report reads, kept in
the repository as one JSON document so that a study continues across sittings (the rules:
studies/study_replay.py's docstring); restoring it into a run folder, and the checks that an
archived run is never run, replaced or resumed."""
import glob
import json
import os
import shutil

from machinery.files import read_jsonl

from .runner import (archive_mark, archived, drop_run_checkpoints, finished, first_start,
                     started_mark)

default_archive = "docs/runs/study-dynamic"  # --study dynamic --preset cpu-hard's, in the repo


def archived_pool(folder: str) -> str:
    """The form of an archived copy's collect/pool.jsonl, by its mark: 'full' (the answer
    texts, for an arm still to run on it), 'reduced', or '' without a pool."""
    return json.load(open(os.path.join(folder, archive_mark))).get("pool", "")


def document_path(archive: str, name: str) -> str:
    """The path of run `name`'s document in the archive."""
    return os.path.join(archive, f"{name}.json")


def pool_users(folder: str, runs: list) -> list:
    """The folders of the runs that read folder's pool (--pool FOLDER/collect/pool.jsonl)."""
    pool = os.path.join(folder, "collect", "pool.jsonl")
    return [f for f, flags in runs if any(a == "--pool" and b == pool
                                          for a, b in zip(flags, flags[1:]))]


def jsonl_bytes(rows: list) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def reduced_pool(rows: list) -> list:
    """A pool's rows as each prompt's id and count of verified answers: no answer texts."""
    return [{"id": r["id"], "answers": len(r["responses"])} for r in rows]


def document(files: dict, pool: str, log: str) -> dict:
    """An archived run: the mark (what it is; its pool's form, none without a pool), the first
    start line of its log, and its files by path in the run folder: a JSON file as its object,
    a JSONL file as its rows."""
    return {"archived_by": "study_replay.py --archive", **({"pool": pool} if pool else {}),
            "note": "the report's files only: the progress without its answers, the pool with "
                    "them while an arm on it is not archived ('full'), else without "
                    "('reduced'); an archived run counts as finished and is never run or "
                    "resumed", "log": log, "files": files}


def run_document(folder: str, full_pool: bool) -> dict:
    """A finished run's document: config.json, timings.json and every part's metrics.jsonl as
    they are; the collection's progress.jsonl as its rows' id and tokens, its pool.jsonl as it
    is if full_pool (an arm on it still to archive), else reduced (reduced_pool); the first
    start line of FOLDER.log. A part that is a link (A6's phase one, the main run's) is left
    out."""
    files = {name: json.load(open(os.path.join(folder, name)))
             for name in ("config.json", "timings.json")}
    for path in sorted(glob.glob(os.path.join(folder, "*", "metrics.jsonl"))):
        if not os.path.islink(os.path.dirname(path)):
            files[os.path.relpath(path, folder)] = read_jsonl(path)
    progress, pool = (os.path.join(folder, "collect", f) for f in ("progress.jsonl", "pool.jsonl"))
    if os.path.isfile(progress):
        files["collect/progress.jsonl"] = [{"id": r["id"], "tokens": r.get("tokens", 0)}
                                           for r in read_jsonl(progress)]
    if os.path.isfile(pool):
        rows = read_jsonl(pool)
        files["collect/pool.jsonl"] = rows if full_pool else reduced_pool(rows)
    form = ("full" if full_pool else "reduced") if os.path.isfile(pool) else ""
    logged = first_start(folder)
    return document(files, form, f"{started_mark}{logged}\n" if logged else "")


def document_bytes(doc: dict) -> bytes:
    """A document as JSON laid out for reading and for git's diffs: a field or a file a line,
    and a JSONL file's rows a line each."""
    def laid_out(value):
        if not isinstance(value, list):
            return json.dumps(value)
        return "[" + ",".join(f"\n   {json.dumps(row)}" for row in value) + "]"
    fields = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in doc.items() if k != "files"]
    files = [f"  {json.dumps(path)}: {laid_out(v)}" for path, v in doc["files"].items()]
    return ("{" + ",\n ".join(fields + ['"files": {\n' + ",\n".join(files) + "}"])
            + "}\n").encode()


def restored_files(doc: dict, name: str) -> dict:
    """{path: bytes} of an archived run as run folder `name`: its files as rlep.py writes
    their rows (a JSONL row a line), its mark (archive_mark: the document less its files and
    log) and NAME.log, its start line."""
    files = {f"{name}/{path}": jsonl_bytes(value) if path.endswith(".jsonl")
             else json.dumps(value).encode() for path, value in doc["files"].items()}
    mark = {k: v for k, v in doc.items() if k not in ("log", "files")}
    files[f"{name}/{archive_mark}"] = json.dumps(mark, indent=1).encode() + b"\n"
    if doc["log"]:
        files[f"{name}.log"] = doc["log"].encode()
    return files


def seed_names(archive: str, seed: int) -> list:
    """The names of seed S's archived runs: seedS and seedS-* (not seedS0)."""
    names = sorted(os.path.basename(p)[:-len(".json")]
                   for p in glob.glob(os.path.join(archive, f"seed{seed}-*.json")))
    main = f"seed{seed}"
    return ([main] if os.path.isfile(document_path(archive, main)) else []) + names


def temporary(name: str) -> str:
    """The name a file or folder is written under before it is renamed to `name`."""
    return f".{name}.tmp"


def archived_alike(folder: str, path: str) -> bool:
    """Whether the document at path holds this finished run as archive_runs makes it (the
    archive was made from it), its pool full or reduced."""
    content = open(path, "rb").read()
    return any(content == document_bytes(run_document(folder, full)) for full in (True, False))


def move_in(source: str, name: str, target: str):
    """Rename run folder `name` and its log from source into target, the folder last: a run is
    there once its folder is, and a log there without its folder is a stopped move's, replaced
    (the callers make sure the folder is not there). If the folder's rename fails, the log goes
    back (the run is not there), and the error is raised."""
    moved = []
    try:
        for item in (name + ".log", name):
            if os.path.exists(os.path.join(source, item)):
                os.rename(os.path.join(source, item), os.path.join(target, item))
                moved.append(item)
    except BaseException:
        for item in reversed(moved):
            os.rename(os.path.join(target, item), os.path.join(source, item))
        raise


def write_in(target: str, name: str, fill):
    """Make run folder `name` (and its log) in target: fill(temporary) writes them into a
    temporary folder in target, which is then renamed in (move_in), so no half run is ever
    there."""
    folder = os.path.join(target, temporary(name))
    shutil.rmtree(folder, ignore_errors=True)  # a stopped write's
    os.makedirs(folder)
    try:
        fill(folder)
        move_in(folder, name, target)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_files(folder: str, files: dict):
    for path, content in files.items():
        os.makedirs(os.path.dirname(os.path.join(folder, path)), exist_ok=True)
        open(os.path.join(folder, path), "wb").write(content)


def replace_file(path: str, content: bytes):
    """Write a file anew: to a temporary name beside it, then renamed over it (os.replace), so a
    stop leaves the old file or the new one (and at worst the temporary, which seed_names
    skips and the next write replaces)."""
    new = os.path.join(os.path.dirname(path), temporary(os.path.basename(path)))
    open(new, "wb").write(content)
    os.replace(new, path)


def archive_runs(out: str, archive: str, seed: int, runs: list) -> int:
    """Each finished run of the seed that the archive lacks, as its document (run_document),
    into archive as NAME.json (replace_file), in the runs' order; then the pools no run still
    needs, reduced (reduce_pool). A pool is archived full while a run on it is not archived: a
    later sitting runs that arm from it. A restored run (an archived copy) is not written
    again; a run in the archive already must be archived alike, else it stops (nothing is
    replaced). Returns the bytes written."""
    written = 0
    for folder, _ in runs:
        name = os.path.basename(folder)
        path = document_path(archive, name)
        if not finished(folder) or archived(folder):
            continue
        if os.path.isfile(path):
            if not archived_alike(folder, path):
                raise SystemExit(f"{path}: archived otherwise than {folder}; an archived run is "
                                 "never replaced: move it away to archive this one")
            continue
        waiting = [os.path.basename(f) for f in pool_users(folder, runs)
                   if not os.path.isfile(document_path(archive, os.path.basename(f)))]
        content = document_bytes(run_document(folder, full_pool=bool(waiting)))
        os.makedirs(archive, exist_ok=True)
        replace_file(path, content)
        written += len(content)
        full = f", its pool in full for {', '.join(waiting)}" if waiting else ""
        print(f"{name} archived in {archive}: {len(content) / 1000:.1f} kB{full} (commit it: "
              f"git add {archive})", flush=True)
    for folder, _ in runs:
        reduce_pool(archive, folder, runs)
    return written


def reduce_pool(archive: str, folder: str, runs: list) -> bool:
    """The one replacement the archive allows: once every run on a run's pool is archived, the
    pool of its document, full until then, becomes reduced_pool's form, derived from the full
    pool there, and its mark says so; the document is replaced whole (replace_file), so a
    stop leaves it full, for the next call. Whether it reduced the pool."""
    name = os.path.basename(folder)
    path = document_path(archive, name)
    users = [os.path.basename(f) for f in pool_users(folder, runs)]
    if not all(os.path.isfile(document_path(archive, run)) for run in [name, *users]):
        return False
    doc = json.load(open(path))
    if doc.get("pool") != "full":
        return False
    rows = doc["files"]["collect/pool.jsonl"]
    if not all("responses" in r for r in rows):
        raise SystemExit(f"{path}: its pool is marked full but lacks answer texts, left as it is")
    doc["files"]["collect/pool.jsonl"], doc["pool"] = reduced_pool(rows), "reduced"
    replace_file(path, document_bytes(doc))
    print(f"{path}: its pool reduced to each prompt's id and count of answers, every run on it "
          f"archived ({', '.join(users)}; commit it: git add {archive})", flush=True)
    return True


def restore_archived(out: str, archive: str, seeds: list) -> list:
    """Each requested seed's archived runs that out lacks, written into out as run folders
    (restored_files, write_in: archived copies, never run or resumed); the names restored. A
    run folder or log in out of a run the archive holds stops it before anything is written
    (never replaced), unless it is an archived copy, or the finished run that the archive was
    made from (archived_alike)."""
    restored = []
    for seed in seeds:
        for name in seed_names(archive, seed):
            here = os.path.join(out, name)
            if archived(here):
                continue
            if os.path.exists(here) or os.path.exists(here + ".log"):
                if finished(here) and archived_alike(here, document_path(archive, name)):
                    continue
                raise SystemExit(f"{here}: {name} is archived in {archive}, and out_dir holds "
                                 "another run of it: move it (and its log) away")
            restored.append(name)
    for name in restored:
        files = restored_files(json.load(open(document_path(archive, name))), name)
        write_in(out, name, lambda folder: write_files(folder, files))
    if restored:
        print(f"{', '.join(restored)} from the archive {archive}: finished, never run again",
              flush=True)
    return restored


def check_archived(seed: int, runs: list, archive: str):
    """An archived run is never run again, so a run still to do must not need what the archive
    lacks: a run on the main run's pool needs it full (it is reduced once every run on it is
    archived), A6 the main run's phase one (never archived). And a run on the pool that is
    archived needs its main run archived: run again, it could make another pool."""
    main = runs[0][0]
    users = pool_users(main, runs)
    if not archived(main):
        for folder in users:
            if archived(folder):
                raise SystemExit(f"seed {seed}: {os.path.basename(folder)} is archived "
                                 f"({archive or 'restored'}) without its pool's run "
                                 f"{os.path.basename(main)}, which would run again: leave seed "
                                 f"{seed} out or move its archive away")
        return
    for folder, _ in runs[1:]:
        if archived(folder):
            continue
        arm = folder[len(main) + 1:]
        if folder in users and archived_pool(main) == "reduced":
            lacks = "its pool reduced (no answer texts)"
        elif folder.endswith("-A6"):
            lacks = "no phase-one checkpoint"
        else:
            continue
        raise SystemExit(f"seed {seed}: archived ({archive or 'restored'}) with {lacks}, "
                         f"without arm {arm} ({os.path.basename(folder)}), which cannot run "
                         f"from it: leave seed {seed} out or move its archive away")


def settle_finished(out: str, archive: str, seed: int, runs: list):
    """The seed's finished runs: their checkpoints dropped (drop_run_checkpoints), and, with an
    archive, each archived that is not yet (archive_runs)."""
    for folder, _ in runs:
        if finished(folder) and not archived(folder):
            drop_run_checkpoints(folder, runs)
    if archive:
        archive_runs(out, archive, seed, runs)
