"""A run of rlep.py in the study: its folder's state (finished, archived, stale: another dtype
or regime, set aside), running it with its start logged (the time and the machine), its
expected time, its curve, and its checkpoints dropped once finished."""
import collections
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import time

import numpy as np

from machinery.files import read_jsonl

from . import repo

# a finished run whose config differs in one of these is set aside and run again
regime_keys = ("prompts_per_step", "n", "replay_m", "mini_batch_prompts", "epochs",
               "equal_updates", "clip_low", "clip_high", "clip_c", "lr", "temperature",
               "phase2_steps", "collect_step", "collect_k", "val_k", "val_every")
started_mark = "study_replay.py: run started at "  # the first line of a run's log
archive_mark = "archived.json"  # in every restored run folder: an archived copy, never resumed
# seconds of each run on the project's machine (bf16, two optimizer steps a training step),
# until finished runs say better: docs/study-plan.md, "Expected time". -A7 and -A8 (--study
# dynamic) are guesses, no run has timed them: 1.6 x A2's and 1.6 x A5's, for the further rounds
# of generation that dynamic sampling draws
default_seconds = {"cpu-hard": {"": 600, "-A2": 180, "-A4": 190, "-A5": 190, "-A6": 400,
                                "-A7": 290, "-A8": 305},
                   "cpu": {"": 290, "-A2": 145, "-A4": 155, "-A5": 145, "-A6": 175,
                           "-A7": 230, "-A8": 230},
                   "tiny": {"": 20, "-A2": 15, "-A4": 15, "-A5": 15, "-A6": 15,
                            "-A7": 25, "-A8": 25}}


def finished(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "timings.json"))


def archived(folder: str) -> bool:
    """Whether a run folder is an archived copy (restore_archived's): finished, never run or
    resumed."""
    return os.path.isfile(os.path.join(folder, archive_mark))


def run_config(folder: str) -> dict:
    path = os.path.join(folder, "config.json")
    return json.load(open(path)) if os.path.isfile(path) else {}


def run_dtype(folder: str):
    """The compute dtype a run trained in (its config.json), None before it started."""
    return run_config(folder).get("dtype")


def stale_reason(folder: str, dtype: str, cfg, dynamic: bool = None) -> str:
    """Why a started run cannot join the study ('' if it can): another dtype or regime.
    dynamic (--study dynamic): whether the arm asks for dynamic sampling; a run made without
    it (no such key) had none; with it, max_gen_rounds must be the study's too."""
    config = run_config(folder)
    if not config:
        return ""
    if config.get("dtype") != dtype:
        return f"not in {dtype}"
    differ = [k for k in regime_keys if config.get(k) != getattr(cfg, k)]
    if dynamic is not None and config.get("dynamic_sampling", False) != dynamic:
        differ.append("dynamic_sampling")
    if dynamic and config.get("max_gen_rounds") != getattr(cfg, "max_gen_rounds", None):
        differ.append("max_gen_rounds")
    return f"another regime ({', '.join(differ)})" if differ else ""


def set_aside_stale(runs: list, dtype: str, cfg, dynamic: bool = False):
    """Arms compare at one precision and in one regime: a run in another is renamed
    FOLDER.DTYPE (or FOLDER.old) and run again; if the seed's main run goes, so do the runs
    on its pool or its phase one (A6). dynamic: also check each run's dynamic sampling against
    its flags' (--study dynamic). A stale archived run stops it, before anything moves."""
    stale = {folder: stale_reason(folder, dtype, cfg,
                                  ("--dynamic_sampling" in flags) if dynamic else None)
             for folder, flags in runs}
    stale = {folder: why for folder, why in stale.items() if why}
    if runs[0][0] in stale:
        for folder, flags in runs[1:]:
            if ("--pool" in flags or folder.endswith("-A6")) and os.path.exists(folder):
                stale.setdefault(folder, "its pool is set aside")
    for folder, why in stale.items():
        if archived(folder):
            raise SystemExit(f"{folder}: {why}, and it is an archived run (--archive), never "
                             "set aside nor run again: run the study in its dtype and regime, "
                             "or move its seed's archive away")
    for folder, why in stale.items():
        aside = f"{folder}.{run_dtype(folder) or dtype}"
        while os.path.exists(aside):
            aside += ".old"
        print(f"{folder}: {why}, moved to {aside} to run again", flush=True)
        os.rename(folder, aside)
        if os.path.exists(folder + ".log"):
            os.rename(folder + ".log", aside + ".log")


def run(folder: str, flags: list, main_folder: str):
    if folder.endswith("-A6") and not os.path.exists(os.path.join(folder, "phase1")):
        # phase one is A3's: its checkpoint builds the second pool
        os.makedirs(folder, exist_ok=True)
        os.symlink(os.path.abspath(os.path.join(main_folder, "phase1")),
                   os.path.join(folder, "phase1"))
    resume = ["--resume"] if os.path.isfile(os.path.join(folder, "config.json")) else []
    command = [sys.executable, "rlep.py", "--out_dir", folder, *flags, *resume]
    print(" ".join(command), flush=True)
    with open(folder + ".log", "a") as log:
        # rlep.py writes no time: the report's evidence that the plan came first
        log.write(f"{started_mark}{utc(time.time())} on {machine()}\n")
        log.flush()
        done = subprocess.run(command, cwd=repo, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)} (see {folder}.log)")


