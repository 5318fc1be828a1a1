"""Tests that pin the paper: every part of RLEP's method (arXiv 2507.07451) against values
worked out here, by hand or from the paper's formula written out, so that an edit to the
method fails a test. Unit-level calls on the tiny model; where a test is about what reaches
vLLM, a recording stand-in takes the engine's place. tools/mutate.py edits the method on a
copy of the repository and checks that these tests catch each edit.
Run: python -m pytest -q tests/test_paper.py"""
import inspect
import json
import math
import os
import re
import statistics
from dataclasses import asdict, fields

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from machinery import UserError, checkpoints, data, disk, fsdp, ranks, vllm_engine
import rlep
import verify

cpu = torch.device("cpu")
single = ranks.Dist(False, 0, 1, cpu, True)


def tiny(*flags):
    return rlep.parse_config(["--preset", "tiny", *flags])


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def bound(function, args, kwargs):
    """A call's arguments by name, however it was written."""
    arguments = inspect.signature(function).bind(*args, **kwargs)
    arguments.apply_defaults()
    return arguments.arguments


# -----------------------------------------------------------------------------------------
# The loss: L = -1/N Σ_i Σ_t min(r Â, clip(r, 1 - ε_low, 1 + ε_high) Â),
# with the dual clip at c for Â < 0

def paper_token_loss(r, a, eps_low, eps_high, c):
    """The per-token loss of DAPO's objective with the dual clip, written out."""
    clipped = min(max(r, 1 - eps_low), 1 + eps_high)
    loss = max(-r * a, -clipped * a)
    return min(loss, -c * a) if a < 0 else loss


def one_token(ratio, adv, **clip):
    """policy_loss on a single token: (loss, d loss / d log π)."""
    logprobs = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    loss, _ = rlep.policy_loss(logprobs, torch.zeros(1, 1, dtype=torch.float64),
                               torch.tensor([adv], dtype=torch.float64),
                               torch.ones(1, 1), **clip)
    loss.backward()
    return loss.item(), logprobs.grad.item()


# ε_low 0.1 and ε_high 0.3: each side of the clip has its own bound, so swapping them shows
@pytest.mark.parametrize("ratio, adv, loss, grad", [
    (1.5, 1.0, -1.3, 0.0),  # Â > 0 above 1 + ε_high: capped at 1.3, no gradient
    (1.2, 1.0, -1.2, -1.2),  # inside the range: -r Â, gradient -r Â
    (0.5, 1.0, -0.5, -0.5),  # Â > 0 below 1 - ε_low: the min keeps r Â
    (0.5, -1.0, 0.9, 0.0),  # Â < 0 below 1 - ε_low: floored at 0.9, no gradient
    (0.95, -1.0, 0.95, 0.95),  # inside
    (1.5, -1.0, 1.5, 1.5),  # Â < 0 above 1 + ε_high: the max keeps r Â (under c)
    (1.25, 2.0, -2.5, -2.5),  # inside, |Â| = 2
    (0.6, -2.0, 1.8, 0.0),  # floored at 0.9: 0.9 x 2
])
def test_the_clip_has_its_own_low_and_high_side(ratio, adv, loss, grad):
    got_loss, got_grad = one_token(ratio, adv, clip_low=0.1, clip_high=0.3, clip_c=10.0)
    assert got_loss == pytest.approx(loss, abs=1e-9)
    assert got_grad == pytest.approx(grad, abs=1e-9)
    assert got_loss == pytest.approx(paper_token_loss(ratio, adv, 0.1, 0.3, 10.0), abs=1e-9)


@pytest.mark.parametrize("ratio, adv, loss, grad", [
    (5.0, -1.0, 3.0, 0.0),  # Â < 0, r Â past c: capped at c |Â| = 3, no gradient
    (2.0, -1.0, 2.0, 2.0),  # under c: the PPO term
    (5.0, -2.0, 6.0, 0.0),  # c |Â| = 6
    (5.0, 1.0, -1.28, 0.0),  # Â > 0: no dual clip, the clip-higher bound
])
def test_the_dual_clip_caps_negative_advantages_at_c(ratio, adv, loss, grad):
    got_loss, got_grad = one_token(ratio, adv, clip_low=0.2, clip_high=0.28, clip_c=3.0)
    assert got_loss == pytest.approx(loss, abs=1e-9)
    assert got_grad == pytest.approx(grad, abs=1e-9)


def test_the_loss_over_a_grid_is_the_papers_formula():
    ratios = torch.tensor([0.3, 0.7, 0.85, 1.0, 1.1, 1.25, 1.4, 3.0, 12.0, 30.0],
                          dtype=torch.float64)
    for adv in (-1.5, -0.4, 0.4, 1.5):
        logprobs = torch.log(ratios)[:, None]  # one token per response
        loss, _ = rlep.policy_loss(logprobs, torch.zeros_like(logprobs),
                                   torch.full((len(ratios),), adv, dtype=torch.float64),
                                   torch.ones(len(ratios), 1), clip_low=0.15, clip_high=0.35,
                                   clip_c=4.0)
        expected = np.mean([paper_token_loss(r, adv, 0.15, 0.35, 4.0) for r in ratios.tolist()])
        assert loss.item() == pytest.approx(expected, abs=1e-9)


