"""What crosses ranks, on two gloo ranks: what rank 0 reads, every rank gets, also where their
filesystems disagree (as a shared filesystem's cached listings can): the data files are read once,
by rank 0, and the other rank trains on its rows without opening a file; the collection starts,
or is refused, as rank 0 sees the folder; phase two's collected pool is read by rank 0 alone. Rows
cross ranks as plain data: a tensor in one is refused. A weight push gathers shards already cast
to the engine's dtype, the same bits as the full weights cast. Each test stops the run where its
decision has been taken: an engine stand-in whose push raises, or train() replaced by a recorder
(vLLM is not what these test). Under torchrun, a rank failing inside a push ends both ranks in
seconds, with one line naming it. Run: python -m pytest -q tests/test_ranks.py"""
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, AutoTokenizer

from machinery import RunStopped, checkpoints, data, ranks, vllm_engine
import forked
import rlep


class Reached(Exception):
    """The run got past the decision under test."""


class EngineStandIn:
    def sleep(self):
        pass

    def memory_line(self, preset=""):
        return "vLLM: a stand-in"

    def shutdown(self, wake=False):
        pass

    def push(self, model=None, path=None):
        raise Reached


def on_two_ranks(rank, port, test, args, out):
    """Rank `rank` of 2 (the environment torchrun would set): test(rank, *args), its result
    or the name and message of what it raised, saved to out/rank{rank}.json."""
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        result = {"returned": test(rank, *args)}
    except Exception as e:  # the outcome is what this test compares across ranks
        result = {"raised": type(e).__name__, "message": str(e)}
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def run_on_two_ranks(test, args, tmp_path, port):
    forked.spawn(on_two_ranks, args=(port, test, args, str(tmp_path)), nprocs=2)
    return [json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1)]


def main_until_train(rank, argv):
    """rlep.main on this rank, its data files readable by rank 0 alone; returns the ids of the
    rows train() receives."""
    def no_reading(*args, **kwargs):
        raise AssertionError(f"rank {rank} opened a data file")
    if rank:
        data.read_rows = data.load_pool = no_reading
    trained = []
    rlep.build_engine = lambda *args: EngineStandIn()
    rlep.train = lambda cfg, part, rows, *args, **kwargs: trained.append([r["id"] for r in rows])
    rlep.main(argv)
    return trained


def test_the_data_files_are_read_once_by_rank_0_and_every_rank_trains_on_its_rows(
        tmp_path, tiny_model, free_port):
    argv = ["--preset", "tiny", "--model_path", tiny_model, "--out_dir", str(tmp_path / "run"),
            "--phase", "1"]
    ranks = run_on_two_ranks(main_until_train, (argv,), tmp_path, free_port)
    expected = [[r["id"] for r in data.read_rows("builtin:tiny:train")]]
    assert ranks[0] == ranks[1] == {"returned": expected}


def collect_until_push(rank, out_dir, model_path):
    """rlep.collect on this rank, twice: phase one's checkpoint at collect_step absent for rank
    0 and there for rank 1 (its os.path.isdir says so), then the other way round; what each
    call did."""
    cfg = rlep.parse_config(["--preset", "tiny", "--out_dir", out_dir])
    ckpt = checkpoints.checkpoint_path(os.path.join(out_dir, "phase1"), cfg.collect_step)
    d = ranks.setup_distributed()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    rows = data.read_rows(cfg.train_file)
    real_isdir = os.path.isdir
    outcomes = []
    for there_for_rank_0 in (False, True):
        seen = there_for_rank_0 if rank == 0 else not there_for_rank_0
        os.path.isdir = lambda path: seen if path == ckpt else real_isdir(path)
        try:
            rlep.collect(cfg, rows, EngineStandIn(), tokenizer, tokenizer.eos_token_id, d,
                         rlep.RunState())
            outcomes.append("returned")
        except (Reached, RunStopped) as e:
            outcomes.append(f"{type(e).__name__} {e}")
    return outcomes


def test_the_collection_starts_or_is_refused_as_rank_0_sees_the_checkpoint(
        tmp_path, tiny_model, free_port):
    out_dir = str(tmp_path / "run")
    ranks = run_on_two_ranks(collect_until_push, (out_dir, tiny_model), tmp_path, free_port)
    ckpt = checkpoints.checkpoint_path(os.path.join(out_dir, "phase1"), 4)
    # the preflight refuses this before config.json; on a filesystem the ranks see apart, the
    # collection's own guard stops both alike
    refused = f"RunStopped {ckpt}: phase one has no checkpoint at --collect_step 4"
    assert ranks[0] == ranks[1] == {"returned": [refused, "Reached "]}


