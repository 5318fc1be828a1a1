"""eval.py with the real vLLM engine on a tiny Qwen2 (CPU): metrics, outputs, de-duplication, bad rows, resume,
curves over checkpoints, and the baseline-vs-RLEP comparison. Run: python -m pytest -q tests/test_eval.py"""
import itertools
import json
import math
import os
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import Qwen2ForCausalLM

import eval
import rlep
import verify

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sampling = ["--k", "4", "--prompt_template", "{problem}", "--max_new_tokens", "16", "--max_prompt_len", "32",
            "--chunk_problems", "2"]


def dapo_row(problem, answer):
    return {"data_source": "math_dapo", "prompt": [{"role": "user", "content": problem}], "ability": "MATH",
            "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"}, "extra_info": {"index": 0}}


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    """sums.jsonl: 6 plain problems, 3 of them twice; dapo.parquet: 3 problems in the DAPO schema, each 3 times."""
    folder = tmp_path_factory.mktemp("data")
    sums = [{"problem": f"{a}+{b}", "answer": str(a + b)} for a, b in [(1, 2), (3, 1), (2, 2), (4, 0), (0, 3), (2, 1)]]
    (folder / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sums + sums[:3]))
    pq.write_table(pa.Table.from_pylist([dapo_row(f"{a}+{a}", str(2 * a)) for a in (1, 2, 4)] * 3),
                   folder / "dapo.parquet")
    return [str(folder / "sums.jsonl"), str(folder / "dapo.parquet")]


def data_args(data_files):
    return [arg for path in data_files for arg in ("--data", path)]


@pytest.fixture(scope="module")
def clean_run(tiny_model, data_files, tmp_path_factory):
    """The command of the README, run once, uninterrupted."""
    out = str(tmp_path_factory.mktemp("clean"))
    command = [sys.executable, "eval.py", "--model", tiny_model, *data_args(data_files), *sampling, "--out_dir", out]
    done = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done.stdout


def read_jsonl(path):
    return [json.loads(line) for line in open(path)]


def test_pass_at_k_matches_closed_form_and_enumeration():
    assert eval.pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert eval.pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert eval.pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)
    assert eval.pass_at_k(5, 4, 2) == 1.0 and eval.pass_at_k(32, 0, 8) == 0.0
    assert eval.pass_at_k(1000, 10, 64) == pytest.approx(1 - math.comb(990, 64) / math.comb(1000, 64), rel=1e-12)
    # pass@k is the share of k-subsets of the n samples that hold at least one correct sample
    verdicts = [True, False, False, True, False, False, False]
    for k in range(1, len(verdicts) + 1):
        subsets = list(itertools.combinations(verdicts, k))
        assert eval.pass_at_k(len(verdicts), sum(verdicts), k) == pytest.approx(sum(map(any, subsets)) / len(subsets))
    with pytest.raises(ValueError):
        eval.pass_at_k(4, 1, 8)


def test_cli_writes_deduplicated_samples_and_results_that_match_a_hand_count(clean_run):
    out, stdout = clean_run
    samples = read_jsonl(os.path.join(out, "samples.jsonl"))
    results = json.load(open(os.path.join(out, "results.json")))
    expected = ([("sums", p) for p in ["1+2", "3+1", "2+2", "4+0", "0+3", "2+1"]]
                + [("dapo", p) for p in ["1+1", "2+2", "4+4"]])
    assert sorted((r["benchmark"], r["problem"]) for r in samples) == sorted(expected)  # each problem once
    for r in samples:
        assert len(r["responses"]) == len(r["answers"]) == len(r["correct"]) == len(r["lengths"]) == 4
        assert r["correct"] == [verify.verify(t, r["gold"]) for t in r["responses"]]
        assert r["answers"] == [verify.extract_answer(t) for t in r["responses"]]
    assert any(c for r in samples for c in r["correct"]) and not all(c for r in samples for c in r["correct"])
    for name in ("sums", "dapo"):
        rows = [r for r in samples if r["benchmark"] == name]
        verdicts = [c for r in rows for c in r["correct"]]
        assert results[name]["avg@4"] == pytest.approx(sum(verdicts) / len(verdicts))
        for k in (1, 2, 4):
            by_hand = [1 - math.comb(4 - sum(r["correct"]), k) / math.comb(4, k) for r in rows]
            assert results[name][f"pass@{k}"] == pytest.approx(sum(by_hand) / len(rows))
        lengths = [n for r in rows for n in r["lengths"]]
        assert results[name]["mean_length"] == pytest.approx(sum(lengths) / len(lengths))
        no_answer = sum(a is None for r in rows for a in r["answers"])
        assert results[name]["no_answer"] == pytest.approx(no_answer / len(lengths))
        assert f"| {name} | {len(rows)} | {100 * results[name]['avg@4']:.1f} |" in stdout


