"""eval.py with the real vLLM engine on a tiny Qwen2 (CPU): metrics under both grading rules,
outputs, de-duplication, bad rows, resume, curves over checkpoints, and the baseline-vs-RLEP
comparison. Run: python -m pytest -q tests/test_eval.py"""
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
from transformers import AutoConfig, Qwen2ForCausalLM

from machinery import UserError, checkpoints, ranks, report
import eval
import rlep
import verify

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sampling = ["--k", "4", "--prompt_template", "{problem}", "--max_new_tokens", "16",
            "--max_prompt_len", "32", "--chunk_problems", "2"]


def dapo_row(problem, answer):
    return {"data_source": "math_dapo",
            "prompt": [{"role": "user", "content": problem}],
            "ability": "MATH",
            "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": 0}}


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    """sums.jsonl: 6 plain problems, 3 of them twice; doubles.parquet: 3 problems in the DAPO
    schema, each 3 times, with golds written 2.0, 4.0, 8.0: equal to the tiny model's "Answer: 4",
    but not the same string."""
    folder = tmp_path_factory.mktemp("data")
    terms = [(1, 2), (3, 1), (2, 2), (4, 0), (0, 3), (2, 1)]
    sums = [{"problem": f"{a}+{b}", "answer": str(a + b)} for a, b in terms]
    (folder / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sums + sums[:3]))
    doubles = [dapo_row(f"{a}+{a}", f"{2 * a}.0") for a in (1, 2, 4)] * 3
    pq.write_table(pa.Table.from_pylist(doubles), folder / "doubles.parquet")
    return [str(folder / "sums.jsonl"), str(folder / "doubles.parquet")]


def data_args(data_files):
    return [arg for path in data_files for arg in ("--data", path)]


@pytest.fixture(scope="module")
def clean_run(tiny_model, data_files, tmp_path_factory):
    """The command of docs/reference.md (eval.py), run once, uninterrupted."""
    out = str(tmp_path_factory.mktemp("clean"))
    command = [sys.executable, "eval.py", "--model", tiny_model, *data_args(data_files), *sampling,
               "--out_dir", out]
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
    assert eval.pass_at_k(1000, 10, 64) == pytest.approx(
        1 - math.comb(990, 64) / math.comb(1000, 64), rel=1e-12)
    # pass@k is the share of k-subsets of the n samples that hold at least one correct sample
    verdicts = [True, False, False, True, False, False, False]
    for k in range(1, len(verdicts) + 1):
        subsets = list(itertools.combinations(verdicts, k))
        assert eval.pass_at_k(len(verdicts), sum(verdicts), k) == pytest.approx(
            sum(map(any, subsets)) / len(subsets))
    with pytest.raises(ValueError):
        eval.pass_at_k(4, 1, 8)


