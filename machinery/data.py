"""The data rows and the experience pool: JSONL or parquet files (local or on the hub), in our
keys or the DAPO schema, checked row by row and de-duplicated; the pool's file and the
collection's progress.

A row: {"id", "problem", "answer"} and, where given, "prompt" (chat messages), "responses" (a
pool's verified answers), "data_source" (validation reports accuracy per source)."""
import hashlib
import json
import os

from machinery import UserError
from machinery.builtin import builtin_rows
from machinery.files import read_jsonl, write_atomic
from machinery.hub import local_file


# the keys a row is read from (a parquet file's other columns are not read)
row_columns = {"id", "problem", "answer", "prompt", "reward_model", "responses", "data_source"}


def read_rows(path: str, pool: bool = False, cache_dir: str = ".cache/rlep") -> list[dict]:
    """The rows of a JSONL or parquet file (a local path or a hub file, local_file's), or of a
    built-in task, de-duplicated by problem text, in file order. A row is held only once it is
    new: the paper's parquet repeats each of ~17.9k prompts ~100 times, and its 1.8 M rows are
    read a batch at a time (docs/gpu.md: host memory). pool: each row must carry responses; a
    DAPO row without candidates is left out, and the rows left out are counted in a line."""
    if path.startswith("builtin:"):
        return builtin_rows(path)
    # pydantic only where rows are read
    from machinery.schema import checked_row
    local = local_file(path, cache_dir)
    if not os.path.isfile(local):
        raise UserError(f"{path}: no such data file")
    if not local.endswith((".parquet", ".jsonl", ".json")):
        raise UserError(f"{path}: unknown format (use .jsonl or .parquet)")
    file_rows = parquet_rows if local.endswith(".parquet") else jsonl_rows
    rows, left_out = {}, 0
    # each id's first row number and problem: the collection pools answers, and seeds draws, by id,
    # so one id names one problem (its rows are then one, the first kept, as any problem's repeats)
    first_of_id = {}
    for i, raw in file_rows(local, path):
        where = f"{path}: row {i}"
        row = checked_row(raw, where)
        if pool and not row.responses:
            if "reward_model" not in raw:
                raise UserError(f"{where}: no 'responses' (a pool row carries its prompt's "
                                "verified answers, a non-empty list)")
            left_out += 1
            continue
        row_id = str(row.id if row.id not in (None, "") else hashlib.sha1(
            row.problem.encode()).hexdigest()[:12])
        first, problem = first_of_id.setdefault(row_id, (i, row.problem))
        if problem != row.problem:
            raise UserError(f"{path}: rows {first} and {i}: both have id {row_id!r}, with "
                            "other problems (the collection pools answers by id)")
        # a gold answer as the verifier reads it: a whole float as an integer (3.0: "3")
        answer = row.answer
        if isinstance(answer, float) and answer.is_integer():
            answer = int(answer)
        # the fields given, in Row's order, the prompt's messages as dicts
        fields = row.model_dump(exclude={"id"}, exclude_none=True)
        rows.setdefault(row.problem, {"id": row_id, **fields, "answer": str(answer)})
    if left_out:
        print(f"{path}: {left_out} rows without reward_model.candidates left out of the pool",
              flush=True)
    if not rows:
        pooled = " with pooled responses ('responses' or 'reward_model.candidates')"
        raise UserError(f"{path}: no rows{pooled if pool else ''}")
    return list(rows.values())


def unique_keys(pairs: list) -> dict:
    """A JSON object, each of its keys once: json keeps a repeated key's last value without a
    word ({"answer": "2", "answer": "3"} would be graded against "3")."""
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise UserError(f"the key {key!r} twice: keep one")
        obj[key] = value
    return obj


def jsonl_rows(path: str, name: str):
    """A JSONL file's rows, (line number, its JSON), blank lines skipped, a line at a time: each
    line decoded on its own, so that a bad byte or bad JSON is named by row (in the file the user
    named)."""
    with open(path, "rb") as f:
        for i, line in enumerate(f, start=1):
            try:
                # a byte-order mark (editors write one) is not part of the first row
                text = line.decode("utf-8-sig" if i == 1 else "utf-8")
                if not text.strip():
                    continue
                raw = json.loads(text, object_pairs_hook=unique_keys)
            except UnicodeDecodeError as e:
                raise UserError(f"{name}: row {i}: not UTF-8 (byte 0x{line[e.start]:02x} at "
                                f"offset {e.start})") from None
            except json.JSONDecodeError as e:
                raise UserError(f"{name}: row {i}: not valid JSON ({e.msg})") from None
            except UserError as e:  # unique_keys'
                raise UserError(f"{name}: row {i}: {e}") from None
            yield i, raw


def parquet_rows(path: str, name: str):
    """A parquet file's rows, (row number, row), a batch at a time, with only the columns a row is
    made of (the DAPO file's extra_info and ability are never read); errors name the file the user
    named."""
    # only parquet needs it
    import pyarrow.parquet
    try:
        parquet = pyarrow.parquet.ParquetFile(path)
    except pyarrow.ArrowException as e:
        raise UserError(f"{name}: not a readable parquet file ({e})") from None
    names = set(parquet.schema_arrow.names)
    if not ({"problem", "answer"} <= names or {"prompt", "reward_model"} <= names):
        raise UserError(f"{name}: columns {sorted(names)}; wanted problem and answer, or "
                        "DAPO's prompt and reward_model")
    # a batch of the authors' pool rows (up to 64 answers each) is still a few hundred MB
    batches = parquet.iter_batches(batch_size=4096, columns=sorted(names & row_columns))
    return enumerate((row for batch in batches for row in batch.to_pylist()), start=1)


def save_pool(path: str, rows: list[dict]):
    keys = ("id", "problem", "answer", "responses", "prompt")
    write_atomic(path, "".join(json.dumps({k: r[k] for k in keys if k in r}) + "\n" for r in rows))


def read_collection(out: str) -> tuple[bool, dict]:
    """A collection folder's state: whether pool.jsonl is written, and {prompt id: its verified
    answers} of the prompts done so far."""
    successes = {row["id"]: row["successes"]
                 for row in read_jsonl(os.path.join(out, "progress.jsonl"))}
    return os.path.isfile(os.path.join(out, "pool.jsonl")), successes


def load_pool(path: str, cache_dir: str = ".cache/rlep") -> list[dict]:
    """A pool file: our pool.jsonl, or any data file whose rows carry responses (DAPO:
    reward_model.candidates), read whole or refused."""
    return read_rows(path, pool=True, cache_dir=cache_dir)


def read_inputs(cfg) -> tuple:
    """The training rows (phase two reads them only to visit every prompt), the validation rows,
    the pool given with --pool (None without)."""
    needs_rows = cfg.phase != "2" or cfg.phase2_prompts == "all"
    return (read_rows(cfg.train_file, cache_dir=cfg.cache_dir) if needs_rows else [],
            read_rows(cfg.val_file, cache_dir=cfg.cache_dir) if cfg.val_every else [],
            load_pool(cfg.pool, cfg.cache_dir) if cfg.pool else None)
