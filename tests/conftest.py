"""Environment for the tests: set before torch is imported. vLLM runs in-process on the CPU.

The runs several tests read are made once a session, here: the tiny preset's uninterrupted run
(`tiny_run`) and its 2-rank run (`two_rank_run`), each watched for a refusal after config.json
(tests/test_rlep.py's watcher).
Their folders are shared read-only (checked at the session's end): a test that changes a run
copies it first. `pytest -m quick` runs the method's tests that start no vLLM engine and no run
(the files and tests named in `quick`, below)."""
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


def made_once(tmp_path_factory, name, make):
    """The folder `name`, made by make(folder) once a test session: under pytest-xdist by the
    first worker to ask, in the workers' shared folder, while the others wait."""
    from filelock import FileLock
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder = base / name
    with FileLock(str(base / f"{name}.lock")):
        if not (base / f"{name}.made").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            (base / f"{name}.made").touch()
    return folder


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """The tiny preset's model, built once per test session (5 s) into a temporary cache."""
    from machinery import hub
    cache = made_once(tmp_path_factory, "cache", lambda f: hub.model_folder("builtin:tiny", str(f)))
    return hub.model_folder("builtin:tiny", str(cache))


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory):
    """A cache holding the cpu preset's SmolLM2-135M-Instruct, made from the PyPI package's GGUF
    once per session (15 s)."""
    from machinery import hub
    return made_once(tmp_path_factory, "smollm2_cache",
                     lambda f: hub.model_folder("builtin:smollm2", str(f)))


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


def shared_run(tmp_path_factory, tiny_model, name, *flags, nproc=1):
    """A watched `rlep.py --preset tiny` run made once: its folder, its stdout beside it in
    stdout.txt; at the session's end its folder must be as it was made."""
    from test_rlep import run_rlep, watched_env

    def make(folder):
        out = folder / "run"
        result = run_rlep(out, os.path.dirname(tiny_model), *flags, nproc=nproc,
                          env=watched_env(folder, out))
        (folder / "stdout.txt").write_text(result.stdout)
    out = made_once(tmp_path_factory, name, make) / "run"
    made = digest(out)
    yield out
    assert digest(out) == made, f"a test changed the shared run {out}: copy it first"


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, tiny_model):
    """One uninterrupted `python rlep.py --preset tiny`: phase one, collection, phase two."""
    yield from shared_run(tmp_path_factory, tiny_model, "tiny_run")


@pytest.fixture(scope="session")
def two_rank_run(tmp_path_factory, tiny_model):
    """`torchrun --nproc_per_node=2 rlep.py --preset tiny`, with the GPU preset's layout (one row
    per response)."""
    yield from shared_run(tmp_path_factory, tiny_model, "two_rank_run", "--no-share_prompts",
                          nproc=2)


# -----------------------------------------------------------------------------------------
# The quick tier: the method's tests (the loss, the advantages, the reward, replays, the planner,
# the verifier, the checks of the command line and of rows), none starting vLLM, a run or ranks:
# the files named here, less the tests listed with each.
quick = {
    "test_loss.py": set(), "test_paper.py": set(), "test_planner.py": set(),
    "test_verify.py": set(), "test_data.py": set(),
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

    from machinery import vllm_engine

    def no_engine(*args, **kwargs):
        pytest.fail("a quick test started a vLLM engine")
    monkeypatch.setattr(vllm_engine, "start", no_engine)
    monkeypatch.setattr(torch.multiprocessing, "spawn",
                        lambda *args, **kwargs: pytest.fail("a quick test spawned ranks"))
    popen = subprocess.Popen.__init__

    def no_run(self, args, *rest, **kwargs):
        words = [str(a) for a in ([args] if isinstance(args, (str, bytes)) else args)]
        if any(w.endswith(("rlep.py", "eval.py", "torch.distributed.run")) for w in words):
            pytest.fail(f"a quick test started a run: {words}")
        popen(self, args, *rest, **kwargs)
    monkeypatch.setattr(subprocess.Popen, "__init__", no_run)