def test_resume_after_a_kill_samples_only_the_rest_and_matches_a_clean_run(clean_run, tiny_model, data_files,
                                                                           tmp_path, monkeypatch):
    clean_out, _ = clean_run
    lines = open(os.path.join(clean_out, "samples.jsonl")).readlines()
    # a run killed while writing its fourth problem: three whole lines and a torn one
    (tmp_path / "samples.jsonl").write_text("".join(lines[:3]) + lines[3][:len(lines[3]) // 2])
    shutil.copy(os.path.join(clean_out, "settings.json"), tmp_path)
    sampled = []

    def spy(llm, tokenizer, rows, *args, **kwargs):
        sampled.extend(row["problem"] for row in rows)
        return real_sample_and_grade(llm, tokenizer, rows, *args, **kwargs)

    real_sample_and_grade = rlep.sample_and_grade
    monkeypatch.setattr(rlep, "sample_and_grade", spy)
    eval.main(["--model", tiny_model, *data_args(data_files), *sampling, "--out_dir", str(tmp_path)])
    assert len(sampled) == len(lines) - 3
    resumed = read_jsonl(tmp_path / "samples.jsonl")
    key = lambda r: (r["benchmark"], r["id"])
    assert sorted(map(key, resumed)) == sorted(map(key, read_jsonl(os.path.join(clean_out, "samples.jsonl"))))
    # per-problem seeds: the resumed run draws exactly the samples of the uninterrupted one
    assert sorted(resumed, key=key) == sorted(map(json.loads, lines), key=key)
    assert json.load(open(tmp_path / "results.json")) == json.load(open(os.path.join(clean_out, "results.json")))


def test_several_checkpoints_give_one_folder_each_and_a_curve(clean_run, tiny_model, data_files, tmp_path, capsys):
    run_dir, out = tmp_path / "run", tmp_path / "eval"
    perturbed = Qwen2ForCausalLM.from_pretrained(tiny_model)
    with torch.no_grad():
        perturbed.lm_head.weight.add_(torch.randn_like(perturbed.lm_head.weight))
    shutil.copytree(tiny_model, run_dir / "phase1" / "step_000002")
    perturbed.save_pretrained(run_dir / "phase1" / "step_000002")  # other weights, same tokenizer
    shutil.copytree(tiny_model, run_dir / "phase2" / "step_000004")
    shutil.copytree(tiny_model, run_dir / "phase1" / "step_000006.tmp")  # a crashed save: not a checkpoint
    # step 2 builds the engine; step 4 reuses it with its own weights loaded
    eval.main(["--run_dir", str(run_dir), *data_args(data_files), *sampling, "--out_dir", str(out)])
    with open(out / "curve.csv") as f:
        header, *rows = [line.strip().split(",") for line in f]
    assert header[:2] == ["phase", "step"] and header[3:] == ["sums avg@4", "dapo avg@4"]
    assert [(r[0], int(r[1])) for r in rows] == [("phase1", 2), ("phase2", 4)]
    for (phase, step), row in zip([("phase1", 2), ("phase2", 4)], rows):
        results = json.load(open(out / phase / f"step_{step:06d}" / "results.json"))
        assert [float(v) for v in row[3:]] == [results["sums"]["avg@4"], results["dapo"]["avg@4"]]
    clean = read_jsonl(os.path.join(clean_run[0], "samples.jsonl"))
    key = lambda r: (r["benchmark"], r["id"])
    assert sorted(read_jsonl(out / "phase2" / "step_000004" / "samples.jsonl"), key=key) == sorted(clean, key=key)
    assert sorted(read_jsonl(out / "phase1" / "step_000002" / "samples.jsonl"), key=key) != sorted(clean, key=key)
    printed = capsys.readouterr().out
    assert os.path.isfile(out / "curve.png") or "matplotlib is not installed" in printed


@pytest.mark.parametrize("content, message", [
    ('{"problem": "1+1", "answer": "2"}\n{"problem": "2+2"}\n', r"bad.jsonl: row 2: missing 'answer'"),
    ('{"problem": "1+1", "answer": "2"}\n{"problem": \n', r"bad.jsonl: row 2: not valid JSON"),
])
def test_bad_rows_stop_with_file_row_and_reason(tmp_path, tiny_model, content, message):
    (tmp_path / "bad.jsonl").write_text(content)
    with pytest.raises(SystemExit, match=message):
        eval.main(["--model", tiny_model, "--data", str(tmp_path / "bad.jsonl"), "--out_dir", str(tmp_path)])
    with pytest.raises(SystemExit, match="nope.jsonl: no such data file"):
        eval.main(["--model", tiny_model, "--data", str(tmp_path / "nope.jsonl")])


def test_other_settings_refuse_to_resume_and_new_tokens_fit_the_context(clean_run, tiny_model, data_files, tmp_path):
    shutil.copytree(clean_run[0], tmp_path / "out")
    args = eval.parse_args(["--model", tiny_model, *data_args(data_files), *sampling, "--k", "8", "--out_dir",
                            str(tmp_path / "out")])
    with pytest.raises(ValueError, match=r"other settings \(k\)"):
        eval.evaluate(tiny_model, eval.load_benchmarks(args.data), args, rlep.setup_distributed(), args.out_dir)
    for prompt_len, expected in ((64, (64, 512 - 64)), (1024, (256, 256))):  # the tiny model's context: 512
        args = eval.parse_args(["--model", tiny_model, "--data", "x.jsonl", "--max_prompt_len", str(prompt_len)])
        cfg = eval.make_config(args, tiny_model, rlep.setup_distributed())
        assert (cfg.max_prompt_len, cfg.max_response_len) == expected


def write_metrics(path, val_accs, every=5):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rows = [{"step": 0, "val_acc": val_accs[0]}]
    for step in range(1, every * (len(val_accs) - 1) + 1):
        validated = {"val_acc": val_accs[step // every]} if step % every == 0 else {}
        rows.append({"step": step, "reward_mean": 0.0} | validated)
    open(path, "w").write("".join(json.dumps(r) + "\n" for r in rows))


def test_compare_phases_reports_peaks_catch_up_and_finals(tmp_path, capsys):
    write_metrics(tmp_path / "seed1" / "phase1" / "metrics.jsonl", [0.10, 0.20, 0.35, 0.30, 0.32])
    write_metrics(tmp_path / "seed1" / "phase2" / "metrics.jsonl", [0.10, 0.30, 0.36, 0.40, 0.38])
    (tmp_path / "seed1" / "config.json").write_text(json.dumps({"seed": 1}))
    write_metrics(tmp_path / "seed2" / "phase1" / "metrics.jsonl", [0.10, 0.50, 0.40])
    write_metrics(tmp_path / "seed2" / "phase2" / "metrics.jsonl", [0.10, 0.45, 0.45])
    runs = [str(tmp_path / "seed1"), str(tmp_path / "seed2")]
    table = eval.compare_phases(runs, str(tmp_path / "compare.png"))
    assert "| seed1 (seed 1) | 35.0 (step 10) | step 10 | 40.0 (step 15) | 32.0 (step 20) | 38.0 (step 20) |" in table
    assert "| seed2 | 50.0 (step 5) | never | 45.0 (step 5) | 40.0 (step 10) | 45.0 (step 10) |" in table
    assert os.path.isfile(tmp_path / "compare.png") or "matplotlib is not installed" in table
    eval.main(["--compare", *runs, "--out_dir", str(tmp_path)])
    assert table in capsys.readouterr().out
    with pytest.raises(ValueError, match="no val_acc"):
        eval.compare_phases([str(tmp_path / "empty")], str(tmp_path / "x.png"))
