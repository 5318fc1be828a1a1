"""Bad input is refused before anything is written, in one line: a table of bad commands,
files, model folders, pools and disks, each refused by rlep.main before an engine starts and
with the output folder untouched (absent, or byte-identical where it held a run); the same
as one line on stderr and exit code 2 from `python rlep.py`, on one rank and on two (rank 0
decides, both stop); a resume with a changed value refused, then taken with --override and
recorded; warnings for legal but surprising settings; Ctrl-C's one line.
Run: python -m pytest -q tests/test_bad_input.py"""
import hashlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

import forked
import machinery.files
from machinery import RunStopped, UserError, checkpoints, data, preflight, ranks, report
import rlep

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_model):
    """Bad data and pool files, a good pool, bad model folders."""
    folder = tmp_path_factory.mktemp("files")
    good = [{"problem": f"{a}+{b}", "answer": str(a + b)} for a in range(9) for b in range(9)]

    def jsonl(name, rows):
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "empty.jsonl").write_text("")
    jsonl("no_answer.jsonl", good[:6] + [{"problem": "1+1"}])
    (folder / "latin1.jsonl").write_bytes(b'{"problem": "1+2", "answer": "3"}\n' * 6
                                          + b'{"problem": "caf\xe9", "answer": "1"}\n')
    (folder / "broken.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n{"problem": \n')
    (folder / "data.csv").write_text("problem,answer\n")
    # json.loads keeps the last value of a repeated key
    (folder / "two_answers.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in good[:8])
        + '{"problem": "1+1", "answer": "2", "answer": "3"}\n')
    pq.write_table(pa.table({"question": ["1+1"], "solution": ["2"]}), folder / "schema.parquet")
    (folder / "not.parquet").write_text("not parquet")
    pool = [{**r, "id": f"p{i}", "responses": [f"Answer: {r['answer']}"] * 2}
            for i, r in enumerate(good[:67])]
    jsonl("pool.jsonl", pool)
    # its answers, but for its prompt 0's: both wrong
    jsonl("pool_wrong.jsonl", [{**pool[0], "responses": ["Answer: 1", "Answer: 999"]}]
          + pool[1:])
    del pool[40]["responses"]
    jsonl("pool_row_41_bare.jsonl", pool)
    # p4 twice: once as in pool.jsonl, once another problem
    jsonl("two_p4.jsonl", pool[:8] + [{"id": "p4", "problem": "7-1", "answer": "6"}])
    (folder / "a_file").write_text("not a folder\n")
    (folder / "tiny_a_file").mkdir()
    (folder / "tiny_a_file" / "tiny").write_text("not the tiny model's folder\n")
    (folder / "no_model").mkdir()
    tokenizer_files = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
    for name, gone in (("no_tokenizer", tokenizer_files), ("no_template", tokenizer_files[2:]),
                       ("no_weights", ("model.safetensors",)), ("cut_weights", ())):
        shutil.copytree(tiny_model, folder / name)
        for file in gone:
            os.remove(folder / name / file)
    weights = folder / "cut_weights" / "model.safetensors"
    os.truncate(weights, os.path.getsize(weights) - 1)
    # a step folder whose weights are gone: vLLM would load trainer_state.pt as weights
    (folder / "no_weights" / "trainer_state.pt").write_bytes(b"state")
    # model folders that pass a look and fail a load, each one edit of the tiny model
    def edited(name, file, edit):
        shutil.copytree(tiny_model, folder / name)
        path = folder / name / file
        path.write_text(edit(path.read_text() if path.exists() else ""))
    config = json.loads((folder / "cut_weights" / "config.json").read_text())
    edited("unknown_type", "config.json", lambda text: json.dumps({**config, "model_type": "nope"}))
    edited("wrong_hidden", "config.json", lambda text: json.dumps({**config, "hidden_size": 32}))
    edited("llama_over_qwen2", "config.json",
           lambda text: json.dumps({**config, "architectures": ["LlamaForCausalLM"]}))
    edited("empty_template", "chat_template.jinja", lambda text: "{{ '' }}")
    edited("position_text", "config.json",
           lambda text: json.dumps({**config, "max_position_embeddings": "512"}))
    edited("three_layer_types", "config.json",
           lambda text: json.dumps({**config, "layer_types": ["full_attention"] * 3}))
    edited("one_layer", "config.json", lambda text: json.dumps(
        {**config, "num_hidden_layers": 1, "layer_types": ["full_attention"]}))
    edited("bad_index", "model.safetensors.index.json", lambda text: "{not json")
    edited("bad_template", "chat_template.jinja", lambda text: "{% for m in messages %}{{ m")
    edited("no_eos", "tokenizer_config.json",
           lambda text: json.dumps({**json.loads(text), "eos_token": None}))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|beyond|>"]})
    shutil.copytree(tiny_model, folder / "wide_tokenizer")
    tokenizer.save_pretrained(folder / "wide_tokenizer")
    # rows whose fields are of the wrong kind, each the last of seven
    for name, bad in (("answer_dict", {"answer": {"v": 2}}), ("answer_list", {"answer": [3]}),
                      ("answer_nan", {"answer": math.nan}), ("answer_false", {"answer": False}),
                      ("prompt_strings", {"answer": "2", "prompt": ["What is 1+1?"]})):
        jsonl(f"{name}.jsonl", good[:6] + [{"problem": "1+1", **bad}])
    # a problem of 1.5 MB: the tokenizer aborts on 50 MB
    jsonl("long_problem.jsonl", good[:8] + [{"problem": "1+" * 750_001, "answer": "2"}])
    # the pool's ids are the training file's, one with another problem
    jsonl("pool_other_p3.jsonl", [{**row, "problem": "9-9"} if row["id"] == "p3" else row
                                  for row in pool[:40]])
    return folder


@pytest.fixture(scope="module")
def cache_dir(tiny_model):
    return os.path.dirname(tiny_model)


def hold_a_run(out, cache_dir, *flags):
    """A run's folder as main leaves it: config.json (the dtype resolved), a checkpoint's
    folder, metrics."""
    cfg = rlep.parse_config(["--preset", "tiny", "--out_dir", str(out), "--cache_dir",
                             str(cache_dir), *flags])
    cfg.dtype = "float32"
    step = out / "phase1" / "step_000002"
    (step / "optimizer").mkdir(parents=True)
    for name in ("model.safetensors", "trainer_state.pt", "optimizer/.metadata"):
        (step / name).write_bytes(b"bytes of " + name.encode())
    checkpoints.write_record(str(step), 2)
    (out / "phase1" / "metrics.jsonl").write_text('{"step": 0}\n')
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2))


def digest(path):
    """The bytes and names of everything under path; None if it is absent."""
    if not os.path.exists(path):
        return None
    if os.path.isfile(path):
        return hashlib.sha256(open(path, "rb").read()).hexdigest()
    h = hashlib.sha256()
    for root, dirs, names in sorted(os.walk(path)):
        dirs.sort()
        h.update(root.encode())
        for name in sorted(names):
            h.update(name.encode() + open(os.path.join(root, name), "rb").read())
    return h.hexdigest()


