r"""
eval.py: avg@k and pass@k of a checkpoint, or of every checkpoint of a run, on math benchmarks
(AIME-2024, AIME-2025, AMC-2023, MATH-500: JSONL or parquet, DAPO schema or {"problem", "answer"}).
The protocol is the paper's (docs/paper.md: Evaluation protocol): k = 32 samples per problem at
temperature 1.0 and top-p 1.0, up to 3072 new tokens, the training prompt template, ending at the
EOS (or --stop_token) as in training. avg@k: the mean accuracy over all (problem, sample) pairs;
pass@k: the unbiased estimate of solving a problem with at least one of k samples. Duplicated rows
(DAPO's AIME file repeats each problem 32x) count once.
Both rules of verify.py grade every response (so no --verify_mode): "dapo", the paper's exact match
of the last `Answer:` line in the last 300 characters (a \boxed{}-only answer is wrong), and
"equivalence", our checker. Records hold "correct": {"dapo": [...], "equivalence": [...]};
results.json per benchmark {"dapo": {avg@k, pass@1, ...}, "equivalence": {...}, "mean_length",
"no_answer" (none extracted by the equivalence checker)}; the table a row per rule, "paper (dapo)"
and "equivalence": their gap is what the string match under-counts.
Outputs, in --out_dir (a subfolder per checkpoint when there are several): samples.jsonl,
results.json, settings.json, curve.csv (+ curve.png) of avg@k against training step. Re-running
skips finished problems.
    python eval.py --model runs/paper/phase2/step_000320 \
        --data aime-2024.parquet --data aime-2025.parquet
    torchrun --standalone --nproc_per_node=8 eval.py --run_dir runs/paper --data aime-2024.parquet
    python eval.py --model Kwai-Klear/qwen2.5-math-rlep --data hf://datasets/ORG/NAME/FILE
    python eval.py --compare runs/seed1 runs/seed2  # report.comparison_table and compare.png
"""
if __name__ == "__main__":
    # Ctrl-C and SIGTERM from the first line: the imports below take seconds
    from machinery import interrupts
    interrupts.catch_stops()
import rlep  # first: it sets vLLM's environment before torch is imported

import argparse
import csv
import glob
import json
import math
import os
import re
import sys

import numpy as np
import torch
from tqdm import tqdm
from transformers import AutoTokenizer

from machinery import (RunStopped, UserError, checkpoints, data, files, fsdp, hub, interrupts,
                       preflight, ranks, report)
import verify

# verify.verify's modes, and their names in tables
rules = {"dapo": "paper (dapo)", "equivalence": "equivalence"}


# --------------------------------------------------------------------------------------------------
# Metrics