def test_cli_grades_with_both_rules_and_results_match_a_hand_count(clean_run):
    out, stdout = clean_run
    samples = read_jsonl(os.path.join(out, "samples.jsonl"))
    results = json.load(open(os.path.join(out, "results.json")))
    expected = ([("sums", p) for p in ["1+2", "3+1", "2+2", "4+0", "0+3", "2+1"]]
                + [("doubles", p) for p in ["1+1", "2+2", "4+4"]])
    # each problem once
    assert sorted((r["benchmark"], r["problem"]) for r in samples) == sorted(expected)
    for r in samples:
        assert sorted(r["correct"]) == ["dapo", "equivalence"]
        assert len(r["responses"]) == len(r["answers"]) == len(r["lengths"]) == 4
        assert r["correct"]["dapo"] == [verify.verify(t, r["gold"], mode="dapo")
                                        for t in r["responses"]]
        assert r["correct"]["equivalence"] == [verify.verify(t, r["gold"])
                                               for t in r["responses"]]
        assert r["answers"] == [verify.extract_answer(t) for t in r["responses"]]
    # (the paper's verdict, the equivalence checker's) of every sample, per benchmark
    verdicts = {name: [(p, q) for r in samples if r["benchmark"] == name
                       for p, q in zip(r["correct"]["dapo"], r["correct"]["equivalence"])]
                for name in ("sums", "doubles")}
    # "Answer: 3" for 3
    assert any(p for p, _ in verdicts["sums"]) and not all(q for _, q in verdicts["sums"])
    # "Answer: 4" for 4.0: only the equivalence checker
    assert any(q and not p for p, q in verdicts["doubles"])
    for name in ("sums", "doubles"):
        rows = [r for r in samples if r["benchmark"] == name]
        assert results[name]["problems"] == len(rows) and results[name]["samples_per_problem"] == 4
        for rule, label in (("dapo", "paper (dapo)"), ("equivalence", "equivalence")):
            verdicts = [c for r in rows for c in r["correct"][rule]]
            assert results[name][rule]["avg@4"] == pytest.approx(sum(verdicts) / len(verdicts))
            for k in (1, 2, 4):
                by_hand = [1 - math.comb(4 - sum(r["correct"][rule]), k) / math.comb(4, k)
                           for r in rows]
                assert results[name][rule][f"pass@{k}"] == pytest.approx(sum(by_hand) / len(rows))
            assert (f"| {name} | {label} | {len(rows)} | "
                    f"{100 * results[name][rule]['avg@4']:.1f} |") in stdout
        lengths = [n for r in rows for n in r["lengths"]]
        assert results[name]["mean_length"] == pytest.approx(sum(lengths) / len(lengths))
        no_answer = sum(a is None for r in rows for a in r["answers"])
        assert results[name]["no_answer"] == pytest.approx(no_answer / len(lengths))


def test_a_boxed_only_answer_is_right_by_equivalence_and_wrong_by_the_paper_rule():
    problems = [("7", ["3 + 4 = 7\nAnswer: 7", "so \\boxed{7}", "Answer: 8", ""], [5, 6, 7, 8]),
                ("12", ["Answer: 12", "Answer: $12$", "\\boxed{12}", "Answer: 13"], [1, 2, 3, 4])]
    records = []
    for gold, texts, lengths in problems:
        # a record as sample_and_grade makes it
        record = {"id": gold, "gold": gold, "responses": texts, "lengths": lengths,
                  "answers": [verify.extract_answer(t) for t in texts],
                  "correct": [verify.verify(t, gold) for t in texts]}
        records.append(eval.grade_both(record))
    assert [r["correct"] for r in records] == [
        # \boxed{7}: only equivalence
        {"dapo": [True, False, False, False], "equivalence": [True, True, False, False]},
        {"dapo": [True, True, False, False], "equivalence": [True, True, True, False]}]
    results = {"hand": eval.summarize(records)}
    # the paper's rule: 1 + 2 of 8 right;
    # pass@2 = mean(1 - C(3,2)/C(4,2), 1 - C(2,2)/C(4,2)) = mean(1/2, 5/6)
    assert results["hand"]["dapo"] == pytest.approx({"avg@4": 3 / 8, "pass@1": 3 / 8,
                                                     "pass@2": 2 / 3, "pass@4": 1})
    # equivalence: 2 + 3 of 8; pass@2 = mean(1 - 1/6, 1)
    assert results["hand"]["equivalence"] == pytest.approx({"avg@4": 5 / 8, "pass@1": 5 / 8,
                                                        "pass@2": 11 / 12, "pass@4": 1})
    # no answer: the empty response
    assert results["hand"]["mean_length"] == 4.5 and results["hand"]["no_answer"] == 1 / 8
    table = eval.format_table(results).splitlines()
    assert table[0] == ("| benchmark | rule | problems | avg@4 | pass@1 | pass@2 | pass@4 "
                        "| mean length | no answer |")
    assert table[2:] == ["| hand | paper (dapo) | 2 | 37.5 | 37.5 | 66.7 | 100.0 | 4.5 | 12.5% |",
                         "| hand | equivalence | 2 | 62.5 | 62.5 | 91.7 | 100.0 | 4.5 | 12.5% |"]