def make_groups(sizes, seed=0, vocab=200):
    """Groups of random token sequences with random lengths and advantages."""
    rng = np.random.default_rng(seed)
    groups = []
    for size in sizes:
        prompt = rng.integers(3, vocab, rng.integers(3, 7)).tolist()
        groups.append([rlep.Sample(prompt, rng.integers(3, vocab, rng.integers(2, 9)).tolist(),
                                   False, 0.0, advantage=float(rng.normal()))
                       for _ in range(size)])
    return groups


class Recorder:
    """Wraps a module function: every call's arguments by name, then the real result."""

    def __init__(self, monkeypatch, module, name, after=None):
        self.real = getattr(module, name)
        self.calls = []
        self.after = after

        def wrapper(*args, **kwargs):
            self.calls.append(bound(self.real, args, kwargs))
            result = self.real(*args, **kwargs)
            if self.after:
                self.after(self.calls[-1], result)
            return result
        monkeypatch.setattr(module, name, wrapper)


def watch_updates(optimizer, events, policy=None):
    """events gets ("update", lr, grad norm) at every optimizer step."""
    step = optimizer.step

    def recorded(*args, **kwargs):
        norm = None
        if policy is not None:
            grads = [p.grad.double().pow(2).sum() for p in policy.parameters()
                     if p.grad is not None]
            norm = float(sum(grads).sqrt())
        events.append(("update", optimizer.param_groups[0]["lr"], norm))
        return step(*args, **kwargs)
    optimizer.step = recorded


def test_n_is_the_response_token_count_of_the_whole_mini_batch(tiny_model, monkeypatch):
    """Every micro-batch divides by the response tokens of its whole mini-batch (the
    sum over its optimizer step), not by its own (a per-micro-batch mean)."""
    cfg = tiny("--mini_batch_prompts", "2", "--micro_batch_size", "3", "--lr", "1e-3")
    policy, optimizer = rlep.build_policy(tiny_model, cfg, single)
    events = []
    watch_updates(optimizer, events)
    real_loss = rlep.policy_loss

    def loss(*args, **kwargs):
        call = bound(real_loss, args, kwargs)
        own = int(call["mask"].sum())
        # None: policy_loss's default, the micro-batch's own tokens
        n = own if call["num_tokens"] is None else int(call["num_tokens"])
        events.append(("loss", n, own))
        return real_loss(*args, **kwargs)
    monkeypatch.setattr(rlep, "policy_loss", loss)
    groups = make_groups([cfg.n] * 4, seed=1)
    rlep.ppo_update(policy, optimizer, dict(enumerate(groups)), 2 * cfg.n, cfg, single, 0, seed=0)
    segments, current = [], []
    for event in events:
        if event[0] == "update":
            segments.append(current)
            current = []
        else:
            current.append(event[1:])
    assert len(segments) == 2 and all(len(s) > 1 for s in segments)
    for segment in segments:
        tokens = sum(own for _, own in segment)
        assert all(n == tokens for n, _ in segment)
    total = sum(len(s.completion_ids) for g in groups for s in g)
    assert sum(own for s in segments for _, own in s) == total


def test_the_update_passes_the_configs_clip_bounds(tiny_model, monkeypatch):
    cfg = tiny("--clip_low", "0.11", "--clip_high", "0.37", "--clip_c", "4.5")
    policy, optimizer = rlep.build_policy(tiny_model, cfg, single)
    calls = Recorder(monkeypatch, rlep, "policy_loss").calls
    rlep.ppo_update(policy, optimizer, dict(enumerate(make_groups([4, 4]))), 64, cfg, single, 0,
                    seed=0)
    assert calls and all((c["clip_low"], c["clip_high"], c["clip_c"]) == (0.11, 0.37, 4.5)
                         for c in calls)


# -----------------------------------------------------------------------------------------
# The advantage: Â_i = (R_i - mean(R)) / (std(R) + 1e-6) over the whole group, unbiased std

def paper_advantages(rewards):
    mean, std = statistics.mean(rewards), statistics.stdev(rewards)  # stdev: the n - 1 one
    return [(r - mean) / (std + 1e-6) for r in rewards]


@pytest.mark.parametrize("rewards", [
    [1.0, -1.0, -1.0],
    [1.0, 1.0, -1.0, -1.0, -1.0],
    [0.75, -1.5, 1.0, -1.0, -1.375, 1.0],
    [-1.0] * 16 + [1.0] * 2,
])
def test_advantages_use_the_groups_unbiased_std(rewards):
    got = rlep.group_advantages(torch.tensor(rewards, dtype=torch.float64), len(rewards))
    assert got.tolist() == pytest.approx(paper_advantages(rewards), abs=1e-6)
    # the hand value of the first: mean -1/3, unbiased std 2 / √3, so Â_1 = 2 / √3
    if rewards == [1.0, -1.0, -1.0]:
        assert got[0].item() == pytest.approx(2 / math.sqrt(3), abs=1e-5)