# (id, flags after --preset tiny, the out_dir's state: None, "run" or "file", what the line says)
F = "{files}"
bad_inputs = [
    ("missing data file", ["--train_file", "/nope.jsonl"], None, "/nope.jsonl: no such data file"),
    ("empty data file", ["--train_file", f"{F}/empty.jsonl"], None, "empty.jsonl: no rows"),
    ("row without answer", ["--train_file", f"{F}/no_answer.jsonl"], None,
     "no_answer.jsonl: row 7: missing 'answer'"),
    ("parquet of another schema", ["--train_file", f"{F}/schema.parquet"], None,
     "schema.parquet: columns ['question', 'solution']; wanted problem and answer"),
    ("not parquet", ["--train_file", f"{F}/not.parquet"], None, "not a readable parquet file"),
    ("not UTF-8", ["--train_file", f"{F}/latin1.jsonl"], None,
     "latin1.jsonl: row 7: not UTF-8 (byte 0xe9 at offset 16)"),
    ("bad JSON", ["--val_file", f"{F}/broken.jsonl"], None, "row 2: not valid JSON"),
    ("unknown format", ["--train_file", f"{F}/data.csv"], None, "data.csv: unknown format"),
    ("unknown built-in data", ["--train_file", "builtin:nope"], None, "unknown built-in data"),
    ("--n 0", ["--n", "0"], None, "--n 0: must be at least 2"),
    # GRPO's Â of a group of one is 0: nothing would be learned
    ("--n 1", ["--n", "1"], None, "--n 1: must be at least 2"),
    ("--prompts_per_step 0", ["--prompts_per_step", "0"], None,
     "--prompts_per_step 0: must be at least 1"),
    ("--save_every 0", ["--save_every", "0"], None, "--save_every 0: must be at least 1"),
    ("--max_gen_rounds 0", ["--dynamic_sampling", "--max_gen_rounds", "0"], None,
     "--max_gen_rounds 0: must be at least 1"),
    ("--keep_checkpoints -1", ["--keep_checkpoints", "-1", "--phase", "1"], None,
     "--keep_checkpoints -1: must be at least 0"),
    ("--phase1_steps 0", ["--phase1_steps", "0"], None, "--phase1_steps 0: must be at least 1"),
    ("--mini_batch_prompts over B", ["--mini_batch_prompts", "16"], None,
     "--mini_batch_prompts 16: must be at most --prompts_per_step 8"),
    ("--temperature 0", ["--temperature", "0"], None,
     "--temperature 0.0: must be at least 0.01"),
    # vLLM raises a T below 0.01 to 0.01; the trainer would divide by it
    ("--temperature 1e-9", ["--temperature", "1e-9"], None,
     "--temperature 1e-09: must be at least 0.01"),
    ("--collect_temperature 0.001", ["--collect_temperature", "0.001"], None,
     "--collect_temperature 0.001: must be at least 0.01"),
    ("--top_p 0", ["--top_p", "0"], None, "--top_p 0.0: must be above 0"),
    ("--collect_temperature 3", ["--collect_temperature", "3"], None,
     "--collect_temperature 3.0: must be at most 2"),
    ("--top_p 1.5", ["--top_p", "1.5"], None, "--top_p 1.5: must be at most 1"),
    ("--collect_top_p 0", ["--collect_top_p", "0"], None, "--collect_top_p 0.0: must be above 0"),
    ("--clip_low 1", ["--clip_low", "1"], None, "--clip_low 1.0: must be below 1"),
    ("--clip_c 1", ["--clip_c", "1"], None, "--clip_c 1.0: must be above 1"),
    ("--lr nan", ["--lr", "nan"], None, "--lr nan: must be at least 0"),
    ("--max_response_len 0", ["--max_response_len", "0"], None, "must be at least 1"),
    ("--overlong_buffer over L_max", ["--overlong_buffer", "17"], None,
     "--overlong_buffer 17: must be at most --max_response_len 16"),
    ("--val_k 0", ["--val_k", "0"], None, "--val_k 0: must be at least 1"),
    ("--min_successes over K", ["--min_successes", "20"], None,
     "--min_successes 20: must be at most --collect_k 16"),
    ("--collect_step past phase one", ["--collect_step", "9"], None, "--collect_step 9"),
    ("--prompts_per_step over the rows", ["--prompts_per_step", "200"], None,
     "--prompts_per_step 200: phase 1 has 80 prompts"),
    ("--phase1_prompts pool without a pool", ["--phase1_prompts", "pool"], None,
     "--phase1_prompts pool needs --pool FILE"),
    ("--stop_token unknown", ["--stop_token", "<|nope|>"], None, "not a single token"),
    ("--model_path missing", ["--model_path", "/nonexistent"], None,
     "--model_path /nonexistent: no such folder (a hub name like Qwen/Qwen2.5-Math-7B is "
     "fetched"),
    ("--model_path not a model", ["--model_path", f"{F}/no_model"], None,
     "not a model folder (no config.json)"),
    ("--model_path unknown built-in", ["--model_path", "builtin:nope"], None,
     "unknown built-in model"),
    ("--model_path without a tokenizer", ["--model_path", f"{F}/no_tokenizer"], None,
     "no_tokenizer: no tokenizer (tokenizer.json"),
    ("--model_path without a chat template", ["--model_path", f"{F}/no_template"], None,
     "no_template: the tokenizer has no chat template"),
    ("--model_path without weights", ["--model_path", f"{F}/no_weights"], None,
     "no_weights: no weights (model.safetensors or pytorch_model.bin)"),
    ("--model_path with weights cut short", ["--model_path", f"{F}/cut_weights"], None,
     "cut_weights/model.safetensors: cut short"),
    # the tiny model's context: 512 tokens
    ("prompt + response over the context", ["--max_prompt_len", "400", "--max_response_len",
                                            "200"], None,
     "--max_prompt_len 400 + --max_response_len 200 = 600 tokens: over the model's context, "
     "512 (max_position_embeddings in"),
    ("--dtype banana", ["--dtype", "banana"], None,
     "rlep.py: argument --dtype: invalid choice: 'banana'"),
    ("--dtype float16", ["--dtype", "float16"], None, "argument --dtype: invalid choice"),
    ("--out_dir a file", [], "file", ": a file, not a folder"),
    ("--out_dir inside a file", ["--out_dir", f"{F}/a_file/run"], None,
     "a_file is a file, not a folder"),
    # not writable, even by root (a read-only mount is another case of it)
    ("--out_dir not writable", ["--out_dir", "/proc/rlep-run"], None,
     "--out_dir /proc/rlep-run: cannot write in /proc"),
    ("two rows, one id", ["--train_file", f"{F}/two_p4.jsonl"], None,
     "two_p4.jsonl: rows 5 and 9: both have id 'p4', with other problems"),
    ("pool row without responses", ["--phase", "2", "--pool", f"{F}/pool_row_41_bare.jsonl"],
     None, "pool_row_41_bare.jsonl: row 41: no 'responses'"),
    ("--phase 2 without a pool", ["--phase", "2"], None, "--phase 2 needs --pool FILE"),
    ("a run there, no --resume", [], "run", "already holds a run: pass --resume"),
    ("--resume --lr changed", ["--resume", "--lr", "1e-3"], "run",
     "--lr 0.0003 (now 0.001): resume with its values, or add --override"),
    ("--resume --n changed", ["--resume", "--n", "4"], "run", "--n 8 (now 4)"),
    ("--resume --dtype changed", ["--resume", "--dtype", "bfloat16"], "run",
     "--dtype 'float32' (now 'bfloat16')"),
    ("--resume, config.json without lr", ["--resume"], "run without lr",
     "config.json lacks --lr: restore them"),
    ("--resume, config.json not JSON", ["--resume"], "run, config.json cut",
     "config.json: not valid JSON (Unterminated string"),
    # the preflight's later cases: numbers finite and within vLLM's bounds
    ("--lr inf", ["--lr", "inf"], None, "--lr inf: must be a finite number"),
    ("--weight_decay inf", ["--weight_decay", "inf"], None,
     "--weight_decay inf: must be a finite number"),
    ("--n 100000", ["--n", "100000"], None, "--n 100000: must be at most 16384"),
    ("--collect_k 20000", ["--collect_k", "20000"], None, "--collect_k 20000: must be at most"),
    ("--val_k 20000", ["--val_k", "20000"], None, "--val_k 20000: must be at most 16384"),
    # templates
    ("--prompt_template another field", ["--prompt_template", "Q: {question}"], None,
     "names {question}; a template names {problem}"),
    ("--prompt_template unbalanced", ["--prompt_template", "Q: {problem"], None,
     "expected '}' before end of string"),
    ("--prompt_template without {problem}", ["--prompt_template", "Solve it."], None,
     "names no field; a template names {problem}"),
    ("--prompt_template a bad format", ["--prompt_template", "{problem:d}"], None,
     "--train_file: its first row's prompt does not render (ValueError"),
    # model folders that pass a look and fail a load
    ("--model_path of an unknown type", ["--model_path", f"{F}/unknown_type"], None,
     "unknown_type: its config.json: "),
    ("--model_path with an index not JSON", ["--model_path", f"{F}/bad_index"], None,
     "bad_index/model.safetensors.index.json: not a safetensors index"),
    ("--model_path with a chat template that does not parse",
     ["--model_path", f"{F}/bad_template"], None, "its chat template does not render"),
    ("--model_path whose hidden_size is not the weights'", ["--model_path", f"{F}/wrong_hidden"],
     None, "wrong_hidden: lm_head.weight is [259, 64] in the weights, [259, 32] by its config"),
    ("--model_path whose tokenizer has no EOS", ["--model_path", f"{F}/no_eos"], None,
     "no_eos: the tokenizer has no EOS token to end a response: give --stop_token"),
    ("--model_path whose tokenizer outgrows the vocabulary",
     ["--model_path", f"{F}/wide_tokenizer"], None,
     "its tokenizer's largest id, 259, is outside its vocabulary of 259"),
    # rows through the schema
    ("an answer that is a dict", ["--train_file", f"{F}/answer_dict.jsonl"], None,
     "answer_dict.jsonl: row 7: 'answer' must be a non-empty string or a finite number, not "
     "{'v': 2}"),
    ("an answer that is a list", ["--train_file", f"{F}/answer_list.jsonl"], None,
     "row 7: 'answer' must be a non-empty string or a finite number, not [3]"),
    ("an answer that is NaN", ["--train_file", f"{F}/answer_nan.jsonl"], None,
     "row 7: 'answer' must be a non-empty string or a finite number, not nan"),
    ("an answer that is false", ["--train_file", f"{F}/answer_false.jsonl"], None,
     "row 7: 'answer' must be a non-empty string or a finite number, not False"),
    ("a plain row whose prompt is a list of strings",
     ["--train_file", f"{F}/prompt_strings.jsonl"], None,
     "row 7: 'prompt.0' must be a {role, content} message, not 'What is 1+1?'"),
    ("a pool id of another problem", ["--train_file", f"{F}/pool.jsonl",
                                      "--pool", f"{F}/pool_other_p3.jsonl"], None,
     "pool_other_p3.jsonl: id 'p3' is another problem in --train_file"),
    # folders
    ("--out_dir empty", ["--out_dir", ""], None, "--out_dir '': a folder is needed"),
    ("--out_dir a link to nothing", [], "link to nothing", "is a link to nothing"),
    ("--out_dir a loop of links", [], "loop of links", "is a link to nothing (or a loop"),
    ("--cache_dir a file", ["--cache_dir", f"{F}/a_file"], None,
     "--cache_dir {files}/a_file: a file, not a folder"),
    ("--cache_dir not writable", ["--cache_dir", "/proc/rlep-cache"], None,
     "--cache_dir /proc/rlep-cache: cannot write in /proc"),
    # runs and checkpoints
    ("--resume with no run there", ["--resume"], None, "holds no run (no config.json)"),
    ("--phase collect with no phase one", ["--phase", "collect"], None,
     "phase1/step_000004: phase one has no checkpoint at --collect_step 4"),
    ("--resume, the step's weights gone", ["--resume"], "run, weights gone",
     "phase1/step_000002: damaged, model.safetensors is missing: move it away to start the "
     "part over"),
    ("--resume, trainer_state.pt empty", ["--resume"], "run, state empty",
     "damaged, trainer_state.pt holds 0 bytes, its record 25"),
    ("--resume, optimizer/ gone", ["--resume"], "run, optimizer gone",
     "damaged, optimizer/.metadata is missing"),
    # vLLM builds the architecture: Llama's drops Qwen2's attention biases
    ("--model_path whose architecture is another model type's",
     ["--model_path", f"{F}/llama_over_qwen2"], None,
     "llama_over_qwen2: its config.json's architectures names LlamaForCausalLM, a llama model, "
     "over model_type qwen2"),
    ("--resume, the training rows changed", ["--resume"], "run, train rows changed",
     "--resume: --train_file builtin:tiny:train: its rows are not those the run in {out} read"),
    # config.json passes the flags' checks: --dtype auto would take its dtype
    ("--resume, config.json's dtype float16", ["--resume", "--dtype", "auto"],
     "run, config.json's dtype=\"float16\"",
     "/run/config.json: \"dtype\" is 'float16'; it must be auto, float32, bfloat16, as "
     "--dtype's value"),
    ("--resume, config.json's lr a string", ["--resume", "--override"],
     "run, config.json's lr=\"0.01\"", "config.json: \"lr\" is '0.01'; it must be a float"),
    ("--resume, config.json's n a bool", ["--resume", "--override"],
     "run, config.json's n=true", "config.json: \"n\" is True; it must be a int"),
    ("--resume, config.json's n 1", ["--resume", "--override"], "run, config.json's n=1",
     "/run/config.json: holds --n 1: must be at least 2: restore it"),
    ("a row with a key twice", ["--train_file", f"{F}/two_answers.jsonl"], None,
     "two_answers.jsonl: row 9: the key 'answer' twice: keep one"),
    ("--phase collect with --pool", ["--phase", "collect", "--pool", f"{F}/pool.jsonl"], None,
     "--phase collect --pool {files}/pool.jsonl: a given pool is not collected"),
    # numpy's and vLLM's seed range
    ("--seed 4294967296", ["--seed", "4294967296"], None,
     "--seed 4294967296: must be at most 2147483647"),
    # the save plan of 10^12 steps would exhaust the memory
    ("--phase1_steps 10^12", ["--phase1_steps", "1000000000000"], None,
     "--phase1_steps 1000000000000: must be at most 1000000"),
    ("--phase2_steps 10^12", ["--phase2_steps", "1000000000000"], None,
     "--phase2_steps 1000000000000: must be at most 1000000"),
    ("--model_path whose chat template renders an empty prompt",
     ["--model_path", f"{F}/empty_template"], None,
     "empty_template: its chat template leaves the user's message out of the prompt (it renders "
     "'')"),
    # model configs transformers rejects, and one of fewer layers than the weights
    ("--model_path whose max_position_embeddings is text", ["--model_path", f"{F}/position_text"],
     None, "position_text: its config.json: Validation error for field 'max_position_embeddings'"),
    ("--model_path whose layer_types is not num_hidden_layers long",
     ["--model_path", f"{F}/three_layer_types"], None,
     "three_layer_types: its config.json: Class validation error"),
    ("--model_path of fewer layers than its weights", ["--model_path", f"{F}/one_layer"], None,
     "one_layer: model.layers.1.input_layernorm.weight: its config.json does not describe it "
     "(num_hidden_layers 1"),
    ("--resume, config.json's overrides a string", ["--resume"],
     "run, config.json's overrides=\"none\"", "config.json: \"overrides\" must be a list"),
    ("--resume, phase1 a file", ["--resume"], "run, phase1 a file",
     "/run: its phase1 is a file, which the run writes as the other: move it away"),
    ("--resume, rlep.lock a folder", ["--resume"], "run, rlep.lock a folder",
     "/run: its rlep.lock is a folder, which the run writes as the other"),
    ("--cache_dir whose tiny is a file", ["--cache_dir", f"{F}/tiny_a_file"], None,
     "--model_path builtin:tiny: {files}/tiny_a_file/tiny is a file, not the model's folder"),
    # the run's own rows a resume reads
    ("--resume, a metrics.jsonl row without its step", ["--resume"],
     "run, metrics row without step",
     "phase1/metrics.jsonl: row 2: no 'step' (int), which rlep.py writes"),
    ("--resume, a progress.jsonl row without its id", ["--resume"],
     "run, progress row without id", "collect/progress.jsonl: row 1: no 'id' (str)"),
    # checkpoint.json edited by hand
    ("--resume, checkpoint.json's files a list", ["--resume"], "run, record's files a list",
     "step_000002: damaged, checkpoint.json's files is not {file: its size in bytes}"),
    ("--resume, checkpoint.json's sizes text", ["--resume"], "run, record's sizes text",
     "step_000002: damaged, checkpoint.json's files is not {file: its size in bytes}"),
    ("--resume, checkpoint.json empty over a missing trainer_state.pt", ["--resume"],
     "run, record empty, state gone", "step_000002: damaged, checkpoint.json does not list its "
     "weights"),
    ("a problem of 1.5 million characters", ["--train_file", f"{F}/long_problem.jsonl"], None,
     "long_problem.jsonl: row 9: its problem and prompt hold 1,500,002 characters, over "
     "1,000,000"),
    # a run folder is one run: pruning a run deletes what is inside it
    ("--out_dir inside another run's folder", ["--out_dir", "{out}/inner"], "run",
     "/run/inner: inside the run in {out}"),
    ("--out_dir holding another run's folder", [], "a run inside", "holds the run in {out}/old"),
    # which values made them cannot be told
    ("a run's parts without config.json", ["--lr", "0.01"], "run, config.json gone",
     "/run: holds a run's phase1/ but no config.json"),
    ("a run's parts without config.json, --resume", ["--resume"], "run, config.json gone",
     "/run: holds a run's phase1/ but no config.json"),
]


