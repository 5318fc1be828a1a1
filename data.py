"""What a run reads and writes, for rlep.py and eval.py: files, rows, the pool, checkpoints,
a step's row of metrics.jsonl and a finished run's report; not the method.

    write_atomic, read_jsonl, append_jsonl     files a crash never leaves half-written
    UserError                                  bad input: one line, exit 2 (rlep.py, eval.py)
    read_rows, save_pool, load_pool            data rows and the experience pool, checked
    save_checkpoint, load_trainer_state, ...   checkpoints: written whole, pruned (checks.py
                                               sizes them against the disk)
    step_counts, step_record, log_step, ...    a training step's row of metrics.jsonl
    comparison_table, plot_comparison, ...     a finished run's baseline-vs-RLEP report
    start_wandb, track, finish_wandb           live curves on Weights & Biases (optional)

The built-in tasks and models of the small presets are in builtin.py.
"""
import collections
import contextlib
import glob
import hashlib
import json
import os
import re
import shutil
from dataclasses import asdict

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_optimizer_state_dict)

from builtin import builtin_rows

class UserError(ValueError):
    """Bad input (a flag, file, row, folder, the disk): rlep.py prints the message as one
    line and exits 2; anything else keeps its traceback."""


# ---------------------------------------------------------------------------
# Files: written whole or not at all; a JSONL line cut short by a kill is
# skipped when read