def answer_ids(tokenizer, text, length=None):
    """A response's token ids, its end token included; padded in front with spaces (one
    token each, the tiny tokenizer's) to `length`."""
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    if length is not None:
        ids = tokenizer.encode(" " * (length - len(ids)), add_special_tokens=False) + ids
        assert len(ids) == length
    return ids


row7 = {"id": "q", "problem": "3+4", "answer": "7"}


def test_the_advantage_is_standardised_over_fresh_and_replayed_together(tokenizer):
    cfg = tiny("--n", "4")
    right, wrong = answer_ids(tokenizer, "Answer: 7"), answer_ids(tokenizer, "Answer: 5")
    fresh = [(right, None), (wrong, None), (wrong, None), (wrong, None)]
    group = rlep.build_group(row7, [1, 2], fresh, tokenizer, cfg, tokenizer.eos_token_id,
                             ["Answer: 7", "7\nAnswer: 7"])
    # R = [1, -1, -1, -1, 1, 1]: mean 0, unbiased std √(6/5); fresh alone would give 1.5
    expected = [s / (math.sqrt(6 / 5) + 1e-6) for s in (1, -1, -1, -1, 1, 1)]
    assert [s.advantage for s in group] == pytest.approx(expected, abs=1e-5)
    assert [s.replay for s in group] == [False] * 4 + [True] * 2


# -----------------------------------------------------------------------------------------
# The reward: R = ±1 (the verifier) + the overlong penalty, 0 up to L_max - L_cache, then
# linear down to -factor at L_max (DAPO's soft overlong punishment)

def paper_reward(correct, length, max_len, buffer, factor):
    excess = max(0, length - (max_len - buffer))
    return (1.0 if correct else -1.0) - factor * min(1.0, excess / buffer)


@pytest.mark.parametrize("length, correct, expected", [
    (10, True, 1.0),  # short: no penalty
    (12, True, 1.0),  # at L_max - L_cache: still none
    (16, True, 0.75),  # half-way into the window: -0.5 x 4 / 8
    (18, False, -1.375),  # -1 - 0.5 x 6 / 8
    (20, False, -1.5),  # at L_max: -1 - factor
    (20, True, 0.5),
])
def test_the_reward_is_correctness_plus_the_overlong_penalty(tokenizer, length, correct,
                                                             expected):
    cfg = tiny("--n", "1", "--max_response_len", "20", "--overlong_buffer", "8",
               "--overlong_factor", "0.5")
    ids = answer_ids(tokenizer, "Answer: 7" if correct else "Answer: 8", length)
    (sample,) = rlep.build_group(row7, [1, 2], [(ids, None)], tokenizer, cfg,
                                 tokenizer.eos_token_id)
    assert sample.correct is correct
    assert sample.reward == pytest.approx(expected, abs=1e-9)
    assert sample.reward == pytest.approx(paper_reward(correct, length, 20, 8, 0.5), abs=1e-9)


def test_replays_are_re_tokenized_ended_cut_to_l_max_and_re_scored(tokenizer):
    cfg = tiny("--n", "1", "--max_response_len", "20", "--overlong_buffer", "8",
               "--overlong_factor", "0.5")
    end = tokenizer.eos_token_id
    replays = ["Answer: 7", "Answer: 8", " " * 30 + "Answer: 7"]
    group = rlep.build_group(row7, [1, 2], [(answer_ids(tokenizer, "Answer: 7"), None)],
                             tokenizer, cfg, end, replays)
    short, wrong, long = group[1:]
    assert short.completion_ids == tokenizer.encode("Answer: 7") + [end] and short.reward == 1.0
    # a replay is verified again: a wrong one scores -1
    assert not wrong.correct and wrong.reward == -1.0
    # cut to L_max (its end token and answer lost, as the authors' code): -1 - factor
    assert len(long.completion_ids) == 20 and long.completion_ids[-1] != end
    assert long.reward == pytest.approx(-1.5)


# The paper's rule (math_dapo): the last "Answer:" line among the last 300 characters
def test_the_paper_rule_reads_only_the_last_300_characters():
    line = "Answer: 7\n"
    inside, outside = line + "." * 290, line + "." * 291  # 300 and 301 characters
    assert verify.verify(inside, "7", mode="dapo")
    assert not verify.verify(outside, "7", mode="dapo")  # its "A" fell out of the window
    assert not verify.verify("Answer: 7\n" + "." * 500, "7", mode="dapo")
    assert verify.verify("Answer: 8\n" + "." * 500 + "\nAnswer: 7", "7", mode="dapo")
    assert not verify.verify("Answer: 7\n" + "." * 100 + "\nAnswer: 8", "7", mode="dapo")


def test_the_paper_rules_window_holds_in_the_reward(tokenizer):
    cfg = tiny("--n", "2", "--verify_mode", "dapo", "--max_response_len", "400",
               "--overlong_buffer", "0")
    inside = answer_ids(tokenizer, "Answer: 7\n" + "." * 290)
    outside = answer_ids(tokenizer, "Answer: 7\n" + "." * 291)
    group = rlep.build_group(row7, [1, 2], [(inside, None), (outside, None)], tokenizer, cfg,
                             tokenizer.eos_token_id)
    assert [s.reward for s in group] == [1.0, -1.0]