def prepare(tmp_path, files, cache_dir, flags, state):
    out = tmp_path / "run"
    if state == "file":
        out.write_text("a file\n")
    elif state and state.startswith("run"):
        hold_a_run(out, cache_dir)
        saved = json.loads((out / "config.json").read_text())
        if state == "run without lr":
            del saved["lr"]
            (out / "config.json").write_text(json.dumps(saved))
        elif state == "run, train rows changed":
            # as config.json records them: the digest of other rows than the file's now
            saved["data_digests"] = {"train_file": "0" * 64}
            (out / "config.json").write_text(json.dumps(saved))
        elif state.startswith("run, config.json's"):  # a value edited by hand
            name, value = state.split()[-1].split("=")
            saved[name] = json.loads(value)
            (out / "config.json").write_text(json.dumps(saved))
        elif state == "run, config.json cut":
            (out / "config.json").write_text(json.dumps(saved)[:100])
        step = out / "phase1" / "step_000002"
        damage = {"run, weights gone": lambda: os.remove(step / "model.safetensors"),
                  "run, state empty": lambda: os.truncate(step / "trainer_state.pt", 0),
                  "run, optimizer gone": lambda: shutil.rmtree(step / "optimizer"),
                  "run, config.json gone": lambda: os.remove(out / "config.json"),
                  "run, rlep.lock a folder": lambda: (out / "rlep.lock").mkdir(),
                  "run, metrics row without step": lambda: (out / "phase1" / "metrics.jsonl")
                  .write_text('{"step": 1}\n{"loss": 1}\n'),
                  "run, progress row without id": lambda: (
                      (out / "collect").mkdir(),
                      (out / "collect" / "progress.jsonl").write_text('{"successes": []}\n')),
                  "run, record's files a list": lambda: (step / "checkpoint.json").write_text(
                      '{"step": 2, "files": ["model.safetensors"]}'),
                  "run, record's sizes text": lambda: (step / "checkpoint.json").write_text(
                      '{"step": 2, "files": {"model.safetensors": "25"}}'),
                  "run, record empty, state gone": lambda: (
                      os.remove(step / "trainer_state.pt"),
                      (step / "checkpoint.json").write_text('{"step": 2, "files": {}}')),
                  "run, phase1 a file": lambda: (shutil.rmtree(out / "phase1"),
                                                 (out / "phase1").write_text("a file\n"))}
        damage.get(state, lambda: None)()
    elif state == "a run inside":
        hold_a_run(out / "old", cache_dir)
    elif state == "link to nothing":
        os.symlink(tmp_path / "nothing", out)
    elif state == "loop of links":
        os.symlink(out, out)
    flags = [f.replace(F, str(files)).replace("{out}", str(out)) for f in flags]
    return out, ["--preset", "tiny", "--out_dir", str(out), "--cache_dir", str(cache_dir), *flags]