def test_resume_after_a_kill_samples_only_the_rest_and_matches_a_clean_run(
        clean_run, tiny_model, data_files, tmp_path, monkeypatch):
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
    eval.main(["--model", tiny_model, *data_args(data_files), *sampling,
               "--out_dir", str(tmp_path)])
    assert len(sampled) == len(lines) - 3
    resumed = read_jsonl(tmp_path / "samples.jsonl")
    key = lambda r: (r["benchmark"], r["id"])
    assert (sorted(map(key, resumed))
            == sorted(map(key, read_jsonl(os.path.join(clean_out, "samples.jsonl")))))
    # per-problem seeds: the resumed run draws exactly the samples of the uninterrupted one
    assert sorted(resumed, key=key) == sorted(map(json.loads, lines), key=key)
    assert (json.load(open(tmp_path / "results.json"))
            == json.load(open(os.path.join(clean_out, "results.json"))))


def test_several_checkpoints_give_one_folder_each_and_a_curve(clean_run, tiny_model, data_files,
                                                               tmp_path, capsys):
    run_dir = tmp_path / "run"
    out = tmp_path / "eval"
    perturbed = Qwen2ForCausalLM.from_pretrained(tiny_model)
    with torch.no_grad():
        perturbed.lm_head.weight.add_(torch.randn_like(perturbed.lm_head.weight))
    shutil.copytree(tiny_model, run_dir / "phase1" / "step_000002")
    perturbed.save_pretrained(run_dir / "phase1" / "step_000002")  # other weights, same tokenizer
    shutil.copytree(tiny_model, run_dir / "phase2" / "step_000004")
    # a crashed save: not a checkpoint
    shutil.copytree(tiny_model, run_dir / "phase1" / "step_000006.tmp")
    # step 2 builds the engine; step 4 reuses it with its own weights loaded
    eval.main(["--run_dir", str(run_dir), *data_args(data_files), *sampling, "--out_dir", str(out)])
    with open(out / "curve.csv") as f:
        header, *rows = [line.strip().split(",") for line in f]
    assert header[:2] == ["phase", "step"] and header[3:] == [
        "sums dapo avg@4", "sums equivalence avg@4", "doubles dapo avg@4",
        "doubles equivalence avg@4"]
    assert [(r[0], int(r[1])) for r in rows] == [("phase1", 2), ("phase2", 4)]
    for (phase, step), row in zip([("phase1", 2), ("phase2", 4)], rows):
        results = json.load(open(out / phase / f"step_{step:06d}" / "results.json"))
        assert [float(v) for v in row[3:]] == [results[b][rule]["avg@4"]
                                               for b in ("sums", "doubles")
                                               for rule in ("dapo", "equivalence")]
    clean = read_jsonl(os.path.join(clean_run[0], "samples.jsonl"))
    key = lambda r: (r["benchmark"], r["id"])
    assert (sorted(read_jsonl(out / "phase2" / "step_000004" / "samples.jsonl"), key=key)
            == sorted(clean, key=key))
    assert (sorted(read_jsonl(out / "phase1" / "step_000002" / "samples.jsonl"), key=key)
            != sorted(clean, key=key))
    printed = capsys.readouterr().out
    assert os.path.isfile(out / "curve.png") or "matplotlib is not installed" in printed