# -----------------------------------------------------------------------------------------
# The optimiser: AdamW, linear warm-up from lr 0, the clip to grad_clip, non-finite skipped

def test_warm_up_is_linear_from_lr_zero():
    cfg = tiny("--lr", "0.004", "--warmup_steps", "4")
    # the authors' LambdaLR: step / warmup_steps for step < warmup_steps, counted from 0
    assert [rlep.learning_rate(s, cfg) for s in range(6)] == pytest.approx(
        [0.0, 0.001, 0.002, 0.003, 0.004, 0.004])
    assert rlep.learning_rate(0, tiny("--lr", "0.004", "--warmup_steps", "0")) == 0.004


def test_adamw_has_the_papers_betas_and_the_configs_decay(tiny_model):
    cfg = tiny("--weight_decay", "0.1", "--lr", "2e-6")
    _, optimizer = rlep.build_policy(tiny_model, cfg, single)
    assert isinstance(optimizer, torch.optim.AdamW)
    (group,) = optimizer.param_groups
    # the authors' run script (verl: AdamW, betas 0.9 and 0.999, weight decay 0.1)
    assert group["betas"] == (0.9, 0.999) and group["weight_decay"] == 0.1
    assert group["lr"] == 2e-6


def test_gradients_are_clipped_to_grad_clip_before_each_update(tiny_model):
    cfg = tiny("--grad_clip", "0.001", "--mini_batch_prompts", "1")
    policy, optimizer = rlep.build_policy(tiny_model, cfg, single)
    events = []
    watch_updates(optimizer, events, policy)
    stats, _ = rlep.ppo_update(policy, optimizer, dict(enumerate(make_groups([4, 4]))), 4, cfg,
                               single, 0, seed=0)
    assert len(events) == 2
    # the norm before the clip is reported; the update sees the clipped one
    assert stats["grad_norm"] > 0.01
    assert all(norm == pytest.approx(0.001, rel=1e-3) for _, _, norm in events)


def test_an_update_with_a_non_finite_gradient_reports_it_for_trains_one_check(tiny_model):
    """No skip (verl's): the step's mean gradient norm is NaN and so are the weights, which
    train's one check of divergence reads before the push and any save."""
    cfg = tiny("--mini_batch_prompts", "1", "--lr", "1e-3")
    policy, optimizer = rlep.build_policy(tiny_model, cfg, single)
    groups = make_groups([4, 4])
    groups[1][2].advantage = math.nan  # this mini-batch's gradient is NaN
    stats, _ = rlep.ppo_update(policy, optimizer, dict(enumerate(groups)), 4, cfg, single, 0,
                               seed=0)
    assert math.isnan(stats["grad_norm"]) and "skipped_updates" not in stats
    assert not fsdp.weights_finite(policy)


def test_a_bf16_run_trains_under_autocast(tiny_model):
    for dtype, expected in (("bfloat16", (True, torch.bfloat16)), ("float32", (False, None))):
        cfg = tiny("--dtype", dtype, "--mini_batch_prompts", "1")
        policy, optimizer = rlep.build_policy(tiny_model, cfg, single)
        seen = []
        forward = policy.forward

        def spy(batch):
            on = torch.is_autocast_enabled("cpu")
            seen.append((on, torch.get_autocast_dtype("cpu") if on else None))
            return forward(batch)
        policy.forward = spy
        rlep.ppo_update(policy, optimizer, dict(enumerate(make_groups([4, 4]))), 4, cfg, single,
                        0, seed=0)
        # π_θold and both updates' forwards
        assert len(seen) >= 3 and set(seen) == {expected}


# -----------------------------------------------------------------------------------------
# The loop with vLLM's place taken by a recording stand-in: what the collection and the
# training steps ask of the engine, the replays they draw, the updates they make

def problem_of(prompt_text):
    return re.search(r"user\n(.*?)<\|im_end\|>", prompt_text).group(1)


def gold_of(problem):
    a, op, b = re.fullmatch(r"(\d)([+-])(\d)", problem).groups()
    return int(a) + int(b) if op == "+" else int(a) - int(b)


def half_right(problem, j):
    """Sample j of a prompt: right when j is even, a distinct text each."""
    gold = gold_of(problem)
    return f"{j}\nAnswer: {gold if j % 2 == 0 else gold + 10}"


class StubEngine:
    """vllm_engine.Engine's methods, recording each call; generate answers with reply(problem,
    j)."""

    def __init__(self, tokenizer, reply=half_right):
        self.tokenizer, self.reply = tokenizer, reply
        self.pushes, self.calls = [], []

    def sleep(self):
        pass

    def memory_line(self, preset=""):
        return "vLLM: a stand-in"

    def shutdown(self, wake=False):
        pass

    def push(self, model=None, path=None):
        self.pushes.append(path)

    def generate(self, *args, **kwargs):
        call = bound(vllm_engine.Engine.generate, (self, *args), kwargs)
        self.calls.append(call)
        out = []
        for prompt in call["prompts"]:
            problem = problem_of(self.tokenizer.decode(prompt))
            group = []
            for j in range(call["n"]):
                ids = answer_ids(self.tokenizer, self.reply(problem, j))[:call["max_tokens"]]
                logprobs = [-1.0] * len(ids) if call["logprobs"] else None
                group.append(vllm_engine.Completion(ids, logprobs))
            out.append(group)
        return out


