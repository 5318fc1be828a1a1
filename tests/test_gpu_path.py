"""The GPU branch of the colocated engine, run on the CPU: a stand-in with vLLM 0.33's sleep
semantics wraps the real vLLM-CPU engine (a level-2 sleep overwrites every engine weight with
noise; generating or loading weights while asleep fails, where the GPU would hang or keep
garbage), and the tiny preset trains through the exact GPU call sequence: sleep, wake the weights,
push, wake the KV cache, generate. Run: python -m pytest -q tests/test_gpu_path.py"""
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from machinery import data, ranks, vllm_engine
import rlep


class SleepingLLM:
    """vLLM 0.33's sleep/wake on a GPU, around a real CPU engine (docs/gpu.md: vLLM 0.33)."""

    def __init__(self, llm):
        self.llm = llm
        self.asleep = set()
        self.calls = []
        outer = self

        class EngineProxy:
            model_config = llm.llm_engine.model_config
            vllm_config = llm.llm_engine.vllm_config

            def is_sleeping(self):
                return bool(outer.asleep)

            class engine_core:
                @staticmethod
                def shutdown():
                    outer.calls.append(f"shutdown (asleep: {sorted(outer.asleep)})")
        self.llm_engine = EngineProxy()

    def sleep(self, level):
        self.calls.append(f"sleep {level}")
        # freed memory: garbage
        self.llm.apply_model(lambda model: [p.data.normal_() for p in model.parameters()])
        self.asleep = {"weights", "kv_cache"}

    def wake_up(self, tags=None):
        self.calls.append(f"wake {','.join(tags or ['all'])}")
        self.asleep -= set(tags or self.asleep)

    def collective_rpc(self, method, kwargs=None):
        self.calls.append(method)
        if "weights" in self.asleep:
            raise RuntimeError("reload_weights into sleeping weights")
        return self.llm.collective_rpc(method, kwargs=kwargs)

    def generate(self, *args, **kwargs):
        self.calls.append("generate")
        if self.asleep:
            raise AssertionError("vLLM would wait forever: "
                                 "the engine's guard should have stopped this")
        return self.llm.generate(*args, **kwargs)

    def __getattr__(self, name):  # apply_model, reset_prefix_cache
        return getattr(self.llm, name)


@pytest.fixture
def sleeping(tiny_engine):
    return vllm_engine.Engine(SleepingLLM(tiny_engine.llm), sleeps=True)


def test_training_through_the_gpu_call_sequence_keeps_the_logprob_gap_at_float32_level(
        sleeping, tiny_model, tmp_path):
    cfg = rlep.parse_config(["--preset", "tiny", "--out_dir", str(tmp_path), "--val_every", "2",
                             "--save_every", "9"])
    cfg.phase1_steps = 3
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    d = ranks.setup_distributed()
    rows = data.read_rows(cfg.train_file)
    val_rows = data.read_rows(cfg.val_file)[:8]
    sleeping.sleep()  # as main() does: the trainer gets the memory first
    rlep.train(cfg, "phase1", rows, sleeping, tokenizer, tokenizer.eos_token_id, tiny_model, d,
               val_rows, rlep.RunState())
    calls = sleeping.llm.calls
    push = ["wake weights", "reload_weights", "wake kv_cache"]
    assert calls[:4] == ["sleep 2"] + push  # the first push wakes the engine
    # each step: generate, sleep, train, push
    steps = [i for i, call in enumerate(calls) if call == "sleep 2"][1:]
    assert len(steps) == 4 and all(calls[i - 1] == "generate" and calls[i + 1:i + 4] == push
                                   for i in steps[:3])
    metrics = [json.loads(line) for line in open(tmp_path / "phase1" / "metrics.jsonl")]
    assert [m["step"] for m in metrics] == [0, 1, 2, 3] and 0 <= metrics[2]["val_acc"] <= 1
    # every push reached the noisy engine
    assert all(0 <= m["logprob_gap_max"] < 1e-4 for m in metrics[1:])
    assert not sleeping.llm.asleep or calls[-1] == "sleep 2"


def test_a_push_that_misses_a_parameter_fails_loudly(sleeping, tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)

    class Skipping(torch.nn.Module):  # e.g. a parameter the trainer renamed or did not own
        def named_parameters(self):  # what a GPU's push reads (vllm_engine.full_weights)
            return [(k, v) for k, v in model.named_parameters() if k != "model.norm.weight"]
    sleeping.sleep()
    with pytest.raises(RuntimeError, match=r"in model\.norm\.weight: a parameter the push missed"):
        sleeping.push(Skipping())
    sleeping.llm.wake_up()
    sleeping.push(model)  # a whole push passes