def phase_two_until_train(rank, out_dir, model_path):
    """rlep.phase_two on this rank, the collected pool readable by rank 0 alone; returns the
    ids of the rows train() receives."""
    def no_reading(*args, **kwargs):
        raise AssertionError(f"rank {rank} opened the pool")
    if rank:
        data.load_pool = data.load_pool = no_reading
    trained = []
    rlep.train = lambda cfg, part, rows, *args, **kwargs: trained.append([r["id"] for r in rows])
    cfg = rlep.parse_config(["--preset", "tiny", "--out_dir", out_dir])
    d = ranks.setup_distributed()
    rlep.phase_two(cfg, None, [], EngineStandIn(), None, 0, model_path, d, [], rlep.RunState())
    return trained


def test_phase_two_reads_the_collected_pool_on_rank_0_alone(tmp_path, tiny_model, free_port):
    out_dir = tmp_path / "run"
    rows = data.read_rows("builtin:tiny:train")[:6]
    pool = [{**row, "responses": [f"Answer: {row['answer']}"]} for row in rows]
    (out_dir / "collect").mkdir(parents=True)
    data.save_pool(str(out_dir / "collect" / "pool.jsonl"), pool)
    ranks = run_on_two_ranks(phase_two_until_train, (str(out_dir), tiny_model), tmp_path,
                             free_port)
    assert ranks[0] == ranks[1] == {"returned": [[row["id"] for row in rows]]}


def exchange_a_tensor(rank):
    d = ranks.setup_distributed()
    sample = rlep.Sample([1, 2], [3, 4], True, 1.0, old_logprobs=torch.zeros(2))
    ranks.exchange([[(0, sample)], [(1, sample)]], d)
    return "returned"


def test_a_row_carrying_a_tensor_is_refused_by_the_exchange(tmp_path, free_port):
    outcomes = run_on_two_ranks(exchange_a_tensor, (), tmp_path, free_port)
    for rank in outcomes:
        assert rank["raised"] == "TypeError"
        assert rank["message"].startswith("exchange: a row carries a tensor (torch.float32, cpu)")
    # rows of plain data cross, as before
    plain = rlep.Sample([1, 2], [3, 4], True, 1.0, vllm_logprobs=[-0.5, -0.25])
    assert ranks.row_bytes([plain])


def push_weights(rank, model_path):
    """The weights an FSDP2-sharded policy pushes to a bf16 engine, and the dtypes its shards
    were gathered in."""
    d = ranks.setup_distributed()
    cfg = rlep.parse_config(["--preset", "tiny", "--dtype", "bfloat16"])
    policy, _ = rlep.build_policy(model_path, cfg, d)
    engine = vllm_engine.Engine.__new__(vllm_engine.Engine)  # what full_weights reads of one
    engine.dtype = torch.bfloat16
    engine.sleeps = True  # a GPU's push: FSDP2's parameters, each once
    gathered = []
    full_tensor = DTensor.full_tensor

    def recording(self, *args, **kwargs):
        gathered.append(str(self.dtype))
        return full_tensor(self, *args, **kwargs)
    DTensor.full_tensor = recording
    pushed = {name: tensor for name, tensor in engine.full_weights(policy.model, {})}
    reference = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    same = all(torch.equal(pushed[name], tensor.to(torch.bfloat16))
               for name, tensor in reference.state_dict().items())
    return {"gathered": sorted(set(gathered)), "same bits": same, "names": len(pushed)}


def test_a_push_gathers_shards_cast_to_the_engines_dtype(tmp_path, tiny_model, free_port):
    ranks = run_on_two_ranks(push_weights, (tiny_model,), tmp_path, free_port)
    names = len(AutoModelForCausalLM.from_pretrained(tiny_model).state_dict())
    assert ranks[0] == ranks[1] == {"returned": {"gathered": ["torch.bfloat16"],
                                                 "same bits": True, "names": names}}