def pool_rows(rows, count, responses):
    """Pool rows: each of the first `count` rows with `responses` right answers."""
    return [{**row, "responses": [f"{k} so\nAnswer: {row['answer']}" for k in range(responses)]}
            for row in rows[:count]]


def run_part(monkeypatch, tmp_path, tiny_model, tokenizer, part, rows, *flags):
    """rlep.train of one part on the stand-in engine, validated afresh. Returns the
    engine, the events (("step", s), ("update", lr, None)) and the groups' replays by step."""
    cfg = tiny("--out_dir", str(tmp_path / part), "--save_every", "100", *flags)
    events, replays = [], []
    real_build = rlep.build_policy

    def build(*args, **kwargs):
        policy, optimizer = real_build(*args, **kwargs)
        watch_updates(optimizer, events)
        return policy, optimizer
    monkeypatch.setattr(rlep, "build_policy", build)
    Recorder(monkeypatch, rlep, "make_groups",
             after=lambda call, _: events.append(("step", call["step"])))
    Recorder(monkeypatch, rlep, "build_group",
             after=lambda call, _: replays.append((len([e for e in events if e[0] == "step"]),
                                                   call["row"]["id"], list(call["replays"]))))
    engine = StubEngine(tokenizer)
    val_rows = data.read_rows(cfg.val_file)[:3]
    rlep.train(cfg, part, rows, engine, tokenizer, tokenizer.eos_token_id, tiny_model, single,
               val_rows, rlep.RunState(), replay=part == "phase2")
    return engine, events, replays


def updates_per_step(events):
    counts = []
    for event in events:
        if event[0] == "step":
            counts.append(0)
        elif event[0] == "update" and counts:
            counts[-1] += 1
    return counts


@pytest.fixture(scope="module")
def two_parts(tiny_model, tmp_path_factory, tokenizer):
    """Phase one, 3 steps with a 2-step warm-up, and phase two on a pool, 3 steps: both
    validated every step."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        tmp = tmp_path_factory.mktemp("parts")
        train_rows = data.read_rows(tiny().train_file)
        flags = ["--phase1_steps", "3", "--phase2_steps", "3", "--val_every", "1",
                 "--warmup_steps", "2", "--lr", "0.01", "--replay_m", "2"]
        one = run_part(monkeypatch, tmp, tiny_model, tokenizer, "phase1", train_rows, *flags)
    with pytest.MonkeyPatch.context() as monkeypatch:
        # 7 prompts with 5 pooled answers, one with a single one: all 8 visited every step
        pool = pool_rows(train_rows, 7, 5) + pool_rows(train_rows[7:], 1, 1)
        two = run_part(monkeypatch, tmp, tiny_model, tokenizer, "phase2", pool, *flags)
    return {"phase1": one, "phase2": two, "pool": pool}


def validations(engine):
    return [c for c in engine.calls if not c["logprobs"]]


def test_both_phases_validate_on_the_same_draws(two_parts):
    """Without the base-model cache: each phase validates at steps 0 to 3 itself."""
    one, two = (validations(two_parts[p][0]) for p in ("phase1", "phase2"))
    assert len(one) == len(two) == 4
    for a, b in zip(one, two):
        assert a["seeds"] == b["seeds"] and a["prompts"] == b["prompts"]
        assert (a["n"], a["temperature"], a["top_p"]) == (b["n"], b["temperature"], b["top_p"])
    assert len({tuple(c["seeds"]) for c in one}) == 4  # each step its own draws


def test_warm_up_runs_the_first_steps_updates_at_lr_zero(two_parts):
    events = two_parts["phase1"][1]
    lrs = []
    for event in events:
        if event[0] == "step":
            lrs.append(set())
        elif event[0] == "update":
            lrs[-1].add(event[1])
    # lr 0.01 x step / 2, one lr for all of a step's updates
    assert lrs == [{0.0}, {0.005}, {0.01}]


def test_replays_are_drawn_anew_at_every_visit_without_replacement(two_parts):
    pool = {row["id"]: row["responses"] for row in two_parts["pool"]}
    draws = two_parts["phase2"][2]
    visits = {}
    for step, row_id, replays in draws:
        visits.setdefault(row_id, []).append(replays)
    assert set(visits) == set(pool) and all(len(v) == 3 for v in visits.values())
    for row_id, seen in visits.items():
        for replays in seen:
            # m = 2 distinct pooled answers, or all of them when the pool has fewer
            assert len(replays) == min(2, len(pool[row_id]))
            assert len(set(replays)) == len(replays) and set(replays) <= set(pool[row_id])
    redrawn = [row_id for row_id, seen in visits.items() if len({tuple(r) for r in seen}) > 1]
    assert len(redrawn) >= 4
    # phase one draws none
    assert all(replays == [] for _, _, replays in two_parts["phase1"][2])


@pytest.mark.parametrize("part, equal_updates, expected", [
    # round(B x G / (mini x n)): the authors' run script (verl recipe rlep_training.sh)
    # makes 512 x 18 / (64 x 16) = 9 updates a step where the baseline makes 8; here
    # B = 8, n = 8, m = 1, mini = 1: 8 x 9 / 8 = 9 against 8 x 8 / 8 = 8
    ("phase1", False, 8),
    ("phase2", False, 9),
    # --equal_updates: a mini-batch counts n + m per prompt, 8 x 9 / 9 = 8
    ("phase2", True, 8),
    ("phase1", True, 8),
])
def test_updates_per_step(monkeypatch, tmp_path, tiny_model, tokenizer, part, equal_updates,
                          expected):
    rows = data.read_rows(tiny().train_file)
    if part == "phase2":
        rows = pool_rows(rows, 8, 3)
    flags = ["--phase1_steps", "1", "--phase2_steps", "1", "--val_every", "0", "--n", "8",
             "--replay_m", "1", "--prompts_per_step", "8", "--mini_batch_prompts", "1",
             "--equal_updates" if equal_updates else "--no-equal_updates"]
    _, events, _ = run_part(monkeypatch, tmp_path, tiny_model, tokenizer, part, rows, *flags)
    assert updates_per_step(events) == [expected]


def fake_checkpoint(part_dir, step, model_path, shift):
    """A checkpoint folder of the model with every weight moved by `shift`."""
    model = AutoModelForCausalLM.from_pretrained(model_path)
    with torch.no_grad():
        for p in model.parameters():
            p += shift
    folder = checkpoints.checkpoint_path(str(part_dir), step)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(folder)
    torch.save({"step": step, "torch_rng": torch.get_rng_state()},
               os.path.join(folder, "trainer_state.pt"))
    return folder


@pytest.mark.parametrize("chunk, calls", [(0, [4, 2]), (48, [3, 3])])
def test_the_collections_chunks_are_b_prompts_or_collect_chunk_sequences_a_rank(
        tmp_path, tiny_model, tokenizer, chunk, calls):
    """0 (the cpu and tiny presets): B prompts a generate call, as before; else W x
    collect_chunk // K prompts (48 // 16 = 3 here), the paper, node and gpu presets' 4,096
    sequences a rank: 2,048 prompts on the node's 8 GPUs, 256 on one."""
    cfg = tiny("--out_dir", str(tmp_path), "--prompts_per_step", "4", "--collect_chunk",
               str(chunk))
    os.makedirs(checkpoints.checkpoint_path(str(tmp_path / "phase1"), cfg.collect_step))
    engine = StubEngine(tokenizer)
    rlep.collect(cfg, data.read_rows(cfg.train_file)[:6], engine, tokenizer,
                 tokenizer.eos_token_id, single, rlep.RunState())
    assert [len(call["prompts"]) for call in engine.calls] == calls
    assert all(call["n"] == cfg.collect_k == 16 for call in engine.calls)
    chunks = {name: rlep.parse_config(["--preset", name]).collect_chunk for name in rlep.presets}
    assert chunks == {"paper": 4096, "node": 4096, "gpu": 4096, "tiny": 0, "cpu": 0,
                      "cpu-hard": 0}