def write_atomic(path: str, text: str):
    """Write a file so that a crash leaves either the old file or the new
    one, never half of one."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)

def read_jsonl(path: str) -> list:
    """The rows of a JSONL file (none if it is missing), without a last
    line cut short by a kill."""
    if not os.path.isfile(path):
        return []
    rows = []
    for line in open(path):
        with contextlib.suppress(json.JSONDecodeError):
            rows.append(json.loads(line))
    return rows

def save_config(out_dir: str, config: dict, saved: dict, changes: list[dict]):
    """config.json: the run's Config; with "overrides", every --override's changes (the
    saved ones, then this command's `changes`) and the steps they took effect at."""
    os.makedirs(out_dir, exist_ok=True)
    overrides = saved.get("overrides", []) + changes
    record = {**config, **({"overrides": overrides} if overrides else {})}
    write_atomic(os.path.join(out_dir, "config.json"), json.dumps(record, indent=2))

def add_timings(out_dir: str, total: float, parts: dict, **more):
    """timings.json: seconds in all and per part, added to a resumed run's earlier
    processes' (counted in "processes")."""
    path = os.path.join(out_dir, "timings.json")
    earlier = (read_jsonl(path) or [{}])[0]  # one line
    spent = collections.Counter(earlier.get("parts_s", {}))
    spent.update(parts)
    processes = earlier.get("processes", 1 if earlier else 0) + 1
    timings = {"total_s": earlier.get("total_s", 0) + total, "parts_s": spent,
               "processes": processes, **more}
    write_atomic(path, json.dumps(timings))

def append_jsonl(path: str, rows: list):
    with open(path, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
        f.flush()
        os.fsync(f.fileno())


# ---------------------------------------------------------------------------
# Data rows: {"id", "problem", "answer"}, plus "prompt" (chat messages),
# "responses" (a pool's) and "data_source" where given

def from_dapo_schema(raw: dict, where: str) -> dict:
    """A DAPO row (prompt, reward_model.ground_truth [.candidates]) in our
    keys: problem, answer, prompt, responses."""
    messages = raw.get("prompt")
    reward_model = raw["reward_model"]
    is_message = [isinstance(m, dict) and {"role", "content"} <= set(m)
                  for m in messages or []]
    if not isinstance(messages, list) or not messages or not all(is_message):
        raise UserError(f"{where}: 'prompt' must be a non-empty list "
                        "of {role, content} messages")
    if (not isinstance(reward_model, dict)
            or reward_model.get("ground_truth") in (None, "")):
        raise UserError(f"{where}: missing 'reward_model.ground_truth'")
    prompt = [{"role": m["role"], "content": m["content"]} for m in messages]
    return {
        **raw,
        "problem": messages[-1]["content"],
        "answer": reward_model["ground_truth"],
        "prompt": prompt,
        "responses": reward_model.get("candidates"),
    }

# the keys normalize_row reads (a parquet file's other columns are not read)
row_columns = {"id", "problem", "answer", "prompt", "reward_model", "responses", "data_source"}

def normalize_row(raw: dict, where: str) -> dict:
    """A DAPO row or {"problem", "answer" [, "responses"]}, checked."""
    if not isinstance(raw, dict):
        kind = type(raw).__name__
        raise UserError(f"{where}: expected a JSON object, got {kind}")
    if "reward_model" in raw:
        raw = from_dapo_schema(raw, where)
    for key in ("problem", "answer"):
        if raw.get(key) in (None, ""):
            raise UserError(f"{where}: missing '{key}' (or use the DAPO "
                            "schema: prompt + reward_model)")
    responses = raw.get("responses")
    if responses is not None:
        if not isinstance(responses, (list, tuple)) or not all(
                isinstance(r, str) for r in responses):
            raise UserError(f"{where}: responses/candidates must be a "
                            "list of strings")
        responses = list(responses)
    problem = str(raw["problem"])
    row_id = raw.get("id") or hashlib.sha1(problem.encode()).hexdigest()[:12]
    row = {
        "id": str(row_id),
        "problem": problem,
        "answer": str(raw["answer"]),
        "prompt": raw["prompt"] if isinstance(raw.get("prompt"), list) else None,
        "responses": responses,
        # validation reports accuracy per data source
        "data_source": str(raw["data_source"]) if raw.get("data_source") else None,
    }
    return {k: v for k, v in row.items() if v is not None}

def read_rows(path: str, pool: bool = False, cache_dir: str = ".cache/rlep") -> list[dict]:
    """The rows of a JSONL or parquet file (a local path or a hub file, local_file's), or of a
    built-in task, de-duplicated by problem text, in file order. A row is held only once it is
    new: the paper's parquet repeats each of ~17.9k prompts ~100 times, and its 1.8 M rows are
    read a batch at a time (docs/gpu.md: host memory). pool: each row must carry responses; a
    DAPO row without candidates is left out, and the rows left out are counted in a line."""
    if path.startswith("builtin:"):
        try:
            return builtin_rows(path)
        except ValueError as e:
            raise UserError(str(e)) from None
    local = local_file(path, cache_dir)
    if not os.path.isfile(local):
        raise UserError(f"{path}: no such data file")
    if not local.endswith((".parquet", ".jsonl", ".json")):
        raise UserError(f"{path}: unknown format (use .jsonl or .parquet)")
    if local.endswith(".parquet"):
        lines = enumerate(parquet_rows(local, path), start=1)
    else:
        lines = [(i, text) for i, text in enumerate(text_lines(local, path), start=1)
                 if text.strip()]
    rows, left_out = {}, 0
    # each id's first row number and problem: the collection pools answers, and seeds draws,
    # by id, so one id names one problem (its rows are then one, the first kept, as any
    # problem's repeats)
    first_of_id = {}
    for i, raw in lines:
        where = f"{path}: row {i}"
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError as e:
                raise UserError(f"{where}: not valid JSON ({e.msg})") from None
        row = normalize_row(raw, where)
        if pool and not row.get("responses"):
            if "reward_model" not in raw:
                raise UserError(f"{where}: no 'responses' (a pool row carries its prompt's "
                                "verified answers, a non-empty list)")
            left_out += 1
            continue
        first, problem = first_of_id.setdefault(row["id"], (i, row["problem"]))
        if problem != row["problem"]:
            raise UserError(f"{path}: rows {first} and {i}: both have id {row['id']!r}, with "
                            "other problems (the collection pools answers by id)")
        rows.setdefault(row["problem"], row)
    if left_out:
        print(f"{path}: {left_out} rows without reward_model.candidates left out of the pool",
              flush=True)
    if not rows:
        pooled = " with pooled responses ('responses' or 'reward_model.candidates')"
        raise UserError(f"{path}: no rows{pooled if pool else ''}")
    return list(rows.values())

def text_lines(path: str, name: str) -> list[str]:
    """A JSONL file's lines, each decoded on its own: a bad byte is named by row (in the file
    the user named)."""
    lines = []
    with open(path, "rb") as f:
        for i, line in enumerate(f, start=1):
            try:
                # a byte-order mark (editors write one) is not part of the first row
                lines.append(line.decode("utf-8-sig" if i == 1 else "utf-8"))
            except UnicodeDecodeError as e:
                raise UserError(f"{name}: row {i}: not UTF-8 (byte 0x{line[e.start]:02x} at "
                                f"offset {e.start})") from None
    return lines

def parquet_rows(path: str, name: str):
    """A parquet file's rows, a batch at a time, with only the columns a row is made of (the
    DAPO file's extra_info and ability are never read); errors name the file the user named."""
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
    read = [c for c in parquet.schema_arrow.names if c in row_columns]
    # a batch of the authors' pool rows (up to 64 answers each) is still a few hundred MB
    for batch in parquet.iter_batches(batch_size=4096, columns=read):
        yield from batch.to_pylist()

# A hub dataset file, in huggingface_hub's convention: hf://datasets/ORG/NAME[@REVISION]/PATH
hub_file = re.compile(r"hf://datasets/([\w.-]+/[\w.-]+)(?:@([^/]+))?/(.+)")

def local_file(path: str, cache_dir: str) -> str:
    """A data file on this machine: `path` itself, or a hub dataset file (hub_file) fetched
    once into huggingface_hub's cache, where a later run (HF_HUB_OFFLINE=1 too) finds it. A
    PATH ending in `.part-*` names the pieces of one file (the authors' pool ships so): each
    fetched, then joined in name order into cache_dir, once."""
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

def save_pool(path: str, rows: list[dict]):
    keys = ("id", "problem", "answer", "responses", "prompt")
    lines = [json.dumps({k: r[k] for k in keys if k in r}) + "\n" for r in rows]
    write_atomic(path, "".join(lines))

def progress_row(record: dict) -> dict:
    """RLEP: a collection's row of progress.jsonl, from a sample_and_grade record: the
    prompt's verified answers and the response tokens generated for it (the study's cost).
    Made before the ranks gather: the other answers of K never cross them."""
    right = [t for t, ok in zip(record["responses"], record["correct"]) if ok]
    return {"id": record["id"], "successes": right, "tokens": sum(record["lengths"])}

def read_collection(out: str) -> tuple[bool, dict]:
    """A collection folder's state: whether pool.jsonl is written, and {prompt id: its
    verified answers} of the prompts done so far."""
    done = read_jsonl(os.path.join(out, "progress.jsonl"))
    successes = {row["id"]: row["successes"] for row in done}
    return os.path.isfile(os.path.join(out, "pool.jsonl")), successes

def load_pool(path: str, cache_dir: str = ".cache/rlep") -> list[dict]:
    """A pool file: our pool.jsonl, or any data file whose rows carry responses (DAPO:
    reward_model.candidates), read whole or refused."""
    return read_rows(path, pool=True, cache_dir=cache_dir)


# ---------------------------------------------------------------------------
# Checkpoints: a part's step_NNNNNN folders, complete once trainer_state.pt is in
# them; the newest few are kept, and the disk they take is checked before a run

def checkpoint_path(part_dir: str, step: int) -> str:
    return os.path.join(part_dir, f"step_{step:06d}")

def complete_checkpoints(part_dir: str) -> list[int]:
    """The steps of a part's complete checkpoints, oldest first. A save cut short left
    only a `.tmp` folder, which is not one."""
    if not os.path.isdir(part_dir):
        return []
    steps = []
    for name in os.listdir(part_dir):
        number = name[len("step_"):]
        state = os.path.join(part_dir, name, "trainer_state.pt")
        if name.startswith("step_") and number.isdigit() and os.path.isfile(state):
            steps.append(int(number))
    return sorted(steps)

def latest_checkpoint(part_dir: str) -> tuple[int, str | None]:
    """(step, folder) of the newest complete checkpoint, or (0, None)."""
    steps = complete_checkpoints(part_dir)
    if not steps:
        return 0, None
    return steps[-1], checkpoint_path(part_dir, steps[-1])

def resume_point(part_dir: str) -> tuple[int, str | None, int]:
    """latest_checkpoint's (step, folder) and the round of prompts (rlep.step_prompts) the
    next step starts at; a checkpoint older than --dynamic_sampling: the step."""
    step, folder = latest_checkpoint(part_dir)
    if folder is None:
        return step, folder, step
    state = torch.load(os.path.join(folder, "trainer_state.pt"), map_location="cpu")
    return step, folder, state.get("prompt_round", step)

def pruned(steps: list[int], keep: int) -> list[int]:
    """The steps, oldest first, that lose their place once the newest `keep` are whole;
    keep 0 keeps all."""
    return steps[:-keep] if keep else []

def prune_checkpoints(part_dir: str, keep: int, protected: set[int]):
    """After a save completes: the newest `keep` checkpoints stay whole (a resume reads
    one); an older protected step keeps its weights only (the collection reads them, no
    resume needs its AdamW state); the rest go."""
    for step in pruned(complete_checkpoints(part_dir), keep):
        folder = checkpoint_path(part_dir, step)
        if step in protected:
            shutil.rmtree(os.path.join(folder, "optimizer"), ignore_errors=True)
        else:
            # renamed first: a crash mid-delete leaves no half checkpoint under a step's name
            os.replace(folder, folder + ".deleting")
            shutil.rmtree(folder + ".deleting")

def leftovers(out_dir: str) -> list[str]:
    """A stopped prune's `step_*.deleting` folders and a stopped save's `step_*.tmp`: dead
    weight, which the disk check counts as free."""
    found = []
    for part in ("phase1", "phase2"):
        part_dir = os.path.join(out_dir, part)
        names = os.listdir(part_dir) if os.path.isdir(part_dir) else []
        found += [os.path.join(part_dir, name) for name in sorted(names)
                  if name.startswith("step_") and name.endswith((".deleting", ".tmp"))]
    return found

def remove_leftovers(out_dir: str):
    """The leftovers, removed by rank 0 before the run writes."""
    found = leftovers(out_dir)
    for folder in found:
        shutil.rmtree(folder)
    if found:
        names = ", ".join(os.path.relpath(f, out_dir) for f in found)
        print(f"removed what a stopped save or prune left: {names}", flush=True)

def save_checkpoint(part_dir: str, step: int, policy, optimizer, tokenizer, cfg, d,
                    protected: set[int] = frozenset(), prompt_round: int = None):
    """rlep.py's policy (FSDP2 or not): HF weights gathered to rank 0's CPU, AdamW as a file
    per rank (DCP), the step and the run's Config; written to a `.tmp` folder and renamed:
    a crash keeps the last good one. Then old checkpoints are pruned. d: rlep.Dist."""
    final = checkpoint_path(part_dir, step)
    tmp = final + ".tmp"
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(policy.model, options=options)
    # a tied weight (SmolLM2's head) comes back gathered under both names, in two copies
    # that save_pretrained would both write: keep the first name, as an unsharded save does
    seen = set()
    for name, param in policy.model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            weights.pop(name, None)
        seen.add(id(param))
    if d.master_process:
        shutil.rmtree(tmp, ignore_errors=True)
        policy.model.save_pretrained(tmp, state_dict=weights)
        tokenizer.save_pretrained(tmp)
        write_atomic(os.path.join(tmp, "rlep_config.json"), json.dumps(asdict(cfg), indent=2))
    # rank 0's full copy goes before AdamW's state is gathered
    del weights
    if d.distributed:
        dist.barrier()
    optimizer_state = get_optimizer_state_dict(policy, optimizer)
    dcp.save({"optimizer": optimizer_state}, checkpoint_id=os.path.join(tmp, "optimizer"))
    if d.master_process:
        # data order and replay draws derive from the step; the RNG state is kept for safety
        state = {"step": step, "torch_rng": torch.get_rng_state(),
                 # the next step's first round of prompts (resume_point)
                 "prompt_round": step if prompt_round is None else prompt_round}
        torch.save(state, os.path.join(tmp, "trainer_state.pt"))
        # the same step saved again after a resume
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        prune_checkpoints(part_dir, cfg.keep_checkpoints, protected)
    if d.distributed:
        dist.barrier()

def load_trainer_state(ckpt: str, policy, optimizer):
    """AdamW's state (resharded to this run's ranks) and the RNG state, read to the CPU
    (set_rng_state fails on a GPU tensor)."""
    state = {"optimizer": get_optimizer_state_dict(policy, optimizer)}
    dcp.load(state, checkpoint_id=os.path.join(ckpt, "optimizer"))
    set_optimizer_state_dict(policy, optimizer, state["optimizer"])
    trainer_state = torch.load(os.path.join(ckpt, "trainer_state.pt"), map_location="cpu")
    torch.set_rng_state(trainer_state["torch_rng"])

def protected_steps(cfg, part: str) -> set[int]:
    """The steps whose weights pruning keeps: phase one's collect_step, which the
    collection reads (cfg: rlep.Config)."""
    return {cfg.collect_step} if part == "phase1" else set()

def save_plan(cfg, part: str) -> list[int]:
    """The steps a part saves (cfg: rlep.Config): every save_every-th and its last; phase
    one also collect_step, which the collection reads."""
    steps = cfg.phase1_steps if part == "phase1" else cfg.phase2_steps
    plan = set(range(cfg.save_every, steps + 1, cfg.save_every)) | {steps}
    if part == "phase1":
        plan.add(cfg.collect_step)
    # a step past the part is never reached (check_save_plan refuses it where it matters)
    return sorted(step for step in plan if 1 <= step <= steps)


# ---------------------------------------------------------------------------
# Step metrics: a row of metrics.jsonl, from every rank's counts (rlep.train)

def logprob_gaps(trained: list) -> list[float]:
    """|log π_θold - vLLM's log-prob| per fresh token a rank trained (rlep.Sample's, from
    ppo_update): stale weights, a wrong T or stop, a precision drift show here."""
    fresh = [s for s in trained if not s.replay]
    # one copy to the host
    old = torch.cat([s.old_logprobs for s in fresh]).tolist() if fresh else []
    sampled = [lp for s in fresh for lp in s.vllm_logprobs]
    return [abs(a - b) for a, b in zip(old, sampled)]

def step_counts(groups: list[list], visits: list[dict], gaps: list[float], tokenizer, cfg,
                stop_ids: list[int], update: dict) -> dict:
    """This rank's sums for the step's metrics (step_record adds the ranks'): groups, lists
    of rlep.Sample; visits and gaps, the method's quantities (rlep.visit, rlep.logprob_gaps);
    update, rlep.ppo_update's summary (its token counts)."""
    fresh = [s for g in groups for s in g if not s.replay]
    ends = collections.Counter()
    for s in fresh:
        # the stop token that ended a response, or "length" if it was cut at L_max
        cut = len(s.completion_ids) >= cfg.max_response_len
        last = s.completion_ids[-1]
        token = tokenizer.convert_ids_to_tokens(last)
        ends["length" if cut and last not in stop_ids else token] += 1
    return {"samples": sum(map(len, groups)), "fresh": len(fresh),
            "correct": sum(s.correct for s in fresh),
            "tokens": sum(len(s.completion_ids) for s in fresh),
            "reward": sum(s.reward for g in groups for s in g), "groups": len(groups),
            "zero_std": sum(all(s.advantage == 0 for s in g) for g in groups),
            "rescued": sum(v["rescued"] for v in visits),
            "pooled": sum(v["replays"] > 0 for v in visits),
            "gap_sum": sum(gaps), "gap_max": max(gaps, default=0.0),
            "ends": dict(ends), "visits": visits,
            "trained_tokens": update["trained_tokens"],
            "trained_response_tokens": update["trained_response_tokens"]}

def step_record(ranks: list[dict]) -> dict:
    """The step's metrics from every rank's step_counts."""
    total = collections.Counter()
    ends = collections.Counter()
    visits = []
    for counts in ranks:
        ends.update(counts["ends"])
        visits += counts["visits"]
        sums = {k: v for k, v in counts.items() if k not in ("ends", "visits")}
        # update adds negative sums too (a Counter's + would drop them)
        total.update(sums)
    return {"reward_mean": total["reward"] / total["samples"],
            "acc_fresh": total["correct"] / total["fresh"],
            "response_len": total["tokens"] / total["fresh"],
            "zero_std_frac": total["zero_std"] / total["groups"],
            # m / (n + m) in phase two
            "replay_frac": 1 - total["fresh"] / total["samples"],
            # the visits rescued (rlep.visit), and their share of the visits to pooled
            # prompts
            "rescued": total["rescued"],
            "rescued_frac": total["rescued"] / max(1, total["pooled"]),
            "ends": {k: v / total["fresh"] for k, v in ends.items()},
            "logprob_gap_mean": total["gap_sum"] / total["tokens"],
            "logprob_gap_max": max(r["gap_max"] for r in ranks),
            "trained_tokens": total["trained_tokens"],
            "trained_response_tokens": total["trained_response_tokens"],
            "visits": visits}

def log_step(part: str, step: int, steps: int, record: dict):
    keys = ("reward_mean", "acc_fresh", "response_len", "replay_frac", "rescued", "clip_frac",
            "ratio_max", "grad_norm", "logprob_gap_max", "val_acc", "t_generation", "t_training")
    shown = [f"{k} {record[k]:.3g}" for k in keys if k in record]
    if record.get("gen_capped"):  # rlep's --max_gen_rounds: dropped groups fill the step
        shown.append(f"capped: {record['kept_groups']} groups mixed")
    print(f"{part} step {step}/{steps} | " + " | ".join(shown), flush=True)


# ---------------------------------------------------------------------------
# A finished run's report: the paper's comparison table and its curves

def validation_curves(run_dir: str, part: str) -> dict:
    """{val_acc or val_acc/<source>: [(step, value)]} of a part's metrics.jsonl."""
    curves = collections.defaultdict(dict)
    for row in read_jsonl(os.path.join(run_dir, part, "metrics.jsonl")):
        for key, value in row.items():
            if key.startswith("val_acc") and value is not None:
                curves[key][row["step"]] = value
    return {key: sorted(points.items()) for key, points in curves.items()}

def comparison_table(run_dirs: list[str]) -> str:
    """The paper's comparison per run and validation metric: the peaks,
    when RLEP first reaches the baseline's, the finals."""
    def cell(point):
        if point is None:
            return "n/a"
        return f"{100 * point[1]:.1f} (step {point[0]})"

    def peak(curve):
        # the earliest of equal peaks
        if not curve:
            return None
        return max(curve, key=lambda point: (point[1], -point[0]))

    lines = ["| run | metric | baseline peak | RLEP reaches it at | RLEP peak "
             "| baseline final | RLEP final |", "|---" * 7 + "|"]
    for run_dir in run_dirs:
        base_curves = validation_curves(run_dir, "phase1")
        rlep_curves = validation_curves(run_dir, "phase2")
        if not base_curves and not rlep_curves:
            raise ValueError(f"{run_dir}: no val_acc in phase1/metrics.jsonl "
                             "or phase2/metrics.jsonl")
        name = os.path.basename(os.path.normpath(run_dir))
        for key in sorted(set(base_curves) | set(rlep_curves)):
            base = base_curves.get(key, [])
            ours = rlep_curves.get(key, [])
            reached = "n/a"
            if base and ours:
                target = peak(base)[1]
                reached = next((f"step {s}" for s, v in ours if v >= target),
                               "never")
            cells = [name, key, cell(peak(base)), reached, cell(peak(ours)),
                     cell(base[-1] if base else None),
                     cell(ours[-1] if ours else None)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)

def save_plot(path: str, panels: dict, ylabel: str) -> str:
    """panels: {title: [(label, steps, values, linestyle, colour index)]},
    a subplot each. Returns the line to print."""
    try:
        # picks a file-only backend on machines without a display
        import matplotlib.pyplot as plt
    except ImportError:
        return f"no plot ({path}): matplotlib is not installed"
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4),
                             squeeze=False, layout="constrained")
    for ax, (title, lines) in zip(axes[0], panels.items()):
        for label, steps, values, style, colour in lines:
            percent = [100 * v for v in values]
            ax.plot(steps, percent, style, color=f"C{colour}", marker=".",
                    label=label)
        ax.set(title=title, xlabel="training step", ylabel=ylabel)
        ax.legend()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"plot: {path}"