def utc(seconds: float) -> str:
    """A time as ISO 8601 in UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def machine(cpuinfo: str = "/proc/cpuinfo") -> str:
    """'CPU (bf16 KIND)' of this machine, for a run's start line: the first model name of
    cpuinfo (else platform.processor(), else 'unknown CPU'), and KIND 'native: amx' or
    'native: avx512_bf16' by its flags, else 'emulated' (slower than float32): runs of one seed
    on two machines differ in bf16's rounding and in time."""
    name, flags = "", []
    try:
        for line in open(cpuinfo, errors="replace"):
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not name:
                name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = value.split()
    except OSError:
        pass
    kind = ("native: amx" if "amx_bf16" in flags else
            "native: avx512_bf16" if "avx512_bf16" in flags else "emulated")
    return f"{name or platform.processor() or 'unknown CPU'} (bf16 {kind})"


def first_start(folder: str) -> str:
    """What follows started_mark on the first start line of FOLDER.log: 'TIME on MACHINE'
    (machine()), or 'TIME' in a log from before the machine was logged; '' without one."""
    if os.path.isfile(folder + ".log"):
        for line in open(folder + ".log", errors="replace"):
            if line.startswith(started_mark):
                return line[len(started_mark):].rstrip("\n")
    return ""


def run_machine(folder: str) -> str:
    """The machine of a run's first start (machine()), '' if its log does not say."""
    return first_start(folder).partition(" on ")[2].strip()


def run_started(folder: str) -> tuple:
    """(UTC time, how it is known) of a run's first start: study_replay.py's line in its log;
    else the earliest modification time of its config.json and metrics.jsonl files, a time of
    their last write, so later than the start (rlep.py writes no time)."""
    logged = first_start(folder)
    if logged:
        return logged.split(" on ", 1)[0].strip(), "logged"
    paths = [os.path.join(folder, "config.json"), *glob.glob(os.path.join(folder, "*",
                                                                          "metrics.jsonl"))]
    times = [os.path.getmtime(p) for p in paths if os.path.isfile(p)]
    return (utc(min(times)), "file mtime (last write)") if times else ("-", "not started")


def expected_seconds(out: str, seed_runs: dict, preset: str) -> float:
    """The runs still to do, each at the mean time of its finished kind (else the default).
    seed_runs: seed -> its runs (runs_of, dynamic_runs_of)."""
    spent = collections.defaultdict(list)
    todo = []
    for seed, runs in seed_runs.items():
        for folder, _ in runs:
            kind = folder[len(os.path.join(out, f"seed{seed}")):]
            if finished(folder):
                spent[kind].append(json.load(open(os.path.join(folder, "timings.json")))["total_s"])
            else:
                todo.append(kind)
    default = default_seconds[preset]
    return sum(np.mean(spent[k]) if spent[k] else default[k] for k in todo)


def curve(folder: str, part: str, steps: int) -> tuple:
    """(steps, val_acc, metrics rows, {kind: val_acc}) of a part, up to `steps`."""
    rows = [r for r in read_jsonl(os.path.join(folder, part, "metrics.jsonl"))
            if r["step"] <= steps]
    points = [r for r in rows if "val_acc" in r]
    kinds = {k[len("val_acc/"):]: np.array([r[k] for r in points])
             for k in (points[0] if points else {}) if k.startswith("val_acc/")}
    return (np.array([r["step"] for r in points]), np.array([r["val_acc"] for r in points]),
            rows, kinds)


def drop_checkpoints(out: str, seed: int):
    """A finished seed's step_NNNNNN folders (its metrics, pools and logs stay)."""
    # seedS and seedS-*, not seed(S)0 (with 16 seeds, seed1's would match seed10-seed16)
    steps = [glob.glob(os.path.join(out, f"seed{seed}{more}", "phase*", "step_*"))
             for more in ("", "-*")]
    for folder in steps[0] + steps[1]:
        if not os.path.islink(os.path.dirname(folder)):
            shutil.rmtree(folder)


def drop_run_checkpoints(folder: str, runs: list):
    """A finished run's step_NNNNNN folders (its metrics, pool and log stay), but the main
    run's phase one while an A6 of its seed, which collects from that checkpoint, is
    unfinished."""
    keep = folder == runs[0][0] and any(f.endswith("-A6") and not finished(f) for f, _ in runs)
    for step in glob.glob(os.path.join(folder, "phase*", "step_*")):
        part = os.path.dirname(step)
        if not os.path.islink(part) and not (keep and os.path.basename(part) == "phase1"):
            shutil.rmtree(step)