def test_the_collection_samples_collect_steps_checkpoint_with_its_k_t_and_top_p(
        tmp_path, tiny_model, tokenizer):
    cfg = tiny("--out_dir", str(tmp_path), "--collect_step", "2", "--phase1_steps", "4",
               "--collect_k", "6", "--collect_temperature", "0.55", "--collect_top_p", "0.85",
               "--min_successes", "3", "--prompts_per_step", "4")
    for step in (2, 4):
        os.makedirs(checkpoints.checkpoint_path(str(tmp_path / "phase1"), step))
    rows = data.read_rows(cfg.train_file)[:6]
    rank = {row["problem"]: i for i, row in enumerate(rows)}

    def reply(problem, j):  # the i-th prompt: i answers of K right
        gold = gold_of(problem)
        return f"{j} so\nAnswer: {gold if j < rank[problem] else gold + 10}"
    engine = StubEngine(tokenizer, reply)
    rlep.collect(cfg, rows, engine, tokenizer, tokenizer.eos_token_id, single, rlep.RunState())
    assert engine.pushes == [checkpoints.checkpoint_path(str(tmp_path / "phase1"), 2)]
    assert engine.calls and sum(len(c["prompts"]) for c in engine.calls) == 6
    for call in engine.calls:
        assert (call["n"], call["temperature"], call["top_p"]) == (6, 0.55, 0.85)
    pool = data.load_pool(str(tmp_path / "collect" / "pool.jsonl"))
    # prompts with >= min_successes = 3 verified answers, each with only its right ones
    assert [row["id"] for row in pool] == [row["id"] for row in rows[3:]]
    for row in pool:
        gold = gold_of(row["problem"])
        assert row["responses"] == [f"{j} so\nAnswer: {gold}" for j in range(rank[row["problem"]])]


@pytest.fixture
def quiet_main(monkeypatch, tokenizer):
    """rlep.main with the stand-in engine and no speed measurement; returns the engine."""
    engine = StubEngine(tokenizer)
    monkeypatch.setattr(rlep, "build_engine", lambda *args, **kwargs: engine)
    monkeypatch.setattr(fsdp, "linear_gflops", lambda *args, **kwargs: 100.0)
    return engine