@pytest.mark.parametrize("flags, state, message", [case[1:] for case in bad_inputs],
                         ids=[case[0] for case in bad_inputs])
def test_bad_input_is_refused_before_anything_is_written(tmp_path, files, cache_dir,
                                                         monkeypatch, capsys, flags, state,
                                                         message):
    out, command = prepare(tmp_path, files, cache_dir, flags, state)
    before = digest(out)
    monkeypatch.setattr(rlep, "build_engine", lambda *args: pytest.fail("an engine started"))
    # a flag's value out of its choices is argparse's: one line on stderr, exit 2
    with pytest.raises((UserError, SystemExit)) as error:
        rlep.main(command)
    line = str(error.value)
    if error.type is SystemExit:
        assert error.value.code == 2
        line = capsys.readouterr().err.strip()
    assert message.replace(F, str(files)).replace("{out}", str(out)) in line
    assert "\n" not in line
    assert digest(out) == before


exit_2_cases = ["missing data file", "--prompts_per_step 0", "--model_path missing",
                "--resume --lr changed", "--stop_token unknown",
                "--resume, the step's weights gone", "--out_dir inside another run's folder",
                "--resume, config.json's dtype float16"]


@pytest.fixture(scope="module")
def exits_2(tmp_path_factory, files, cache_dir):
    """`python rlep.py` on each case of exit_2_cases, all started at once: the first a process of
    its own (what the imports print is seen), the others forked from tests/forked.py's server
    (its imports done once): {case: (process, its stderr's file, its out_dir, the out_dir's digest
    before)}."""
    started = {}
    for case in exit_2_cases:
        _, flags, state, _ = next(c for c in bad_inputs if c[0] == case)
        folder = tmp_path_factory.mktemp("exit2")
        out, command = prepare(folder, files, cache_dir, flags, state)
        stderr = folder / "stderr.txt"
        if not started:
            with open(stderr, "w") as file:  # the child holds its own copy
                process = subprocess.Popen([sys.executable, os.path.join(repo, "rlep.py"),
                                            *command], stdout=subprocess.DEVNULL, stderr=file)
        else:
            process = forked.script(os.path.join(repo, "rlep.py"), command, str(stderr))
        started[case] = (process, stderr, out, digest(out))
    yield started
    for process, _, _, _ in started.values():
        process.kill()
        exit_code(process)