# rank 1's push fails after two of its gathers, while rank 0 waits in the third; then rank 1's
# teardown never returns, as NCCL's abort can while a peer waits in a collective (pytorch#132696;
# gloo's returns at once). A driver of the test's own: rlep.py reads no fault from anywhere.
fail_in_push = """
import os, runpy, sys, time
import torch.distributed as dist
sys.path.insert(0, {repo!r})
from machinery import vllm_engine

full_weights = vllm_engine.Engine.full_weights


def failing(self, model, pushed):
    for i, item in enumerate(full_weights(self, model, pushed)):
        if os.environ["RANK"] == "1" and i == 2:
            hang = lambda *args, **kwargs: time.sleep(3600)
            vllm_engine.Engine.shutdown = dist.destroy_process_group = hang
            raise RuntimeError("injected: the push failed")
        yield item


vllm_engine.Engine.full_weights = failing
sys.argv[0] = os.path.join({repo!r}, "rlep.py")
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def descendants(pid: int, children: dict = None) -> list[int]:
    """The ids of a process's children, theirs, and so on (read from /proc)."""
    if children is None:
        children = {}
        for stat in glob.glob("/proc/[0-9]*/stat"):
            try:
                parent = int(open(stat).read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):  # a process that ended meanwhile
                continue
            children.setdefault(parent, []).append(int(stat.split("/")[2]))
    return [p for child in children.get(pid, []) for p in [child] + descendants(child, children)]


def torchrun(driver: str, tmp_path, tiny_model) -> str:
    """The driver as rlep.py on 2 gloo ranks under torchrun (the tiny preset); its stderr, once
    every rank ended; the test fails if they outlive 240 s."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = tmp_path / "driver.py"
    path.write_text(driver.format(repo=repo))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", str(path), "--preset", "tiny", "--model_path",
               tiny_model, "--cache_dir", os.path.dirname(tiny_model), "--out_dir",
               str(tmp_path / "run")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        _, err = process.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        # torchrun's workers lead sessions of their own: each is ended by its id
        for pid in descendants(process.pid) + [process.pid]:
            os.kill(pid, signal.SIGKILL)
        _, err = process.communicate()
        pytest.fail(f"the run outlived a rank's end by minutes:\n{err[-3000:]}")
    assert process.returncode != 0, err[-3000:]
    return err


def test_a_rank_failing_in_a_push_ends_every_rank_with_a_line_naming_it(tmp_path, tiny_model):
    """torchrun, 2 gloo ranks: the failing rank prints its traceback and `rlep.py: rank 1 failed:
    ...`, then ends before any teardown; torchrun then ends rank 0, which waited in a gather."""
    err = torchrun(fail_in_push, tmp_path, tiny_model)
    failed = [line for line in err.splitlines() if "rlep.py: rank" in line]
    assert failed, err[-3000:]
    assert failed[0].endswith("rlep.py: rank 1 failed: RuntimeError: injected: the push failed")


# rank 0 alone stops (its preflight's first check replaced) while rank 1 waits in a barrier that
# rank 0 never reaches; rank 0's teardown never returns, as NCCL's abort can
stop_on_rank_0 = """
import os, runpy, signal, sys, threading, time
import torch
import torch.distributed as dist
sys.path.insert(0, {{repo!r}})
from machinery import RunStopped, UserError, preflight


def check_config(cfg, world_size):
    if os.environ["RANK"] == "1":
        dist.barrier()
        raise AssertionError("rank 1 passed a barrier rank 0 never reached")
    dist.destroy_process_group = lambda *args, **kwargs: time.sleep(3600)
    print(f"rank 0 stops at {{{{time.time()}}}}", file=sys.stderr, flush=True)
    if "{kind}" == "SIGTERM":  # while rank 0 waits in a receive, in torch's C++
        threading.Timer(1, os.kill, (os.getpid(), signal.SIGTERM)).start()
        dist.recv(torch.zeros(1), src=1)
    raise {kind}("injected: rank 0 alone stops")


preflight.check_config = check_config
sys.argv[0] = os.path.join({{repo!r}}, "rlep.py")
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("kind, line", [
    ("RunStopped", "stopped: injected: rank 0 alone stops"),
    ("UserError", "stopped: injected: rank 0 alone stops"),
    ("RuntimeError", "failed: RuntimeError: injected: rank 0 alone stops"),
    ("SIGTERM", "stopped: SIGTERM")])
def test_a_stop_on_one_rank_ends_every_rank_within_a_minute_in_a_line_naming_it(
        tmp_path, tiny_model, kind, line):
    """torchrun, 2 gloo ranks: rank 0 alone stops, of each kind, while rank 1 waits in a
    barrier: rank 0 prints `rlep.py: rank 0 stopped: ...` (failed: for an error) and ends before
    any teardown, and torchrun ends rank 1, all within a minute."""
    err = torchrun(stop_on_rank_0.format(kind=kind), tmp_path, tiny_model)
    ended = time.time()
    stopped = float(re.search(r"rank 0 stops at ([\d.]+)", err).group(1))
    lines = [x for x in err.splitlines() if x.startswith("rlep.py: rank")]
    assert lines and lines[0] == f"rlep.py: rank 0 {line}", err[-3000:]
    assert ended - stopped < 60, err[-3000:]