class Stop(Exception):
    pass


def test_phase_two_starts_from_the_base_models_weights(tmp_path, tiny_model, monkeypatch,
                                                       quiet_main):
    """After phase one and the collection: phase two's policy, as built, holds π_θ0's
    weights, not those of a phase-one checkpoint."""
    out = tmp_path / "run"
    for step, shift in ((2, 0.01), (4, 0.02)):
        fake_checkpoint(out / "phase1", step, tiny_model, shift)
    train_rows = data.read_rows(tiny().train_file)
    os.makedirs(out / "collect")
    data.save_pool(str(out / "collect" / "pool.jsonl"), pool_rows(train_rows, 8, 3))
    built = []
    real_build = rlep.build_policy

    def build(*args, **kwargs):
        policy, _ = real_build(*args, **kwargs)
        built.append({k: v.clone() for k, v in policy.model.state_dict().items()})
        raise Stop
    monkeypatch.setattr(rlep, "build_policy", build)
    argv = ["--preset", "tiny", "--out_dir", str(out), "--phase", "2", "--collect_step", "2",
            "--cache_dir", os.path.dirname(tiny_model), "--resume"]
    # the run's config.json, as its start wrote it
    (out / "config.json").write_text(json.dumps(asdict(rlep.parse_config(argv))))
    with pytest.raises(Stop):
        rlep.main(argv)
    (weights,) = built
    base = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    assert weights.keys() == base.keys()
    assert all(torch.equal(weights[k], base[k]) for k in base)
    moved = AutoModelForCausalLM.from_pretrained(str(out / "phase1" / "step_000002"))
    assert not torch.equal(moved.state_dict()["lm_head.weight"], base["lm_head.weight"])


def no_disk(monkeypatch):
    usage = type("Usage", (), {"total": 1 << 40, "used": 1 << 40, "free": 0})()
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda path: usage)


def test_main_checks_the_disk_before_it_builds_anything(tmp_path, tiny_model, monkeypatch,
                                                        quiet_main):
    no_disk(monkeypatch)
    monkeypatch.setattr(rlep, "build_engine", lambda *args, **kwargs: pytest.fail("built"))
    with pytest.raises(UserError, match="B free"):
        rlep.main(["--preset", "tiny", "--out_dir", str(tmp_path / "run"),
                   "--cache_dir", os.path.dirname(tiny_model)])


def test_main_checks_the_disk_before_it_writes_anything(tmp_path, tiny_model, monkeypatch,
                                                        quiet_main):
    no_disk(monkeypatch)
    out = tmp_path / "run"
    with pytest.raises(UserError, match="B free"):
        rlep.main(["--preset", "tiny", "--out_dir", str(out),
                   "--cache_dir", os.path.dirname(tiny_model)])
    assert not out.exists() or not any(out.iterdir())


# -----------------------------------------------------------------------------------------
# The paper preset: every value against its source

dapo_prompt = (
    "Solve the following math problem step by step. The last line of your response should be "
    "of the form Answer: $Answer (without quotes) where $Answer is the answer to the problem."
    "\n\n{problem}\n\nRemember to put your answer on its own line after \"Answer:\".")