def exit_code(process, timeout=300):
    """The exit code of a process exits_2 started (a Popen or a forked one), once it ends."""
    if isinstance(process, subprocess.Popen):
        return process.wait(timeout=timeout)
    process.join(timeout)
    return process.exitcode


@pytest.mark.parametrize("case", exit_2_cases)
def test_python_rlep_py_prints_one_line_and_exits_2(exits_2, case):
    message = next(c for c in bad_inputs if c[0] == case)[3]
    process, stderr, out, before = exits_2[case]
    code = exit_code(process)
    lines = stderr.read_text().strip().splitlines()
    assert code == 2, "\n".join(lines[-40:])
    message = message.replace("{out}", str(out))
    assert len(lines) == 1 and lines[0].startswith("rlep.py: ") and message in lines[0]
    assert digest(out) == before


def test_argparse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exit_code:
        rlep.parse_config(["--preset", "nope"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_code.value.code == 2 and len(lines) == 1
    assert lines[0].startswith("rlep.py: argument --preset: invalid choice: 'nope'")


def test_a_refusal_on_rank_0_stops_both_ranks(tmp_path, cache_dir):
    """Rank 0 alone sees a full disk (a sitecustomize on the path fakes it): both ranks stop
    within seconds with its line, before an engine starts; nothing is written."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, shutil, collections\n"
        "if os.environ.get('RANK') == '0':\n"
        "    usage = collections.namedtuple('usage', 'total used free')\n"
        "    shutil.disk_usage = lambda path: usage(1 << 40, 1 << 40, 0)\n")
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", os.path.join(repo, "rlep.py"), "--preset", "tiny",
               "--out_dir", str(out), "--cache_dir", str(cache_dir)]
    start = time.time()
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode != 0
    assert time.time() - start < 120, "a rank waited for the other"
    # each rank's stop under torchrun: one line naming it (ranks.end_rank)
    line = re.compile(rf"rlep\.py: rank [01] stopped: --out_dir {re.escape(str(out))}: 0\.0 B free")
    lines = [x for x in result.stderr.splitlines() if line.match(x)]
    # both ranks print it (torchrun may stop the second before it does)
    assert 1 <= len(lines) <= 2 and "need" in lines[0], result.stderr[-3000:]
    assert "exitcode  : 2" in result.stderr
    assert not out.exists()


class FinishedRunsEngine:
    """The engine of a run with nothing left to do: started and stopped, never asked for more."""
    def sleep(self):
        pass

    def memory_line(self, preset=""):
        return "vLLM: a stand-in"

    def shutdown(self, wake=False):
        pass

    def __getattr__(self, name):
        pytest.fail(f"a finished run's engine was asked for {name}")


def test_a_changed_lr_is_refused_then_taken_with_override_and_recorded(tmp_path, cache_dir,
                                                                        tiny_run, monkeypatch,
                                                                        main_in_process):
    """A run of 2 steps (the shared tiny run's phase one to its step 2, as `--phase 1
    --phase1_steps 2 --val_every 0` leaves it); resumed with --lr 1e-3 and --phase1_steps 3:
    refused by the preflight, config.json untouched; with --override step 3 trains at lr 1e-3
    and config.json records both changes at the step they took effect."""
    out = tmp_path / "run"
    shutil.copytree(tiny_run / "phase1", out / "phase1",
                    ignore=shutil.ignore_patterns("step_000004", "*.jsonl"))
    saved = json.loads((tiny_run / "config.json").read_text())
    saved.update(phase="1", phase1_steps=2, val_every=0, out_dir=str(out))
    (out / "config.json").write_text(json.dumps(saved, indent=2))
    shutil.copy(tiny_run / "timings.json", out / "timings.json")  # one process so far
    for name in ("metrics.jsonl", "samples.jsonl"):
        rows = [json.loads(line) for line in open(tiny_run / "phase1" / name)]
        (out / "phase1" / name).write_text("".join(
            json.dumps({k: v for k, v in row.items() if not k.startswith("val_")}) + "\n"
            for row in rows if 1 <= row["step"] <= 2))
    base = ["--preset", "tiny", "--out_dir", str(out), "--cache_dir", str(cache_dir), "--phase",
            "1", "--val_every", "0"]
    before = digest(out)
    changed = ["--phase1_steps", "3", "--lr", "1e-3", "--resume"]
    with monkeypatch.context() as refusing:  # main_in_process's engine is lent again after it
        refusing.setattr(rlep, "build_engine", lambda *args: pytest.fail("an engine started"))
        with pytest.raises(UserError) as refused:
            rlep.main(base + changed)
    assert "--lr 0.0003 (now 0.001)" in str(refused.value)
    assert "--phase1_steps 2 (now 3)" in str(refused.value) and digest(out) == before
    main_in_process(base + changed + ["--override"])
    saved = json.load(open(out / "config.json"))
    assert saved["lr"] == 1e-3 and saved["phase1_steps"] == 3
    assert saved["overrides"] == [
        {"field": "lr", "from": 3e-4, "to": 1e-3, "phase1_step": 2, "phase2_step": 0},
        {"field": "phase1_steps", "from": 2, "to": 3, "phase1_step": 2, "phase2_step": 0}]
    rows = [json.loads(line) for line in open(out / "phase1" / "metrics.jsonl")]
    assert [(r["step"], r["lr"]) for r in rows] == [(1, 3e-4), (2, 3e-4), (3, 1e-3)]
    # the two processes' times add up
    timings = json.load(open(out / "timings.json"))
    assert timings["processes"] == 2 and timings["total_s"] > 0
    # the run now is the run with its new values: the same command resumes without a word
    monkeypatch.setattr(rlep, "build_engine", lambda *args: FinishedRunsEngine())
    rlep.main(base + ["--phase1_steps", "3", "--lr", "1e-3", "--resume"])
    assert json.load(open(out / "timings.json"))["processes"] == 3


def test_legal_but_surprising_settings_are_warned_about(capsys):
    cfg = rlep.parse_config(["--preset", "tiny", "--mini_batch_prompts", "8", "--replay_m",
                             "12"])
    warnings = preflight.check_config(cfg)
    assert any("one update a step, on-policy" in w for w in warnings)
    assert any("--replay_m 12 > --n 8" in w for w in warnings)
    assert preflight.check_config(rlep.parse_config(["--preset", "tiny"])) == []
    with pytest.raises(UserError, match="multiple of the 3 ranks"):
        preflight.check_config(rlep.parse_config(["--preset", "tiny"]), world_size=3)


def test_fields_free_on_resume_are_config_fields_and_auto_takes_the_runs_dtype():
    names = {f for f in asdict(rlep.parse_config([]))}
    assert preflight.free_on_resume <= names
    cfg = rlep.parse_config(["--preset", "tiny", "--resume", "--keep_checkpoints", "5"])
    saved = {**asdict(cfg), "dtype": "bfloat16", "keep_checkpoints": 2}
    assert cfg.dtype == "float32"
    cfg.dtype = "auto"
    assert preflight.resume_changes(cfg, saved, at={}) == []
    # a field the saved config lacks (deleted, or an older run's) is refused, the command's
    # value taken and recorded with --override; one free on resume is not compared
    del saved["seed"], saved["progress"]
    cfg.seed = 7
    with pytest.raises(UserError, match=r"config.json lacks --seed: restore them"):
        preflight.resume_changes(cfg, saved, at={})
    cfg.override = True
    assert preflight.resume_changes(cfg, saved, at={"phase1_step": 2}) == [
        {"field": "seed", "from": None, "to": 7, "phase1_step": 2}]


def test_a_dapo_pool_without_candidates_on_some_rows_says_how_many(tmp_path, capsys):
    def dapo(problem, candidates=None):
        reward = {"ground_truth": "1", **({"candidates": candidates} if candidates else {})}
        return {"prompt": [{"role": "user", "content": problem}], "reward_model": reward}
    rows = [dapo("a", ["Answer: 1"]), dapo("b"), dapo("c")]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "pool.parquet")
    assert [r["problem"] for r in data.load_pool(str(tmp_path / "pool.parquet"))] == ["a"]
    assert "2 rows without reward_model.candidates left out of the pool" in \
        capsys.readouterr().out


def test_ctrl_c_in_a_save_lets_it_finish_then_stops_at_once_in_one_line(tmp_path, cache_dir):
    """Ctrl-C as a terminal sends it (SIGINT to the process group, the verify workers too),
    landing in step 2's save (a sitecustomize holds the save's final rename until the test has
    sent it: there, however slow the machine): the save completes, no .tmp folder is left, the
    one line names step 2, saved, and the process ends after its exit handlers without Python's
    teardown (10 s and more of freeing torch's and vLLM's objects). A stop that broke into the
    save would leave step_000002.tmp and name no checkpoint."""
    site = tmp_path / "site"
    site.mkdir()
    # each process marks its exit handlers' run and its teardown (a module global freed then)
    (site / "sitecustomize.py").write_text(
        "import atexit, os, re, time\n"
        "mark = os.environ['SAVING_MARK']\n"
        "class Touch:\n"
        "    def __init__(self, name):\n"
        "        self.path = f'{mark}.{os.getpid()}.{name}'\n"
        "    def __call__(self):\n"
        "        open(self.path, 'w').close()\n"
        "    __del__ = __call__\n"
        "teardown = Touch('teardown')\n"
        "atexit.register(Touch('atexit'))\n"
        "replace = os.replace\n"
        "def slow_replace(src, dst):\n"
        "    if str(src).endswith('.tmp') and re.search(r'step_\\d+$', str(dst)):\n"
        "        open(mark, 'w').close()\n"
        "        deadline = time.time() + 120\n"
        "        while not os.path.exists(mark + '.sent') and time.time() < deadline:\n"
        "            time.sleep(0.05)\n"
        "    replace(src, dst)\n"
        "os.replace = slow_replace\n")
    out, mark = tmp_path / "run", tmp_path / "saving"
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "SAVING_MARK": str(mark)}
    command = [sys.executable, os.path.join(repo, "rlep.py"), "--preset", "tiny", "--out_dir",
               str(out), "--cache_dir", str(cache_dir), "--phase", "1", "--val_every", "0"]
    # a foreground job: a process group of its own, SIGINT at its default
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, env=env, process_group=0,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 300
    while not mark.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGINT)
    open(f"{mark}.sent", "w").close()
    _, stderr = process.communicate(timeout=120)
    lines = stderr.strip().splitlines()
    assert process.returncode == 130 and len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith(f"rlep.py: stopped (Ctrl-C) in phase1 step 2 of 4; saved in "
                               f"{out}: phase1 step 2; continue with: ")
    assert lines[0].endswith("--phase 1 --val_every 0 --resume")
    assert sorted(os.listdir(out / "phase1")) == ["metrics.jsonl", "samples.jsonl",
                                                  "step_000002"]
    assert os.path.exists(f"{mark}.{process.pid}.atexit")
    assert not os.path.exists(f"{mark}.{process.pid}.teardown")


def test_a_resume_on_changed_rows_is_refused_unless_override(tmp_path, files, cache_dir,
                                                             tiny_model):
    """config.json records the digest of each data file's rows; a --resume after an answer of
    the training file changed is refused, naming it; with --override the change is recorded."""
    train, out = tmp_path / "train.jsonl", tmp_path / "run"
    shutil.copy(files / "pool.jsonl", train)
    flags = ["--preset", "tiny", "--out_dir", str(out), "--cache_dir", str(cache_dir),
             "--train_file", str(train)]

    def check(*more):
        cfg = rlep.parse_config(flags + list(more))
        return preflight.check_start(cfg, tiny_model, 1, data.read_inputs(cfg), {},
                                     rlep.prompt_text, rlep.end_token_id)
    digests = check()[3]
    assert sorted(digests) == ["train_file", "val_file"]
    hold_a_run(out, cache_dir, "--train_file", str(train))
    saved = json.loads((out / "config.json").read_text())
    machinery.files.save_config(str(out), saved, {}, [], None, digests)
    assert check("--resume")[1] == []  # the same rows
    lines = train.read_text().splitlines()
    lines[0] = json.dumps({**json.loads(lines[0]), "answer": "999"})
    train.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=f"--resume: --train_file {train}: its rows are not "
                                        f"those the run in {out} read"):
        check("--resume")
    changes = check("--resume", "--override")[1]
    assert [(c["field"], c["from"]) for c in changes] == [("train_file rows",
                                                            digests["train_file"])]


def test_a_write_or_a_prune_that_fails_stops_in_one_line_naming_the_path(tmp_path, monkeypatch):
    """A full disk at a metrics write (/dev/full), the run folder deleted under the run (an
    append, a whole file's write), a checkpoint pruning cannot remove: RunStopped (one line, exit
    1), naming the path; a whole file's write leaves no temporary file."""
    for path in ("/dev/full", str(tmp_path / "deleted" / "metrics.jsonl")):
        with pytest.raises(RunStopped, match=f"^{path}: cannot write \\("):
            machinery.files.append_jsonl(path, [{"step": 1}])
    (tmp_path / "a_folder").mkdir()  # a folder where the file goes
    for path in (tmp_path / "deleted" / "config.json", tmp_path / "a_folder"):
        with pytest.raises(RunStopped, match=f"^{path}: cannot write \\("):
            machinery.files.write_atomic(str(path), "{}")
    # a figure, written by a function at the temporary path, the same way
    plot = tmp_path / "a_folder"
    with pytest.raises(RunStopped, match=f"^{plot}: cannot write \\("):
        report.save_plot(str(plot), {"val_acc": [("run", [0, 1], [0.1, 0.2], "-", 0)]}, "%")
    assert sorted(os.listdir(tmp_path)) == ["a_folder"]
    part = tmp_path / "phase1"
    for step in (1, 2, 3):
        folder = part / f"step_{step:06d}"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"weights")
        checkpoints.write_record(str(folder), step)

    def refused(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", path)
    monkeypatch.setattr(checkpoints.shutil, "rmtree", refused)
    with pytest.raises(RunStopped, match=r"step_000001: pruning cannot remove it \(Permission "):
        checkpoints.prune_checkpoints(str(part), 2, set())


def test_a_step_folder_of_other_digits_is_not_a_checkpoint(tmp_path):
    """"²" is a digit to str.isdigit, not to int(): a folder step_² is not a step's."""
    for name in ("step_000002", "step_²", "step_٣"):
        (tmp_path / name).mkdir()
    assert checkpoints.step_folders(str(tmp_path)) == [2]


def test_a_stop_names_the_part_it_stopped_in(tmp_path, monkeypatch):
    """Between the collection and phase two's first step (the policy loaded, the base model
    validated) a stop is in phase two's start, not "in the collection"."""
    cfg = rlep.parse_config(["--preset", "tiny", "--out_dir", str(tmp_path)])
    rows = data.read_rows(cfg.train_file)
    run = rlep.RunState()
    run.stage = "the collection"

    def stopped(*args):
        raise KeyboardInterrupt("Ctrl-C")
    monkeypatch.setattr(rlep, "build_policy", stopped)
    cpu = ranks.Dist(False, 0, 1, torch.device("cpu"), True)
    with pytest.raises(KeyboardInterrupt):
        rlep.train(cfg, "phase2", rows, None, None, 0, "base", cpu, [], replay=True,
                   run=run)
    assert run.stage == "phase2, before step 1"


def test_a_bom_is_read_and_one_id_names_one_problem(tmp_path):
    rows = [{"id": f"p{i}", "problem": f"{i}+1", "answer": str(i + 1)} for i in range(3)]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "plain.jsonl").write_text(text)
    # as an editor saving "UTF-8 with BOM" writes it
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert data.read_rows(str(tmp_path / "bom.jsonl")) == rows
    assert data.read_rows(str(tmp_path / "plain.jsonl")) == rows
    # a problem's rows under its id (DAPO's file repeats each one): the first, as before
    (tmp_path / "twice.jsonl").write_text(text + json.dumps({**rows[1], "answer": "9"}) + "\n")
    assert data.read_rows(str(tmp_path / "twice.jsonl")) == rows
    # one id, another problem: refused with both rows
    (tmp_path / "other.jsonl").write_text(text + json.dumps({**rows[1], "problem": "9+9"}) + "\n")
    with pytest.raises(UserError, match=r"other.jsonl: rows 2 and 4: both have id 'p1', "
                                             r"with other problems"):
        data.read_rows(str(tmp_path / "other.jsonl"))


def test_a_pool_the_training_prompts_miss_and_cut_prompts_are_warned_about_once(
        tmp_path, files, cache_dir, tiny_model, capsys):
    """--phase2_prompts all visits the training prompts: a pooled prompt that is not one of
    them is never replayed (here none is: the baseline again). One warning line each."""
    train = data.read_rows(str(files / "pool.jsonl"))
    renamed = [{**row, "id": f"other-{row['id']}"} for row in train[:10]]
    pool_path = tmp_path / "pool.jsonl"
    pool_path.write_text("".join(json.dumps(r) + "\n" for r in renamed + train[10:15]))
    flags = ["--preset", "tiny", "--out_dir", str(tmp_path / "run"), "--cache_dir",
             str(cache_dir), "--phase", "2", "--pool", str(pool_path), "--train_file",
             str(files / "pool.jsonl")]
    def check(cfg):
        preflight.check_start(cfg, tiny_model, 1, data.read_inputs(cfg), {}, rlep.prompt_text,
                              rlep.end_token_id)
    check(rlep.parse_config(flags + ["--phase2_prompts", "all"]))
    warnings = [x for x in capsys.readouterr().err.splitlines() if "warning" in x]
    assert warnings == [
        f"rlep.py: warning: --pool {pool_path}: 10 of its 15 prompts are not in --train_file "
        f"{files / 'pool.jsonl'} (matched by id): with --phase2_prompts all their answers are "
        "never replayed"]
    # phase two on the pool's own prompts: nothing to say
    check(rlep.parse_config(flags))
    assert "warning" not in capsys.readouterr().err

    # prompts longer than --max_prompt_len: counted by tokenizing each in full
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rows = [{"id": str(i), "problem": "1+" * i + "1", "answer": str(i + 1)} for i in range(40)]
    lengths = [len(rlep.render_prompt(tokenizer, row, "{problem}", 10**6)) for row in rows]
    cfg = rlep.parse_config(["--preset", "tiny", "--max_prompt_len", "40"])
    expected = sum(length > 40 for length in lengths)
    assert 0 < expected < len(rows)
    preflight.warn_cut_prompts({"training": rows, "validation": rows[:3], "pooled": None},
                               tokenizer, cfg.max_prompt_len, cfg.prompt_template,
                               rlep.prompt_text)
    assert capsys.readouterr().err.splitlines() == [
        f"rlep.py: warning: --max_prompt_len 40: {expected} of 40 training prompts are longer, "
        "cut from the left (their start is lost)"]


def rank_pids(out):
    """{pid: RANK} of the live processes running rlep.py on `out` under torchrun (a process a
    rank forked counts as that rank: it shares the rank's open files)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        ranks = [v[5:].decode() for v in environ if v.startswith(b"RANK=")]
        if str(out).encode() in command and ranks:
            found[int(pid)] = int(ranks[0])
    return found


def ended(pid):
    try:
        return "\nState:\tZ" in open(f"/proc/{pid}/status").read()
    except FileNotFoundError:
        return True


def test_a_second_writer_is_refused_while_orphaned_torchrun_ranks_hold_the_run(
        tmp_path, cache_dir, monkeypatch):
    """torchrun starts each rank in a session of its own: a SIGKILL of the launcher's process
    group (a scheduler's kill, a closed terminal) leaves the ranks running, writing the run.
    A --resume meanwhile is refused, naming rank 0's pid; nothing of it runs."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", os.path.join(repo, "rlep.py"), "--preset", "tiny",
               "--out_dir", str(out), "--cache_dir", str(cache_dir), "--phase", "1",
               "--phase1_steps", "50", "--val_every", "0"]
    launcher = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    ranks = {}  # pid: RANK
    try:
        # a launcher killed mid-run: its ranks past the preflight, rank 0 holding the folder and
        # config.json written (the engines, the steps still to come)
        deadline = time.time() + 300
        while not (out / "config.json").exists():
            assert launcher.poll() is None and time.time() < deadline, "no config.json"
            time.sleep(0.05)
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
        ranks = rank_pids(out)
        assert sorted(set(ranks.values())) == [0, 1], "the ranks did not outlive their launcher"
        monkeypatch.setattr(rlep, "build_engine", lambda *args: pytest.fail("a second writer"))
        with pytest.raises(UserError) as error:
            rlep.main(["--preset", "tiny", "--out_dir", str(out), "--cache_dir",
                       str(cache_dir), "--phase", "1", "--phase1_steps", "50", "--val_every",
                       "0", "--resume"])
        holder = int(re.search(r"in use by pid (\d+) on ", str(error.value)).group(1))
        assert ranks.get(holder) == 0  # rank 0 named
        os.kill(holder, 0)  # alive: the holder, still writing
    finally:
        ranks.update(rank_pids(out))
        for pid in ranks:
            os.kill(pid, signal.SIGKILL)
    # the kernel lets go of the lock with its holder: once the last of its threads has exited,
    # which can be after its main thread shows as a zombie (a rank's many threads, its memory)
    deadline = time.time() + 60
    while not all(ended(pid) for pid in ranks) and time.time() < deadline:
        time.sleep(0.1)
    while True:
        try:
            machinery.files.hold_run_folder(str(out))
            break
        except UserError:
            assert time.time() < deadline, "the lock outlived its holder's death by a minute"
            time.sleep(0.2)


def test_a_given_pools_wrong_answers_are_left_out_with_a_warning(files, capsys):
    """RLEP replays verified answers: a pool given with --pool is checked by the run's rule,
    as the collection's is; its wrong answers go (and a prompt left with none), in one line."""
    cfg = rlep.parse_config(["--preset", "tiny", "--pool", str(files / "pool_wrong.jsonl")])
    pool = data.load_pool(cfg.pool)
    kept = rlep.verified_pool(pool, cfg)
    assert [row["id"] for row in kept] == [row["id"] for row in pool[1:]]
    assert all(row["responses"] == pool[i + 1]["responses"] for i, row in enumerate(kept))
    assert capsys.readouterr().err.splitlines() == [
        f"rlep.py: warning: --pool {cfg.pool}: 2 of its answers are wrong under --verify_mode "
        "equivalence: left out (1 of its 67 prompts left with none)"]
    assert rlep.verified_pool(kept, cfg) == kept and capsys.readouterr().err == ""


@pytest.mark.parametrize("script", ["rlep.py", "eval.py"])
def test_ctrl_c_while_the_script_starts_is_one_line(tmp_path, cache_dir, script):
    """Its imports take seconds: a Ctrl-C then (or, on a fast machine, in main's start) ends it
    in one line, exit 130, nothing written."""
    out = tmp_path / "out"
    flags = {"rlep.py": ["--preset", "tiny", "--cache_dir", str(cache_dir)],
             "eval.py": ["--model", os.path.join(str(cache_dir), "tiny"), "--data", "x.jsonl"]}
    process = subprocess.Popen([sys.executable, os.path.join(repo, script), *flags[script],
                                "--out_dir", str(out)], stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    lines = stderr.strip().splitlines()
    assert process.returncode == 130 and len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith(f"{script}: stopped (Ctrl-C)") and "nothing written" in lines[0]
    assert not out.exists()


def test_a_diverged_run_stops_in_one_line_before_any_save(tmp_path, cache_dir):
    """--lr 1e30: the first update's weights are garbage, its next gradient not finite. The run
    stops at that step with exit 1 and one line naming the step and the learning rate; no
    checkpoint holds the diverged weights (the tiny preset saves at step 2)."""
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, os.path.join(repo, "rlep.py"), "--preset", "tiny",
                             "--out_dir", str(out), "--cache_dir", str(cache_dir), "--phase",
                             "1", "--val_every", "0", "--lr", "1e30"],
                            capture_output=True, text=True, timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr[-3000:]
    assert re.match(r"rlep.py: phase1 step 1: the update diverged \(grad_norm nan", lines[0])
    assert "--lr 1e+30" in lines[0] and "no checkpoint was saved before it" in lines[0]
    assert checkpoints.step_folders(str(out / "phase1")) == []


@pytest.mark.parametrize("rope, context", [
    (None, 512), ({"rope_type": "linear", "factor": 2.0}, 1024),
    ({"rope_type": "dynamic", "factor": 4.0}, 2048),
    # YaRN's max_position_embeddings is scaled already: vLLM does not apply its factor again
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}, 512)])
def test_the_context_is_vllms_own_rope_scaling_included(tmp_path, tiny_model, rope, context):
    """The preflight's context of a model against vLLM's ModelConfig on the same folder; a
    scaled one takes a prompt and response the plain one refuses."""
    from transformers import AutoConfig
    from vllm.config import ModelConfig
    folder = tmp_path / "model"
    shutil.copytree(tiny_model, folder)
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {**config["rope_parameters"], **(rope or {})}
    (folder / "config.json").write_text(json.dumps(config))
    derived = preflight.model_context(AutoConfig.from_pretrained(folder))
    assert derived[0] == ModelConfig(model=str(folder)).max_model_len == context
    cfg = rlep.parse_config(["--preset", "tiny", "--max_prompt_len", "400", "--max_response_len",
                             "200"])
    if context < 600:
        with pytest.raises(UserError, match=f"600 tokens: over the model's context, {context}"):
            preflight.check_context(cfg, AutoConfig.from_pretrained(folder))
    else:
        preflight.check_context(cfg, AutoConfig.from_pretrained(folder))


@pytest.mark.parametrize("package", ["vllm", "pydantic"])
def test_a_missing_package_is_one_line_naming_it_before_anything_is_written(tmp_path, monkeypatch,
                                                                           package):
    """The GPU image a machine may be lent with lacks vLLM and pydantic: a run says so first."""
    find_spec = rlep.importlib.util.find_spec
    monkeypatch.setattr(rlep.importlib.util, "find_spec",
                        lambda name: None if name == package else find_spec(name))
    with pytest.raises(UserError) as error:
        rlep.main(["--preset", "tiny", "--out_dir", str(tmp_path / "run")])
    assert str(error.value) == (f"{package} is not installed: pip install -r requirements.txt "
                                "(on a CPU, requirements-cpu.txt)")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("cuda, needs", [
    (None, "is built without CUDA: pip install -r requirements.txt"),
    ("13.0", "is built for CUDA 13.0 and finds no working GPU: CUDA 13.0 needs NVIDIA driver 580 "
             "or later (nvidia-smi shows the driver)"),
    ("12.8", "is built for CUDA 12.8 and finds no working GPU: CUDA 12.8 needs a driver that "
             "supports CUDA 12.8 (nvidia-smi shows the driver)")])
@pytest.mark.parametrize("preset", ["gpu", "node"])
def test_a_gpu_preset_where_cuda_does_not_work_is_one_line_before_anything_is_written(
        tmp_path, monkeypatch, preset, cuda, needs):
    """This machine has no GPU: a GPU preset is refused, naming torch's CUDA and the driver it
    needs, where the ranks would have fallen back to the CPU."""
    assert not torch.cuda.is_available()
    monkeypatch.setattr(torch.version, "cuda", cuda)
    with pytest.raises(UserError) as error:
        rlep.main(["--preset", preset, "--out_dir", str(tmp_path / "run"), "--cache_dir",
                   str(tmp_path / "cache")])
    assert str(error.value) == f"--preset {preset}: torch {torch.__version__} {needs}"
    assert not os.listdir(tmp_path)