def plot_comparison(run_dirs: list[str], path: str) -> str:
    """The runs' validation curves: a panel per metric, a colour per run,
    the baseline (phase one) dashed, RLEP (phase two) solid."""
    panels = collections.defaultdict(list)
    parts = (("phase1", "baseline", "--"), ("phase2", "RLEP", "-"))
    for i, run_dir in enumerate(run_dirs):
        name = os.path.basename(os.path.normpath(run_dir))
        for part, label, style in parts:
            for key, curve in validation_curves(run_dir, part).items():
                steps = [s for s, _ in curve]
                values = [v for _, v in curve]
                panels[key].append((f"{name} {label}", steps, values, style, i))
    return save_plot(path, dict(sorted(panels.items())),
                     "validation avg@k (%)")

def final_report(out_dir: str, compare: bool, total: float, spent: dict, gflops) -> str:
    """Rank 0's end of rlep.py: with `compare`, the comparison table (returned; else "")
    and curves.png; the time table, seconds per activity; timings.json, where a resumed
    run's processes add up."""
    table = ""
    if compare:
        table = comparison_table([out_dir])
        print(table)
        print(plot_comparison([out_dir], os.path.join(out_dir, "curves.png")))
    shown = [f"{k} {v:.0f} s ({100 * v / total:.0f} %)" for k, v in spent.items()]
    print(f"time: {total:.0f} s | " + " | ".join(shown))
    add_timings(out_dir, total, spent, linear_gflops=gflops)
    return table