paper_values = [
    ("model_path", "Qwen/Qwen2.5-Math-7B", "RLEP paper section 4: the base model"),
    ("train_file", "hf://datasets/BytedTsinghua-SIA/DAPO-Math-17k/data/dapo-math-17k.parquet",
     "RLEP paper section 4: DAPO-Math-17k (its file on the hub)"),
    ("train_prompts", 0, "RLEP paper section 4: all of DAPO-Math-17k's prompts"),
    ("val_file", "hf://datasets/Kwai-Klear/RLEP_dataset/dapo_format_aime2024_aime2025_amc2023"
     ".parquet", "RLEP paper section 4: AIME-2024, AIME-2025, AMC-2023 (the authors' file)"),
    ("prompt_template", dapo_prompt, "DAPO-Math-17k's prompt, as the authors' data"),
    ("prompts_per_step", 512, "the authors' run script (verl recipe: train_batch_size=512)"),
    ("n", 16, "RLEP paper section 4 and the run script (rollout.n=16)"),
    ("temperature", 1.0, "the authors' run script (rollout temperature 1.0)"),
    ("top_p", 1.0, "the authors' run script (rollout top_p 1.0)"),
    ("max_prompt_len", 1024, "the authors' run script (max_prompt_length=1024)"),
    ("max_response_len", 3072, "the authors' run script (max_response_length=3072)"),
    ("stop_token", "", "the authors' code: responses end at EOS, no stop tokens"),
    ("overlong_buffer", 512, "the authors' run script (overlong_buffer.len=512)"),
    ("overlong_factor", 1.0, "the authors' run script (overlong_buffer.penalty_factor=1.0)"),
    ("lr", 1e-6, "the authors' run script (actor optim lr=1e-6)"),
    ("weight_decay", 0.1, "the authors' run script (weight_decay=0.1)"),
    ("warmup_steps", 10, "the authors' run script (lr_warmup_steps=10)"),
    ("grad_clip", 1.0, "the authors' run script (grad_clip=1.0)"),
    ("mini_batch_prompts", 64, "the authors' run script (ppo_mini_batch_size=64)"),
    ("epochs", 1, "the authors' run script (ppo_epochs=1)"),
    ("clip_low", 0.2, "the authors' run script (clip_ratio_low=0.2)"),
    ("clip_high", 0.28, "the authors' run script (clip_ratio_high=0.28)"),
    ("clip_c", 10.0, "the authors' run script (clip_ratio_c=10.0)"),
    ("phase1_steps", 400, "RLEP paper section 4.2: 400 steps of the baseline"),
    ("phase1_prompts", "all", "RLEP paper section 4: the baseline on all of DAPO-Math-17k"),
    ("collect_step", 400, "RLEP paper section 4.2: the pool from the step-400 checkpoint"),
    ("collect_k", 64, "RLEP paper section 4.2: 64 samples per question"),
    ("collect_temperature", 0.7, "RLEP paper section 4.2: temperature 0.7"),
    ("collect_top_p", 0.95, "RLEP paper section 4.2: top-p 0.95"),
    ("min_successes", 2, "RLEP paper, the collection: at least two verified paths per question"),
    ("phase2_steps", 400, "RLEP paper section 4: the curves run about 400 steps"),
    ("replay_m", 2, "the authors' run script (experience_replay_num=2)"),
    ("equal_updates", False, "the authors' code: mini-batches of 64 x n sequences"),
    ("dynamic_sampling", False, "the authors' baseline: DAPO-nodyn-bs64, no dynamic sampling"),
    ("max_gen_rounds", 10, "verl's DAPO recipe (max_num_gen_batches=10); off with the above"),
    ("phase2_prompts", "pool", "RLEP paper, phase two: trained on the pool's questions"),
    ("replay_loss", "group", "RLEP paper, phase two: one advantage over the n + m responses"),
    ("pool", "", "RLEP paper: phase two replays the pool phase one collected"),
    ("val_every", 5, "the authors' run script (test_freq=5)"),
    ("val_k", 32, "RLEP paper section 4: avg@32"),
    ("verify_mode", "dapo", "the authors' code: math_dapo's rule"),
    ("seed", 1, "the authors' run script (data shuffle seed 1)"),
    ("save_every", 20, "the authors' run script (save_freq=20)"),
]
# settings of this implementation, not of the method: memory, speed, files, logging
not_the_papers = {"out_dir", "micro_batch_size", "micro_batch_tokens", "share_prompts",
                  "replay_coef", "phase", "resume", "override", "dtype", "gradient_checkpointing",
                  "gpu_memory_utilization", "timeout_minutes", "keep_checkpoints",
                  "log_samples", "progress", "cache_dir", "preset", "wandb_project",
                  "collect_chunk"}


@pytest.mark.parametrize("name, value, source", paper_values, ids=[v[0] for v in paper_values])
def test_the_paper_preset_has_the_papers_value(name, value, source):
    assert getattr(rlep.parse_config(["--preset", "paper"]), name) == value, source


def test_every_config_field_is_the_papers_or_said_not_to_be():
    named = [v[0] for v in paper_values]
    assert len(set(named)) == len(named) and not set(named) & not_the_papers
    assert {f.name for f in fields(rlep.Config)} == set(named) | not_the_papers


# The node and gpu presets (docs/gpu.md): the paper's rules and ratios on one node or one GPU,
# smaller
node_rules = ["train_file", "val_file", "prompt_template", "temperature", "top_p",
              "max_prompt_len", "max_response_len", "stop_token", "overlong_buffer",
              "overlong_factor", "lr", "weight_decay", "warmup_steps", "grad_clip", "epochs",
              "clip_low", "clip_high", "clip_c", "collect_temperature", "collect_top_p",
              "min_successes", "phase1_prompts", "phase2_prompts", "replay_loss",
              "dynamic_sampling", "equal_updates", "verify_mode", "seed", "save_every"]


@pytest.mark.parametrize("preset", ["node", "gpu"])
def test_the_node_preset_keeps_the_papers_rules_and_ratios(preset):
    paper, node = (rlep.parse_config(["--preset", name]) for name in ("paper", preset))
    assert {name: getattr(node, name) for name in node_rules} == \
        {name: getattr(paper, name) for name in node_rules}
    # m : n = 1 : 8; 8 updates a step, 9 with replays (rlep.ppo_update's count)
    for cfg in (paper, node):
        assert cfg.replay_m * 8 == cfg.n
        updates = [round(cfg.prompts_per_step * (cfg.n + m) / (cfg.mini_batch_prompts * cfg.n))
                   for m in (0, cfg.replay_m)]
        assert updates == [8, 9]
        assert cfg.collect_step == cfg.phase1_steps  # the pool from phase one's last step
    # Qwen2.5-Math-1.5B's config.json: max_position_embeddings 4096, as the 7B's
    assert node.model_path == "Qwen/Qwen2.5-Math-1.5B"
    assert node.max_prompt_len + node.max_response_len <= 4096