@pytest.fixture(scope="module")
def bad(tiny_model, tmp_path_factory):
    """Bad data files and model folders."""
    folder = tmp_path_factory.mktemp("bad")
    (folder / "no_answer.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n'
                                            '{"problem": "2+2"}\n')
    (folder / "broken.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n{"problem": \n')
    # a checkpoint whose weights are gone: vLLM would load trainer_state.pt as weights
    step = folder / "run" / "phase1" / "step_000002"
    shutil.copytree(tiny_model, step)
    os.remove(step / "model.safetensors")
    (step / "trainer_state.pt").write_bytes(b"state")
    shutil.copytree(tiny_model, folder / "cut")
    os.truncate(folder / "cut" / "model.safetensors", 1000)
    shutil.copytree(tiny_model, folder / "no_template")
    os.remove(folder / "no_template" / "chat_template.jinja")
    (folder / "empty_run").mkdir()
    # a checkpoint whose record names a file that is gone
    step = folder / "damaged_run" / "phase1" / "step_000002"
    shutil.copytree(tiny_model, step)
    checkpoints.write_record(str(step), 2)
    os.remove(step / "generation_config.json")
    # an output folder's own files damaged
    (folder / "settings_list").mkdir()
    (folder / "settings_list" / "settings.json").write_text("[1]\n")
    (folder / "settings_cut").mkdir()
    (folder / "settings_cut" / "settings.json").write_text('{"k": ')
    (folder / "samples_bare").mkdir()
    (folder / "samples_bare" / "samples.jsonl").write_text('{"benchmark": "x", "id": "1"}\n')
    shutil.copytree(tiny_model, folder / "unknown_type")
    config = json.loads((folder / "unknown_type" / "config.json").read_text())
    (folder / "unknown_type" / "config.json").write_text(json.dumps({**config,
                                                                      "model_type": "nope"}))
    return folder


B = "{bad}"
# (id, flags after --data B/.. --model tiny (a later --model, --data adds one), what the line says)
bad_inputs = [
    ("--model missing", ["--model", "/nope/phase1/step_000002"],
     "--model /nope/phase1/step_000002: no such folder"),
    ("a checkpoint without weights", ["--run_dir", f"{B}/run"],
     "--run_dir {bad}/run/phase1/step_000002: no weights (model.safetensors"),
    ("--model with weights cut short", ["--model", f"{B}/cut"],
     "cut/model.safetensors: cut short or damaged (1,000 bytes; safetensors: "),
    ("--model without a chat template", ["--model", f"{B}/no_template"],
     "no_template: the tokenizer has no chat template"),
    ("--run_dir without checkpoints", ["--run_dir", f"{B}/empty_run"],
     "empty_run: no checkpoints"),
    ("--k 0", ["--k", "0"], "--k 0: must be at least 1"),
    ("--temperature 0", ["--temperature", "0"], "--temperature 0.0: must be at least 0.01"),
    # vLLM raises it to 0.01
    ("--temperature 1e-9", ["--temperature", "1e-9"],
     "--temperature 1e-09: must be at least 0.01"),
    ("--top_p 1.5", ["--top_p", "1.5"], "--top_p 1.5: must be at most 1"),
    ("--max_new_tokens 0", ["--max_new_tokens", "0"], "--max_new_tokens 0: must be at least 1"),
    ("--chunk_problems 0", ["--chunk_problems", "0"], "--chunk_problems 0: must be at least 1"),
    ("--dtype banana", ["--dtype", "banana"], "eval.py: argument --dtype: invalid choice"),
    ("--stop_token unknown", ["--stop_token", "zzz"], "--stop_token 'zzz': not a single token"),
    ("missing data file", ["--data", f"{B}/nope.jsonl"], "nope.jsonl: no such data file"),
    ("row without answer", ["--data", f"{B}/no_answer.jsonl"],
     "no_answer.jsonl: row 2: missing 'answer'"),
    ("bad JSON", ["--data", f"{B}/broken.jsonl"], "broken.jsonl: row 2: not valid JSON"),
    ("--out_dir not writable", ["--out_dir", "/proc/eval-out"],
     "--out_dir /proc/eval-out: cannot write in /proc"),
    # rlep.py's preflight, on eval.py's models, data and numbers
    ("--k over vLLM's bound", ["--k", "20000"], "--k 20000: must be at most 16384"),
    ("--temperature inf", ["--temperature", "inf"], "--temperature inf: must be at most 2"),
    ("--prompt_template another field", ["--prompt_template", "{question}"],
     "names {question}; a template names {problem}"),
    ("--model of an unknown type", ["--model", f"{B}/unknown_type"],
     "unknown_type: its config.json: "),
    ("settings.json a list", ["--out_dir", f"{B}/settings_list"],
     "settings_list/settings.json: not a JSON object of eval.py's settings"),
    ("settings.json not JSON", ["--out_dir", f"{B}/settings_cut"],
     "settings_cut/settings.json: not valid JSON"),
    ("a samples.jsonl row without its verdicts", ["--out_dir", f"{B}/samples_bare"],
     "samples_bare/samples.jsonl: row 1: no 'correct' (dict), which eval.py writes"),
    ("a damaged checkpoint", ["--run_dir", f"{B}/damaged_run"],
     "damaged_run/phase1/step_000002: damaged, generation_config.json is missing"),
]


@pytest.mark.parametrize("flags, message", [case[1:] for case in bad_inputs],
                         ids=[case[0] for case in bad_inputs])
def test_bad_input_is_refused_in_one_line_before_anything_is_written(
        tmp_path, tiny_model, data_files, bad, monkeypatch, capsys, flags, message):
    out = tmp_path / "eval"
    flags = [f.replace(B, str(bad)) for f in flags]
    models = [] if "--run_dir" in flags or "--model" in flags else ["--model", tiny_model]
    monkeypatch.setattr(rlep, "build_engine", lambda *args: pytest.fail("an engine started"))
    # a flag's value out of its choices is argparse's: one line on stderr, exit 2
    with pytest.raises((UserError, SystemExit)) as error:
        eval.main([*models, "--data", data_files[0], *sampling, "--out_dir", str(out), *flags])
    line = str(error.value)
    if error.type is SystemExit:
        assert error.value.code == 2
        line = capsys.readouterr().err.strip()
    assert message.replace(B, str(bad)) in line and "\n" not in line
    assert not out.exists()


def test_prompts_cut_by_the_budget_or_the_context_are_warned_about(tmp_path, tiny_model,
                                                                   data_files, monkeypatch,
                                                                   capsys):
    """As rlep.py: one line counts the prompts --max_prompt_len cuts; one says how a context too
    small for the budget (the tiny model's 512) was shared."""
    class EngineReached(Exception):
        pass

    def stop(*args):
        raise EngineReached
    monkeypatch.setattr(rlep, "build_engine", stop)
    for case, (flags, expected) in enumerate((
            (["--max_prompt_len", "6", "--max_new_tokens", "16"],
             "eval.py: warning: --max_prompt_len 6: 6 of 6 sums "
             "prompts are longer, cut from the left"),
            (["--max_prompt_len", "1024", "--max_new_tokens", "3072"],
             f"eval.py: warning: {tiny_model}: a context of 512 tokens: prompts get 256 "
             "(--max_prompt_len 1024), responses 256 (--max_new_tokens 3072)"))):
        with pytest.raises(EngineReached):
            eval.main(["--model", tiny_model, "--data", data_files[0], "--k", "2",
                       "--prompt_template", "{problem}", *flags,
                       "--out_dir", str(tmp_path / f"eval{case}")])
        warnings = [x for x in capsys.readouterr().err.splitlines() if "warning" in x]
        assert len(warnings) == 1 and warnings[0].startswith(expected), warnings


def test_python_eval_py_prints_one_line_and_exits_2(tmp_path, tiny_model, data_files):
    out = tmp_path / "eval"
    command = [sys.executable, "eval.py", "--model", tiny_model, "--data", data_files[0],
               *sampling, "--k", "0", "--out_dir", str(out)]
    done = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "eval.py: --k 0: must be at least 1"], done.stderr[-3000:]
    assert not out.exists()


