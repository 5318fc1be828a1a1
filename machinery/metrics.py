"""A training step's row of metrics.jsonl (record_step): each rank's sums (step_counts), the
step's metrics from all ranks' (step_record), its printed line, and the optional live curves on
Weights & Biases (--wandb_project; wandb is imported only then)."""
import collections
import os

import torch

from machinery.files import append_jsonl, write_atomic
from machinery.ranks import Dist, gather_lists


def logprob_gaps(trained: list) -> list[float]:
    """|log π_θold - vLLM's log-prob| per fresh token a rank trained (samples with replay,
    old_logprobs from the update, vllm_logprobs from the engine): stale weights, a wrong T or
    stop, a precision drift show here."""
    fresh = [s for s in trained if not s.replay]
    # one copy to the host
    old = torch.cat([s.old_logprobs for s in fresh]).tolist() if fresh else []
    sampled = [lp for s in fresh for lp in s.vllm_logprobs]
    return [abs(a - b) for a, b in zip(old, sampled)]


def step_counts(groups: list[list], visits: list[dict], gaps: list[float], tokenizer, cfg,
                stop_ids: list[int], update: dict) -> dict:
    """This rank's sums for the step's metrics (step_record adds the ranks'): groups, lists of
    samples (replay, reward, advantage, completion_ids); visits, a dict per group (fresh_correct,
    replays, rescued), step_record counts from them; gaps, logprob_gaps'; update, the update's
    summary (its token counts)."""
    fresh = [s for g in groups for s in g if not s.replay]

    def end(ids):
        # the stop token that ended a response, or "length" if it was cut at L_max
        if len(ids) >= cfg.max_response_len and ids[-1] not in stop_ids:
            return "length"
        return tokenizer.convert_ids_to_tokens(ids[-1])

    return {"fresh": len(fresh), "tokens": sum(len(s.completion_ids) for s in fresh),
            "reward": sum(s.reward for g in groups for s in g),
            "zero_std": sum(all(s.advantage == 0 for s in g) for g in groups),
            "gap_sum": sum(gaps), "gap_max": max(gaps, default=0.0),
            "ends": collections.Counter(end(s.completion_ids) for s in fresh), "visits": visits,
            "trained_tokens": update["trained_tokens"],
            "trained_response_tokens": update["trained_response_tokens"]}


def step_record(ranks: list[dict]) -> dict:
    """The step's metrics from every rank's step_counts; what a visit holds (its fresh answers
    right, replays, rescue) is counted from the visits, here alone."""
    # each sum over the ranks: numbers, the ends' Counters, the visits' lists
    total = {key: sum((counts[key] for counts in ranks[1:]), first)
             for key, first in ranks[0].items()}
    visits = total["visits"]
    samples = total["fresh"] + sum(v["replays"] for v in visits)
    rescued = sum(v["rescued"] for v in visits)
    return {"reward_mean": total["reward"] / samples,
            "acc_fresh": sum(v["fresh_correct"] for v in visits) / total["fresh"],
            "response_len": total["tokens"] / total["fresh"],
            "zero_std_frac": total["zero_std"] / len(visits),
            # m / (n + m) in phase two
            "replay_frac": 1 - total["fresh"] / samples,
            # the visits rescued (every fresh answer wrong, a replay right), and their share of the
            # visits to pooled prompts
            "rescued": rescued,
            "rescued_frac": rescued / max(1, sum(v["replays"] > 0 for v in visits)),
            "ends": {k: v / total["fresh"] for k, v in total["ends"].items()},
            "logprob_gap_mean": total["gap_sum"] / total["tokens"],
            "logprob_gap_max": max(r["gap_max"] for r in ranks),
            "trained_tokens": total["trained_tokens"],
            "trained_response_tokens": total["trained_response_tokens"],
            "visits": visits}


# a part's first steps' lines also say what ended the fresh responses and the share cut at L_max
# (docs/gpu.md: the first ten minutes of a run)
first_steps = 3