# ---------------------------------------------------------------------------
# Weights & Biases, optional (--wandb_project): rank 0 logs each metrics.jsonl row
# as it is written. wandb is imported only when a project is given.

wandb_run = None  # the command's W&B run, on rank 0; None: not tracking


def start_wandb(project: str, out_dir: str, config: dict, name: str):
    """One W&B run per out_dir: a resumed run continues it (its id is kept in out_dir).
    Each part's metrics are named phase1/... and phase2/..., against the part's own step,
    so the baseline's and RLEP's curves share an axis."""
    global wandb_run
    import wandb
    id_path = os.path.join(out_dir, "wandb_id")
    if os.path.isfile(id_path):
        run_id = open(id_path, encoding="utf-8").read().strip()
    else:
        run_id = os.urandom(4).hex()  # W&B ids: 8 lowercase letters or digits
        write_atomic(id_path, run_id)
    wandb_run = wandb.init(project=project, id=run_id, resume="allow", name=name,
                           config=config, dir=out_dir)
    for part in ("phase1", "phase2"):
        wandb_run.define_metric(f"{part}/step")
        wandb_run.define_metric(f"{part}/*", step_metric=f"{part}/step")


def track(part: str, record: dict):
    """A metrics.jsonl row, its numbers under the part's name; nothing when not tracking."""
    if wandb_run is None:
        return
    numbers = {k: v for k, v in record.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    wandb_run.log({f"{part}/{k}": v for k, v in numbers.items()})


def finish_wandb(table: str = ""):
    """The comparison table (comparison_table's markdown) as a W&B table, then the end."""
    global wandb_run
    if wandb_run is None:
        return
    if table:
        import wandb
        head, _, *body = [line.strip("|").split(" | ") for line in table.splitlines()]
        columns = [c.strip() for c in head]
        rows = [[c.strip() for c in row] for row in body]
        wandb_run.log({"comparison": wandb.Table(columns=columns, data=rows)})
    wandb_run.finish()
    wandb_run = None