def test_samples_of_other_settings_are_refused_before_sampling(clean_run, tiny_model,
                                                                data_files, tmp_path, monkeypatch):
    out = tmp_path / "eval"
    shutil.copytree(clean_run[0], out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    monkeypatch.setattr(rlep, "build_engine", lambda *args: pytest.fail("an engine started"))
    with pytest.raises(UserError, match=r"eval/: samples made with other settings \(k\); "
                                             "use another --out_dir"):
        eval.main(["--model", tiny_model, *data_args(data_files), *sampling, "--k", "2",
                   "--out_dir", str(out)])
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_other_settings_refuse_to_resume_and_new_tokens_fit_the_context(clean_run, tiny_model,
                                                                        data_files, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(clean_run[0], out)

    def parse(*flags):
        """The clean run's flags, then `flags`, writing to `out`."""
        return eval.parse_args(["--model", tiny_model, *data_args(data_files), *sampling, *flags,
                                "--out_dir", str(out)])

    config = AutoConfig.from_pretrained(tiny_model)

    def evaluate(args):
        """The preflight's check of the folder's settings."""
        cfg = eval.make_config(args, tiny_model, config)
        eval.check_settings(args.out_dir, eval.settings_of(cfg, args, tiny_model))

    args = parse("--k", "8")
    with pytest.raises(ValueError, match=r"other settings \(k\)"):
        evaluate(args)
    args = parse("--stop_token", "=")
    assert eval.make_config(args, tiny_model, config).stop_token == "="
    with pytest.raises(ValueError, match=r"other settings \(stop_token\)"):
        evaluate(args)
    # samples of the one-rule eval.py (no "rules" in settings.json, "correct" a plain list) are
    # not mixed in
    settings = json.load(open(out / "settings.json"))
    del settings["rules"]
    (out / "settings.json").write_text(json.dumps({**settings, "verify_mode": "default"}))
    args = parse()
    with pytest.raises(ValueError, match=r"other settings \(rules\)"):
        evaluate(args)
    # the tiny model's context: 512
    for prompt_len, expected in ((64, (64, 512 - 64)), (1024, (256, 256))):
        args = eval.parse_args(["--model", tiny_model, "--data", "x.jsonl",
                                "--max_prompt_len", str(prompt_len)])
        cfg = eval.make_config(args, tiny_model, config)
        assert (cfg.max_prompt_len, cfg.max_response_len) == expected


def test_a_folder_of_the_older_rule_name_resumes_without_sampling_again(clean_run, tiny_model,
                                                                        data_files, tmp_path):
    """eval.py named the equivalence rule "default" before: its finished folder is reused, its
    records read under the new name, and nothing is sampled again."""
    out = tmp_path / "old"
    shutil.copytree(clean_run[0], out)
    settings = json.load(open(out / "settings.json"))
    (out / "settings.json").write_text(json.dumps({**settings, "rules": ["dapo", "default"]}))
    records = read_jsonl(out / "samples.jsonl")
    for r in records:
        r["correct"]["default"] = r["correct"].pop("equivalence")
    (out / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    args = eval.parse_args(["--model", tiny_model, *data_args(data_files), *sampling,
                            "--out_dir", str(out)])
    benchmarks = eval.load_benchmarks(args.data)
    cfg = eval.make_config(args, tiny_model, AutoConfig.from_pretrained(tiny_model))
    settings = eval.settings_of(cfg, args, tiny_model)
    eval.check_settings(str(out), settings)
    results, engine = eval.evaluate(tiny_model, benchmarks, cfg, settings, args,
                                    ranks.setup_distributed(), str(out))
    # every problem was done: no engine was built
    assert engine is None
    assert results == json.load(open(os.path.join(clean_run[0], "results.json")))
    assert all(sorted(r["correct"]) == ["dapo", "equivalence"]
               for r in read_jsonl(out / "samples.jsonl"))


def write_metrics(path, curves, every=5):
    """An rlep.py part's metrics.jsonl: a row per step, the validation metrics every `every` steps
    and at step 0."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    steps = every * (len(next(iter(curves.values()))) - 1)
    rows = []
    for step in range(steps + 1):
        row = {"step": step, "reward_mean": 0.0}
        if step % every == 0:
            row.update({key: values[step // every] for key, values in curves.items()})
        rows.append(row)
    open(path, "w").write("".join(json.dumps(r) + "\n" for r in rows))


def test_compare_prints_rlep_comparison_table_and_draws_a_panel_per_metric(tmp_path, capsys,
                                                                           monkeypatch):
    write_metrics(tmp_path / "seed1" / "phase1" / "metrics.jsonl", {
        "val_acc": [0.10, 0.20, 0.35, 0.30, 0.32], "val_acc/aime24": [0.0, 0.10, 0.20, 0.20, 0.10],
        "val_acc/amc23": [0.20, 0.30, 0.50, 0.40, 0.54]})
    write_metrics(tmp_path / "seed1" / "phase2" / "metrics.jsonl", {
        "val_acc": [0.10, 0.30, 0.36, 0.40, 0.38], "val_acc/aime24": [0.0, 0.20, 0.10, 0.30, 0.25],
        "val_acc/amc23": [0.20, 0.40, 0.50, 0.45, 0.50]})
    write_metrics(tmp_path / "seed2" / "phase1" / "metrics.jsonl", {"val_acc": [0.10, 0.50, 0.40]})
    write_metrics(tmp_path / "seed2" / "phase2" / "metrics.jsonl", {"val_acc": [0.10, 0.45, 0.45]})
    # no RLEP yet
    write_metrics(tmp_path / "seed3" / "phase1" / "metrics.jsonl", {"val_acc": [0.10, 0.50, 0.40]})
    runs = [str(tmp_path / name) for name in ("seed1", "seed2", "seed3")]
    panels = {}
    real_save_plot = report.save_plot

    def recording_save_plot(path, p, label):
        panels.update(p)
        return real_save_plot(path, p, label)

    monkeypatch.setattr(report, "save_plot", recording_save_plot)
    eval.main(["--compare", *runs, "--out_dir", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    assert report.comparison_table(runs) in printed
    # by hand: the peak is the earliest highest point; "reaches it at" the first RLEP step at or
    # above it
    hand_rows = [
        "| seed1 | val_acc | 35.0 (step 10) | step 10 | 40.0 (step 15) | 32.0 (step 20) "
        "| 38.0 (step 20) |",
        "| seed1 | val_acc/aime24 | 20.0 (step 10) | step 5 | 30.0 (step 15) | 10.0 (step 20) "
        "| 25.0 (step 20) |",
        "| seed1 | val_acc/amc23 | 54.0 (step 20) | never | 50.0 (step 10) | 54.0 (step 20) "
        "| 50.0 (step 20) |",
        "| seed2 | val_acc | 50.0 (step 5) | never | 45.0 (step 5) | 40.0 (step 10) "
        "| 45.0 (step 10) |",
        "| seed3 | val_acc | 50.0 (step 5) | n/a | n/a | 40.0 (step 10) | n/a |",
    ]
    assert [row for row in hand_rows if row not in printed] == []
    assert (os.path.isfile(tmp_path / "out" / "compare.png")
            or "matplotlib is not installed" in printed)
    assert list(panels) == ["val_acc", "val_acc/aime24", "val_acc/amc23"]
    steps = lambda n: list(range(0, 5 * n, 5))
    assert panels["val_acc"] == [
        ("seed1 baseline", steps(5), [0.10, 0.20, 0.35, 0.30, 0.32], "--", 0),
        ("seed1 RLEP", steps(5), [0.10, 0.30, 0.36, 0.40, 0.38], "-", 0),
        ("seed2 baseline", steps(3), [0.10, 0.50, 0.40], "--", 1),
        ("seed2 RLEP", steps(3), [0.10, 0.45, 0.45], "-", 1),
        ("seed3 baseline", steps(3), [0.10, 0.50, 0.40], "--", 2)]
    assert [line[0] for line in panels["val_acc/amc23"]] == ["seed1 baseline", "seed1 RLEP"]
    assert panels["val_acc/aime24"][1][2] == [0.0, 0.20, 0.10, 0.30, 0.25]
    with pytest.raises(UserError, match="empty: no val_acc"):
        eval.main(["--compare", str(tmp_path / "empty"), "--out_dir", str(tmp_path / "out")])
