"""Data loading, prompts, config parsing, replay draws and log-probs, without vLLM.
Run: python -m pytest -q tests/test_data.py"""
import dataclasses
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from machinery import UserError, data, fsdp, preflight
import rlep


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def dapo_row(problem, answer, candidates=None):
    reward_model = {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"}
    if candidates is not None:
        reward_model["candidates"] = candidates
    prompt = [{"role": "user", "content": problem}]
    return {"data_source": "math_dapo", "prompt": prompt, "ability": "MATH",
            "reward_model": reward_model, "extra_info": {"index": "x"}}


def test_reads_plain_and_dapo_rows_and_deduplicates(tmp_path):
    rows = data.read_rows(write_jsonl(tmp_path / "a.jsonl", [{"problem": "1+1?", "answer": "2"},
                                                              {"problem": "1+1?", "answer": "2"},
                                                              {"problem": "2+2?", "answer": 4}]))
    assert [(r["problem"], r["answer"]) for r in rows] == [("1+1?", "2"), ("2+2?", "4")]
    table = pa.Table.from_pylist([dapo_row("What is 3+4?", "7", ["Answer: 7", "so 7"]),
                                  dapo_row("What is 3+4?", "7"),
                                  dapo_row("What is 5+4?", "9")])
    pq.write_table(table, tmp_path / "d.parquet")
    rows = data.read_rows(str(tmp_path / "d.parquet"))
    assert len(rows) == 2
    assert rows[0]["prompt"] == [{"role": "user", "content": "What is 3+4?"}]
    assert rows[0]["answer"] == "7" and rows[0]["responses"] == ["Answer: 7", "so 7"]
    assert rows[0]["id"] != rows[1]["id"]
    assert [r["id"] for r in data.load_pool(str(tmp_path / "d.parquet"))] == [rows[0]["id"]]


@pytest.mark.parametrize("bad, message", [
    ({"problem": "1+1?"}, "row 2: missing 'answer'"),
    ({"answer": "3"}, "row 2: missing 'problem'"),
    ({"prompt": "not a list", "reward_model": {"ground_truth": "1"}}, "row 2: 'prompt' must be"),
    ({"prompt": [{"role": "user", "content": "q"}], "reward_model": {}},
     "row 2: missing 'reward_model.ground_truth'"),
    ({"problem": "q", "answer": "1", "responses": "Answer: 1"},
     "row 2: responses/candidates must be"),
])
def test_bad_rows_stop_with_file_row_and_field(tmp_path, bad, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"problem": "ok", "answer": "1"}, bad])
    with pytest.raises(ValueError, match=message) as info:
        data.read_rows(path)
    assert "bad.jsonl" in str(info.value)


def test_bad_json_and_missing_files(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"problem": "a", "answer": "1"}\n{"problem": \n')
    with pytest.raises(ValueError, match=r"broken.jsonl: row 2: not valid JSON"):
        data.read_rows(str(path))
    with pytest.raises(UserError, match="nope.jsonl: no such data file"):
        data.read_rows(str(tmp_path / "nope.jsonl"))
    # a pool is read whole: a row of ours without responses is named, not dropped
    rows = [{"problem": "a", "answer": "1", "responses": ["Answer: 1"]},
            {"problem": "b", "answer": "2"}]
    with pytest.raises(UserError, match=r"p.jsonl: row 2: no 'responses'"):
        data.load_pool(write_jsonl(tmp_path / "p.jsonl", rows))
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"problem": "a", "answer": "1"}\n{"problem": "caf\xe9", "answer": "1"}\n')
    with pytest.raises(UserError, match=r"latin1.jsonl: row 2: not UTF-8 \(byte 0xe9 at "
                       r"offset 16\)"):
        data.read_rows(str(path))


def test_pool_round_trip(tmp_path):
    rows = [{"id": "a", "problem": "1+1?", "answer": "2",
             "responses": ["Answer: 2", "1+1=2\nAnswer: 2"]},
            {"id": "b", "problem": "q", "answer": "3", "responses": ["Answer: 3", "Answer: 3"],
             "prompt": [{"role": "user", "content": "q"}]}]
    path = str(tmp_path / "pool.jsonl")
    data.save_pool(path, rows)
    assert data.load_pool(path) == rows