def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k)
    (Chen et al., 2021). The ratio is prod_{i=n-c+1}^{n} (1 - k/i): no huge binomials, and 0 when
    n - c < k (the factor i = k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def summarize(records: list[dict], ks: list[int] | None = None) -> dict:
    """Benchmark metrics from samples.jsonl records: under each rule, avg@n over all (problem,
    sample) pairs and mean pass@k over problems; the mean response length in tokens (stop token
    included); the share of responses with no answer the equivalence checker can extract."""
    n = min(len(r["lengths"]) for r in records)
    metrics = {"problems": len(records), "samples_per_problem": n}
    ks = ks or [2 ** i for i in range(int(math.log2(n)) + 1)]  # 1, 2, 4, ..., n
    for rule in rules:
        verdicts = [r["correct"][rule] for r in records]
        metrics[rule] = {f"avg@{n}": float(np.mean([c for v in verdicts for c in v]))}
        for k in ks:
            pass_rates = [pass_at_k(len(v), sum(v), k) for v in verdicts]
            metrics[rule][f"pass@{k}"] = float(np.mean(pass_rates))
    lengths = [length for r in records for length in r["lengths"]]
    metrics["mean_length"] = float(np.mean(lengths))
    metrics["no_answer"] = float(np.mean([a is None for r in records for a in r["answers"]]))
    return metrics


def format_table(results: dict) -> str:
    """A markdown table, one row per benchmark and rule; accuracies in percent."""
    metric_names = list(next(iter(results.values()))[next(iter(rules))])
    header = ["benchmark", "rule", "problems", *metric_names, "mean length", "no answer"]
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for name, m in results.items():
        for rule, label in rules.items():
            accuracies = [f"{100 * m[rule][k]:.1f}" for k in metric_names]
            cells = [name, label, str(m["problems"]), *accuracies]
            cells += [f"{m['mean_length']:.1f}", f"{100 * m['no_answer']:.1f}%"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Sampling, chunk by chunk, appended to samples.jsonl so that a stopped evaluation resumes

def load_benchmarks(paths: list[str], cache_dir: str = ".cache/rlep") -> dict[str, list[dict]]:
    """{file name without extension: de-duplicated rows}, read before any engine starts."""
    benchmarks = {}
    for path in paths:
        rows = data.read_rows(path, cache_dir=cache_dir)
        stem = os.path.basename(path).split(".")[0]
        sources = list(dict.fromkeys(row.get("data_source") for row in rows))
        # a file of several data sources (RLEP's AIME-24 + AIME-25 + AMC-23) is split
        for source in sources:
            name = stem if len(sources) == 1 else f"{stem}/{source}"
            if name in benchmarks:
                raise ValueError(
                    f"{path}: another data file is also called {name!r}; rename one of them")
            benchmarks[name] = [row for row in rows if row.get("data_source") == source]
    return benchmarks


def make_config(args, model_dir: str, config) -> rlep.Config:
    """The engine and sampling settings, with new tokens clamped so prompt + response fit the
    model's context as vLLM derives it (Qwen2.5-Math-7B: 1024 + 3072 = 4096, the paper's). A
    context shorter than twice the prompt budget is halved between them, with a warning."""
    context, _ = preflight.model_context(config)
    prompt_len = min(args.max_prompt_len, context // 2)
    new_tokens = min(args.max_new_tokens, context - prompt_len)
    if (prompt_len, new_tokens) != (args.max_prompt_len, args.max_new_tokens) and master():
        preflight.warn(f"{model_dir}: a context of {context} tokens: prompts get {prompt_len} "
                       f"(--max_prompt_len {args.max_prompt_len}), responses {new_tokens} "
                       f"(--max_new_tokens {args.max_new_tokens})", "eval.py")
    # equivalence, the costly rule, grades in sample_and_grade rank by rank; grade_both adds dapo
    return rlep.Config(
        model_path=model_dir, temperature=args.temperature, top_p=args.top_p,
        max_prompt_len=prompt_len, max_response_len=new_tokens, stop_token=args.stop_token,
        prompt_template=args.prompt_template, verify_mode="equivalence", seed=args.seed,
        dtype=args.dtype, gpu_memory_utilization=args.gpu_memory_utilization)


def master() -> bool:
    """Rank 0 of a torchrun job, or the one process: the rank that prints warnings."""
    return os.environ.get("RANK", "0") == "0"


def settings_of(cfg: rlep.Config, args, name: str) -> dict:
    """What samples.jsonl's records depend on: another evaluation's may not be added to them.
    name: the model as given (a hub name's folder is in the cache)."""
    model = os.path.abspath(name) if os.path.exists(name) else name
    return {"model": model, "k": args.k, "temperature": cfg.temperature, "top_p": cfg.top_p,
            "max_new_tokens": cfg.max_response_len, "max_prompt_len": cfg.max_prompt_len,
            "seed": cfg.seed, "prompt_template": cfg.prompt_template,
            "stop_token": cfg.stop_token, "rules": list(rules)}


def check_settings(out_dir: str, settings: dict):
    """Refuse to add samples of other settings to an output folder's samples.jsonl, and a
    samples.jsonl or settings.json edited or damaged (a record without the keys the results are
    made of)."""
    samples_path = os.path.join(out_dir, "samples.jsonl")
    keys = {"benchmark": str, "id": str, "correct": dict, "lengths": list, "answers": list}
    for i, record in enumerate(files.read_jsonl(samples_path), start=1):
        for key, kind in keys.items():
            if not isinstance(record, dict) or not isinstance(record.get(key), kind):
                raise UserError(f"{samples_path}: row {i}: no {key!r} ({kind.__name__}), which "
                                "eval.py writes: remove the row (its problem is sampled again)")
    settings_path = os.path.join(out_dir, "settings.json")
    try:
        old = json.load(open(settings_path)) if os.path.isfile(settings_path) else settings
    except ValueError as e:
        raise UserError(f"{settings_path}: not valid JSON ({e}): restore it, or use another "
                        "--out_dir") from None
    if not isinstance(old, dict):
        raise UserError(f"{settings_path}: not a JSON object of eval.py's settings: restore it, "
                        "or use another --out_dir")
    # an older eval.py named the equivalence rule "default"
    old["rules"] = ["equivalence" if r == "default" else r for r in old.get("rules", [])]
    changed = sorted(key for key in settings if old.get(key) != settings[key])
    if changed:
        raise UserError(f"{out_dir}: samples made with other settings "
                        f"({', '.join(changed)}); use another --out_dir")


def grade_both(record: dict) -> dict:
    """A sample_and_grade record (graded by the equivalence checker) with both rules' verdicts."""
    paper = [verify.verify(t, record["gold"], mode="dapo") for t in record["responses"]]
    return {**record, "correct": {"dapo": paper, "equivalence": record["correct"]}}


def renamed(record: dict) -> dict:
    """A record as an older eval.py wrote it, its equivalence verdicts under "default"."""
    correct = record["correct"]
    if "default" in correct:
        correct["equivalence"] = correct.pop("default")
    return record


def evaluate(model_dir: str, benchmarks: dict, cfg: rlep.Config, settings: dict, args,
             d: ranks.Dist, out_dir: str, engine=None):
    """Sample args.k responses per unfinished problem into samples.jsonl, write results.json.
    Returns the results and the engine (built once, then reused with each model's weights).
    cfg, settings: the preflight's (make_config, settings_of)."""
    samples_path = os.path.join(out_dir, "samples.jsonl")
    settings_path = os.path.join(out_dir, "settings.json")
    # read_jsonl drops a killed run's torn last line; rank 0 rewrites the file without it
    # rank 0's reading for every rank: one seeing an older file would sample other chunks
    # rank 0 keeps the records; the others need only which problems are finished
    done = {}
    if d.master_process:
        done = {(r["benchmark"], r["id"]): renamed(r) for r in files.read_jsonl(samples_path)}
    finished = ranks.rank0_decides(lambda: set(done), d)
    if d.master_process:
        os.makedirs(out_dir, exist_ok=True)
        files.write_atomic(settings_path, json.dumps(settings, indent=2))
        files.write_atomic(samples_path, "".join(json.dumps(r) + "\n" for r in done.values()))
    todo = {name: [row for row in rows if (name, row["id"]) not in finished]
            for name, rows in benchmarks.items()}
    if any(todo.values()):
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        stop_ids = [rlep.end_token_id(tokenizer, cfg.stop_token)]  # vLLM also stops on EOS ids
        if engine is None:
            engine = rlep.build_engine(cfg, model_dir, d)
        else:
            # one engine per process: tearing one down closes the process group that torchrun's
            # ranks share. Loading also drops the cached prompt KV of the previous weights.
            engine.push(path=model_dir)
    for name, rows in todo.items():
        chunks = range(0, len(rows), args.chunk_problems)
        desc = f"{name} ({len(rows)} to sample)"
        for start in tqdm(chunks, desc=desc, disable=not d.master_process or not rows):
            chunk = rows[start:start + args.chunk_problems]
            # seeds depend on the row only: a resumed run samples what an uninterrupted one would
            records = rlep.sample_and_grade(engine, tokenizer, chunk, args.k, cfg, stop_ids, d,
                                            (cfg.seed, "eval"))
            records = [{"benchmark": name, **grade_both(r)} for r in records]
            if d.master_process:
                files.append_jsonl(samples_path, records)  # a kill now loses nothing sampled
            done.update(((name, r["id"]), r) for r in records)
    if not d.master_process:  # rank 0 alone has the records
        return {}, engine
    results = {name: summarize([done[(name, row["id"])] for row in rows])
               for name, rows in benchmarks.items()}
    files.write_atomic(os.path.join(out_dir, "results.json"), json.dumps(results, indent=2))
    return results, engine


def architecture(config) -> list:
    keys = ("architectures", "vocab_size", "hidden_size", "num_hidden_layers",
            "intermediate_size", "max_position_embeddings")
    return [getattr(config, key, None) for key in keys]


# --------------------------------------------------------------------------------------------------
# Curves: avg@k of checkpoints against training step; baseline vs RLEP validation curves

def checkpoint_step(model_dir: str) -> int | None:
    # 'runs/paper/phase2/step_000320' -> 320
    match = re.fullmatch(r"step_(\d+)", os.path.basename(os.path.normpath(model_dir)))
    return int(match.group(1)) if match else None


def run_checkpoints(run_dir: str) -> list[str]:
    """Every finished checkpoint of an rlep.py run (a crashed save's .tmp folder is skipped)."""
    candidates = glob.glob(os.path.join(run_dir, "phase*", "step_*"))
    found = [p for p in candidates if checkpoint_step(p) is not None]
    if not found:
        raise ValueError(f"{run_dir}: no checkpoints (phase*/step_NNNNNN folders)")
    return sorted(found, key=lambda p: (os.path.dirname(p), checkpoint_step(p)))


def write_curve(out_dir: str, results_by_model: dict, k: int) -> str:
    """curve.csv (one row per checkpoint, one avg@k column per benchmark and rule) and curve.png
    (a panel per benchmark, a colour per phase; the paper's rule dashed, the equivalence checker
    solid), as the paper's figures."""
    metric = f"avg@{k}"
    benchmarks = list(next(iter(results_by_model.values())))
    columns = [(b, rule) for b in benchmarks for rule in rules]
    points = [(os.path.basename(os.path.dirname(os.path.normpath(m))), checkpoint_step(m), m, r)
              for m, r in results_by_model.items() if checkpoint_step(m) is not None]
    header = ["phase", "step", "model"] + [f"{b} {rule} {metric}" for b, rule in columns]
    with open(os.path.join(out_dir, "curve.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for phase, step, model, r in points:
            writer.writerow([phase, step, model] + [r[b][rule][metric] for b, rule in columns])

    panels = {b: [] for b in benchmarks}
    for i, phase in enumerate(sorted({p[0] for p in points})):
        steps = [step for ph, step, _, _ in points if ph == phase]
        for b, rule in columns:
            values = [r[b][rule][metric] for ph, _, _, r in points if ph == phase]
            style = "--" if rule == "dapo" else "-"
            panels[b].append((f"{phase} {rules[rule]}", steps, values, style, i))
    return report.save_plot(os.path.join(out_dir, "curve.png"), panels, f"{metric} (%)")


def compare(run_dirs: list[str], out_png: str) -> str:
    """rlep.py's baseline-vs-RLEP table of finished runs and their validation curves (the
    figure a run draws at its end, report.plot_comparison), for several runs at once."""
    table = report.comparison_table(run_dirs)  # before any folder is made
    os.makedirs(os.path.dirname(out_png), exist_ok=True)
    return f"{table}\n\n{report.plot_comparison(run_dirs, out_png)}\n"


# each number's range, as preflight.number_ranges: vLLM's sampling bounds (it raises a T below
# 0.01 to 0.01); a sample, a token, a chunk at least one
number_ranges = {">= 1": "k max_new_tokens max_prompt_len chunk_problems", ">= 0": "seed",
                 "<= 2147483647": "seed",
                 "> 0": "top_p gpu_memory_utilization", ">= 0.01": "temperature",
                 "<= 1": "top_p gpu_memory_utilization", "<= 2": "temperature",
                 f"<= {preflight.max_samples}": "k"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="avg@k and pass@k of checkpoints on math benchmarks")
    parser.error = lambda message: parser.exit(2, f"eval.py: {message} (see --help)\n")
    parser.add_argument("--model", action="append", default=[],
                        help="model or checkpoint folder, or a hub name (repeatable)")
    parser.add_argument("--run_dir", action="append", default=[],
                        help="an rlep.py run: all its checkpoints")
    parser.add_argument("--data", action="append", default=[],
                        help="benchmark .jsonl/.parquet file (repeatable)")
    parser.add_argument("--compare", nargs="+", metavar="RUN_DIR",
                        help="only compare baseline and RLEP curves")
    parser.add_argument("--out_dir", default="runs/eval")
    parser.add_argument("--cache_dir", default=".cache/rlep",
                        help="where a hub data file in pieces is joined (rlep.py's)")
    parser.add_argument("--k", type=int, default=32, help="samples per problem")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top_p", type=float, default=1.0)
    parser.add_argument("--max_new_tokens", type=int, default=3072,
                        help="clamped to the model's context")
    parser.add_argument("--max_prompt_len", type=int, default=1024)
    parser.add_argument("--prompt_template", default=rlep.dapo_template,
                        help="for plain {problem, answer} rows")
    parser.add_argument("--stop_token", default="",
                        help="as rlep.py's: '' ends responses at the tokenizer's EOS")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                        help="auto: bfloat16 on a GPU; on a CPU the faster of float32 and "
                             "bfloat16, measured (fsdp.resolve_dtype)")
    parser.add_argument("--gpu_memory_utilization", type=float, default=0.85,
                        help="vLLM's share of the GPU (no trainer beside it: rlep.py's 0.55)")
    parser.add_argument("--chunk_problems", type=int, default=64,
                        help="problems sampled between two saves")
    args = parser.parse_args(argv)
    if not args.compare and not (args.data and (args.model or args.run_dir)):
        parser.error("give --data and --model or --run_dir (or --compare RUN_DIR ...)")
    return args


def main(argv=None):
    args = parse_args(argv)
    # the preflight: bad input raises UserError here, before anything is written or any engine
    # starts
    try:
        if args.compare:  # finished runs only: no engine
            print(compare(args.compare, os.path.join(args.out_dir, "compare.png")))
            return
        preflight.check_ranges(vars(args), number_ranges)
        preflight.check_template(args.prompt_template)
        benchmarks = load_benchmarks(args.data, args.cache_dir)
        names = args.model + [p for run_dir in args.run_dir for p in run_checkpoints(run_dir)]
        # a hub name (namespace/name, no folder here) is fetched once into huggingface_hub's
        # cache and read there; tables and settings.json keep the name
        folders = [hub.model_folder(name, args.cache_dir, build=False) for name in names]
        # a checkpoint of rlep.py's proves it is whole by its record
        for folder in folders:
            record = os.path.isfile(os.path.join(folder, "checkpoint.json"))
            if record and (what := checkpoints.damage(folder, weights_only=True)):
                raise UserError(f"{folder}: damaged, {what}")
        # whole model folders, whose tokenizer renders the prompts and ends the responses
        def end_token(tokenizer):
            return rlep.end_token_id(tokenizer, args.stop_token)
        models = [preflight.check_model(folder, "--model" if name in args.model else "--run_dir",
                                        end_token) for name, folder in zip(names, folders)]
        if len({repr(architecture(config)) for _, config in models}) > 1:  # one engine
            raise ValueError("the models differ in architecture: evaluate them in separate calls")
        # several checkpoints: one subfolder each, named like the run's phase*/step_* folders
        subs = [""]
        if len(names) > 1:
            subs = [os.path.join(*os.path.normpath(m).split(os.sep)[-2:]) for m in names]
        if len(set(subs)) < len(subs):
            raise ValueError(f"two models would share an output folder: {subs}")
        cfgs = [make_config(args, folder, config) for folder, (_, config) in zip(folders, models)]
        settings = [settings_of(cfg, args, name) for cfg, name in zip(cfgs, names)]
        for sub, wanted in zip(subs, settings):
            check_settings(os.path.join(args.out_dir, sub), wanted)
        tokenizer = models[0][0]
        preflight.check_prompts(benchmarks, tokenizer, args.prompt_template, rlep.prompt_text)
        if master():
            preflight.warn_cut_prompts(benchmarks, tokenizer, cfgs[0].max_prompt_len,
                                       args.prompt_template, rlep.prompt_text, "eval.py")
        for path, flag in ((args.out_dir, "--out_dir"), (args.cache_dir, "--cache_dir")):
            preflight.check_folder(path, flag)
    except OSError as e:  # a hub name offline, a folder --compare cannot make
        raise UserError(str(e).splitlines()[0]) from None
    except ValueError as e:
        raise UserError(str(e)) from None
    d = ranks.setup_distributed()
    # bf16 where it is faster (measured on a CPU); the ranks take rank 0's choice
    dtype = ranks.rank0_decides(lambda: fsdp.resolve_dtype(args.dtype, d.device, folders[0]), d)
    engine = None
    try:
        results_by_model = {}
        for name, folder, sub, cfg, wanted in zip(names, folders, subs, cfgs, settings):
            cfg.dtype = dtype.dtype
            out_dir = os.path.join(args.out_dir, sub)
            results, engine = evaluate(folder, benchmarks, cfg, wanted, args, d, out_dir, engine)
            results_by_model[name] = results
            if d.master_process:
                print(f"\n{name} (k={args.k}, both rules)\n{format_table(results)}")
        if len(names) > 1 and d.master_process:
            print(write_curve(args.out_dir, results_by_model, args.k))
    finally:
        # vLLM's teardown closes its process groups, torchrun's shared one included
        if engine is not None:
            engine.shutdown()
        if d.distributed and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    interrupts.catch_stops("eval.py")  # main runs: a stop raises there
    try:
        main()
    except UserError as e:  # bad input: one line; any other error keeps its traceback
        print(f"eval.py: {e}", file=sys.stderr)
        sys.exit(2)
    except RunStopped as e:  # a write that failed (a full disk): one line; the samples stay
        print(f"eval.py: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: one line; what is sampled stays
        interrupts.end_eval()