def test_generate_while_asleep_raises_and_shutdown_does_not_wake(sleeping, tiny_model):
    sleeping.sleep()
    with pytest.raises(RuntimeError, match="asleep"):
        sleeping.generate([[1, 2, 3]], 1, 1.0, 1.0, 4, [], [0])
    sleeping.llm.wake_up(["weights"])  # half awake is still asleep
    with pytest.raises(RuntimeError, match="asleep"):
        sleeping.generate([[1, 2, 3]], 1, 1.0, 1.0, 4, [], [0])
    # after a trainer's out-of-memory error a wake would ask for the memory again
    sleeping.shutdown()
    assert sleeping.llm.calls[-2:] == ["wake weights", "shutdown (asleep: ['kv_cache'])"]
    # leave the engine sane
    sleeping.push(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32))


@pytest.mark.parametrize("fails", [False, True], ids=["normal end", "trainer error"])
def test_main_wakes_the_engine_before_shutdown_at_a_normal_end_and_not_after_an_error(
        sleeping, tiny_model, tmp_path, monkeypatch, fails):
    """A run that ends well wakes the engine, then shuts it down: vLLM's shutdown frees the
    weights and KV cache, and freeing what a sleep unmapped prints CUDA errors. After a trainer's
    error it shuts down asleep: a wake would ask for the memory again."""
    monkeypatch.setattr(rlep, "build_engine", lambda *args: sleeping)
    if fails:
        def out_of_memory(*args, **kwargs):
            raise torch.OutOfMemoryError("CUDA out of memory (a stand-in)")
        monkeypatch.setattr(rlep, "ppo_update", out_of_memory)
    argv = ["--preset", "tiny", "--model_path", tiny_model, "--out_dir", str(tmp_path / "run"),
            "--phase", "1", "--phase1_steps", "1", "--val_every", "0", "--save_every", "1"]
    if fails:
        with pytest.raises(torch.OutOfMemoryError):
            rlep.main(argv)
    else:
        rlep.main(argv)
    calls = sleeping.llm.calls
    last_sleep = len(calls) - 1 - calls[::-1].index("sleep 2")
    after = ["shutdown (asleep: ['kv_cache', 'weights'])"] if fails else [
        "wake all", "shutdown (asleep: [])"]
    assert calls[last_sleep + 1:] == after


def test_the_gpu_smoke_run_in_its_tiny_form_goes_through_the_whole_gpu_path(
        sleeping, tiny_model, tmp_path, monkeypatch):
    """docs/gpu.md's smoke run (phase one and a save in one process; the resume, the collection
    and phase two in a second), on the tiny preset through the GPU's call sequence: every push
    wakes the engine from a level-2 sleep, the collection's checkpoint is read into it while its
    weights sleep no more, phase two replays, and each process ends awake before its shutdown."""
    monkeypatch.setattr(rlep, "build_engine", lambda *args: sleeping)
    out = tmp_path / "smoke"
    smoke = ["--preset", "tiny", "--model_path", tiny_model, "--out_dir", str(out),
             "--phase1_steps", "2", "--collect_step", "2", "--phase2_steps", "2",
             "--val_every", "2", "--val_k", "1", "--save_every", "2"]
    rlep.main(smoke + ["--phase", "1"])
    assert not (out / "collect").exists() and (out / "phase1" / "step_000002").is_dir()
    calls = sleeping.llm.calls
    first = len(calls)
    assert calls[-2:] == ["wake all", "shutdown (asleep: [])"]
    rlep.main(smoke + ["--resume"])
    second = calls[first:]
    push = ["wake weights", "reload_weights", "wake kv_cache"]
    # the resume's first push is the collection's checkpoint, read from disk into a sleeping engine
    assert second[:4] == ["sleep 2"] + push
    assert second[-2:] == ["wake all", "shutdown (asleep: [])"]
    phase2 = [json.loads(line) for line in open(out / "phase2" / "metrics.jsonl")]
    assert [m["step"] for m in phase2] == [0, 1, 2]
    assert all(m["replay_frac"] > 0 and m["logprob_gap_max"] < 1e-4 for m in phase2[1:])
    assert (out / "collect" / "pool.jsonl").is_file() and (out / "phase2" / "step_000002").is_dir()