def test_replay_draws_are_without_replacement_and_take_all_when_few():
    pool = [f"answer {i}" for i in range(10)]
    rng = np.random.default_rng(0)
    draws = [rlep.draw_replays(pool, 2, rng) for _ in range(200)]
    assert all(len(d) == 2 and len(set(d)) == 2 and set(d) <= set(pool) for d in draws)
    assert len({tuple(d) for d in draws}) > 20  # drawn anew each time
    assert rlep.draw_replays(["a", "b"], 2, rng) == ["a", "b"]
    assert rlep.draw_replays(["a"], 2, rng) == ["a"]


def test_step_prompts_cover_each_epoch_once():
    seen = [i for step in range(5) for i in rlep.step_prompts(10, 2, step, seed=3)]
    assert sorted(seen) == list(range(10))
    second_epoch = [i for step in range(5, 10) for i in rlep.step_prompts(10, 2, step, seed=3)]
    # a fresh order each epoch
    assert sorted(second_epoch) == list(range(10)) and second_epoch != seen
    assert rlep.step_prompts(10, 2, 7, seed=3) == rlep.step_prompts(10, 2, 7, seed=3)


def test_train_prompts_is_a_fixed_subset_in_file_order_nested_and_the_same_for_any_order():
    rows = [{"id": f"p{i}", "problem": f"{i} + 1", "answer": str(i + 1)} for i in range(50)]
    assert rlep.training_prompts(rows, 0) is rows  # the paper's: all of D
    ten = rlep.training_prompts(rows, 10)
    assert len(ten) == 10 and ten == [row for row in rows if row in ten]  # in file order
    # the same prompts whatever the file's order; a smaller subset inside a larger one
    assert sorted(r["id"] for r in rlep.training_prompts(rows[::-1], 10)) == \
        sorted(r["id"] for r in ten)
    assert all(row in rlep.training_prompts(rows, 20) for row in ten)
    assert ten != rows[:10]  # chosen by the ids' hash, not the first rows
    assert rlep.training_prompts([], 10) == []  # phase two on a pool reads no training rows
    with pytest.raises(UserError, match="--train_prompts 51: the training file holds 50"):
        rlep.training_prompts(rows, 51)


def test_config_presets_and_overrides():
    cfg = rlep.parse_config(["--preset", "paper"])
    assert ((cfg.prompts_per_step, cfg.n, cfg.replay_m, cfg.lr, cfg.clip_high)
            == (512, 16, 2, 1e-6, 0.28))
    cfg = rlep.parse_config(["--preset", "tiny", "--lr", "0.5", "--no-gradient_checkpointing",
                             "--n", "3"])
    assert (cfg.preset, cfg.lr, cfg.gradient_checkpointing, cfg.n) == ("tiny", 0.5, False, 3)
    assert rlep.parse_config([]).preset == "cpu"
    with pytest.raises(SystemExit):
        rlep.parse_config(["--preset", "nope"])