def log_step(part: str, step: int, steps: int, record: dict):
    keys = ("reward_mean", "acc_fresh", "response_len", "replay_frac", "rescued", "clip_frac",
            "ratio_max", "grad_norm", "logprob_gap_max", "val_acc", "t_generation", "t_training",
            "peak_gib")
    shown = [f"{k} {record[k]:.3g}" for k in keys if k in record]
    if record.get("gen_capped"):  # --max_gen_rounds: dropped groups fill the step
        shown.append(f"capped: {record['kept_groups']} groups mixed")
    ends = record.get("ends")
    if step <= first_steps and ends:
        # "ends <|endoftext|> 0.6 | capped at L_max 0.4": a base model that writes on past
        # <|im_end|> reaches the cap (responses end at EOS alone, as the authors')
        tokens = sorted(((share, token) for token, share in ends.items() if token != "length"),
                        reverse=True)
        shown += ["ends " + (", ".join(f"{t} {share:.2g}" for share, t in tokens) or "none"),
                  f"capped at L_max {ends.get('length', 0):.2g}"]
    print(f"{part} step {step}/{steps} | " + " | ".join(shown), flush=True)


def record_step(cfg, part: str, step: int, steps: int, update: dict, more: dict,
                groups: list[list], visits: list[dict], trained: list, tokenizer,
                stop_ids: list[int], d: Dist):
    """rlep.train's step, logged: its record, {step, the update's values, step_record of every
    rank's counts (one gather; its all-rank token counts win), more}; on rank 0 its row of
    metrics.jsonl and W&B, the step's line and cfg.log_samples fresh completions in
    samples.jsonl."""
    counts = step_counts(groups, visits, logprob_gaps(trained), tokenizer, cfg, stop_ids, update)
    record = {"step": step, **update, **step_record(gather_lists([counts], d)), **more}
    if not d.master_process:
        return
    append_jsonl(os.path.join(cfg.out_dir, part, "metrics.jsonl"), [record])
    track(part, record)  # W&B, with --wandb_project
    fresh = [s for g in groups for s in g if not s.replay][:cfg.log_samples]
    append_jsonl(os.path.join(cfg.out_dir, part, "samples.jsonl"),
                 [{"step": step, "prompt": tokenizer.decode(s.prompt_ids), "reward": s.reward,
                   "response": tokenizer.decode(s.completion_ids)} for s in fresh])
    log_step(part, step, steps, record)


wandb_run = None  # the command's W&B run, on rank 0; None: not tracking


def start_wandb(project: str, out_dir: str, config: dict, name: str):
    """One W&B run per out_dir: a resumed run continues it (its id is kept in out_dir). Each
    part's metrics are named phase1/... and phase2/..., against the part's own step, so the
    baseline's and RLEP's curves share an axis."""
    global wandb_run
    import wandb
    id_path = os.path.join(out_dir, "wandb_id")
    if os.path.isfile(id_path):
        run_id = open(id_path, encoding="utf-8").read().strip()
    else:
        run_id = os.urandom(4).hex()  # W&B ids: 8 lowercase letters or digits
        write_atomic(id_path, run_id)
    wandb_run = wandb.init(project=project, id=run_id, resume="allow", name=name,
                           config=config, dir=out_dir)
    for part in ("phase1", "phase2"):
        wandb_run.define_metric(f"{part}/step")
        wandb_run.define_metric(f"{part}/*", step_metric=f"{part}/step")


def track(part: str, record: dict):
    """A metrics.jsonl row, its numbers under the part's name; nothing when not tracking."""
    if wandb_run is None:
        return
    wandb_run.log({f"{part}/{k}": v for k, v in record.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)})


def finish_wandb(table: list):
    """The comparison table (report.comparison_rows', the header first; [] without a comparison)
    as a W&B table, then the end."""
    global wandb_run
    if wandb_run is None:
        return
    if table:
        import wandb
        columns, *rows = table
        wandb_run.log({"comparison": wandb.Table(columns=columns, data=rows)})
    wandb_run.finish()
    wandb_run = None