def test_on_a_gpu_a_command_without_a_preset_is_refused_naming_the_gpu_presets(monkeypatch,
                                                                              capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit) as exit_code:
        rlep.parse_config(["--lr", "1e-6"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_code.value.code == 2 and len(lines) == 1
    assert all(f"--preset {name}" in lines[0] for name in ("gpu", "node", "paper"))
    # a preset chosen is taken, a CPU one too
    assert rlep.parse_config(["--preset", "tiny"]).preset == "tiny"


def test_every_flag_has_its_fields_help_and_its_choices_are_enforced(capsys):
    flags = dict(preflight.dataclass_flags(rlep.Config))
    assert list(flags) == [field.name for field in dataclasses.fields(rlep.Config)]
    assert all(flag["help"].strip() for flag in flags.values())
    choices = {name: flag["choices"] for name, flag in flags.items() if "choices" in flag}
    assert choices == {"phase1_prompts": ["all", "pool"], "phase2_prompts": ["pool", "all"],
                       "replay_loss": ["group", "nll"], "verify_mode": ["dapo", "equivalence"],
                       "phase": ["all", "1", "collect", "2"],
                       "dtype": ["auto", "float32", "bfloat16"],
                       "preset": ["paper", "node", "gpu", "tiny", "cpu", "cpu-hard"]}
    assert set(choices["preset"]) == set(rlep.presets)
    for name, values in choices.items():
        assert getattr(rlep.Config, name) in values
        for value in values:
            assert getattr(rlep.parse_config([f"--{name}", value]), name) == value
        with pytest.raises(SystemExit):
            rlep.parse_config([f"--{name}", "nope"])
    with pytest.raises(SystemExit):
        rlep.parse_config(["--help"])
    shown = capsys.readouterr().out
    assert all(f"--{name}" in shown for name in flags) and "{group,nll}" in shown


@pytest.mark.parametrize("share_prompts", [False, True])
def test_token_logprobs_match_a_direct_forward(share_prompts):
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=50, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                         attn_implementation="sdpa")
    model = Qwen2ForCausalLM(config).eval()
    # two responses share the first prompt: with share_prompts they sit in one row behind a
    # block-causal mask
    samples = [rlep.Sample([1, 2, 3], [4, 5], False, 0.0),
               rlep.Sample([6, 7], [8, 9, 10, 11], False, 0.0),
               rlep.Sample([1, 2, 3], [12, 13, 14], False, 0.0)]
    batch = rlep.collate(samples, pad_id=0, device="cpu", share_prompts=share_prompts)
    assert batch["input_ids"].shape[0] == (2 if share_prompts else 3)
    logps = rlep.TokenLogProbs(model, temperature=0.7, chunk_tokens=2)(batch)  # (B, T)
    assert logps.shape == (3, 4)
    for i, s in enumerate(samples):
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        all_logprobs = torch.log_softmax(model(ids).logits[0, :-1] / 0.7, -1)
        ref = all_logprobs.gather(-1, ids[0, 1:, None])[:, 0]
        assert torch.allclose(logps[i, :len(s.completion_ids)], ref[len(s.prompt_ids) - 1:],
                              atol=1e-5)
    assert (logps[batch["completion_mask"] == 0] == 0).all()


def test_compute_dtype_is_the_faster_one_measured_here(monkeypatch, tiny_model):
    cpu = torch.device("cpu")
    # --dtype always wins; a GPU takes bf16 without a measurement
    assert fsdp.resolve_dtype("float32", torch.device("cuda"), tiny_model).dtype == "float32"
    gpu = fsdp.resolve_dtype("auto", torch.device("cuda"), tiny_model)
    assert gpu.dtype == "bfloat16" and gpu.gflops == {}
    # the real measurement: both speeds positive, the choice follows them
    real = fsdp.resolve_dtype("auto", cpu, tiny_model)
    assert set(real.gflops) == {"float32", "bfloat16"} and min(real.gflops.values()) > 0
    faster = real.gflops["bfloat16"] >= 1.5 * real.gflops["float32"]
    assert real.dtype == ("bfloat16" if faster else "float32")
    assert "measured here" in real.why
    # bf16 only where it pays: 1.5x the float32 speed
    for bf16_speed, expected in ((100.0, "float32"), (149.0, "float32"), (150.0, "bfloat16")):
        speeds = {"float32": 100.0, "bfloat16": bf16_speed}
        monkeypatch.setattr(fsdp, "linear_gflops", lambda name, path: speeds[name])
        choice = fsdp.resolve_dtype("auto", cpu, tiny_model)
        assert choice.dtype == expected and str(int(bf16_speed)) in choice.why


def test_paper_preset_grades_with_the_paper_rule(tiny_model):
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    paper = rlep.parse_config(["--preset", "paper"])
    cpu = rlep.parse_config(["--preset", "cpu"])
    assert paper.verify_mode == "dapo" and cpu.verify_mode == "equivalence"
    assert (rlep.parse_config(["--preset", "paper", "--verify_mode", "equivalence"]).verify_mode
            == "equivalence")
    row = {"id": "q", "problem": "3+4", "answer": "7"}
    prompt = tokenizer("3+4")["input_ids"]
    boxed = tokenizer("so \\boxed{7}")["input_ids"]
    answer_line = tokenizer("Answer: 7")["input_ids"]
    for cfg, expected in ((paper, [-1.0, 1.0]), (cpu, [1.0, 1.0])):
        cfg.overlong_buffer = 0
        group = rlep.build_group(row, prompt, [(boxed, None), (answer_line, None)], tokenizer, cfg,
                                 tokenizer.eos_token_id)
        assert [s.reward for s in group] == expected
