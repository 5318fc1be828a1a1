"""docs/worked-step.md cannot go stale: the step it shows is run again (tools/worked_step.py's
run_step, on the shared engine) and every number the page prints must be the run's, to the digits
shown but for another CPU's rounding (5 in the last digit, 0.1 %); the run's numbers must also obey
the rules written out here by hand, independently of rlep.py: the advantage, the ratio, the clip
decisions, the loss. Run:
    python -m pytest -q tests/test_worked_step.py
If the first test fails after a change to rlep.py that is meant: regenerate the page with
    OMP_NUM_THREADS=1 python tools/worked_step.py"""
import decimal
import math
import os
import re
import statistics
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tools"))
import worked_step  # noqa: E402


runs = {}


@pytest.fixture
def numbers(tiny_model, tiny_engine, tmp_path_factory):
    """The step's numbers, run once for this file's tests (tiny_engine, shared by the session's
    tests, is function-scoped: the run is kept here)."""
    if "step" not in runs:
        out_dir = str(tmp_path_factory.mktemp("worked"))
        runs["step"] = worked_step.run_step(tiny_model, tiny_engine, out_dir)
    return runs["step"]


decimal_number = re.compile(r"[-+]?\d+\.\d+(?:e[-+]?\d+)?")


def close(page: str, run: str) -> bool:
    """Whether a printed number and the run's agree within what another CPU's float32 kernels
    move it: 5 in its last printed digit and 0.1 % of it (an AVX2-only EPYC moved the page's,
    made on another CPU, by up to 3 in the fourth decimal). An integer must be equal."""
    if run is None or not decimal_number.fullmatch(page):
        return page == run
    last_digit = 10.0 ** decimal.Decimal(page).as_tuple().exponent
    return abs(float(page) - float(run)) <= 5 * last_digit + 1e-3 * abs(float(page))


def test_close_takes_rounding_and_nothing_more():
    assert close("-2.1585", "-2.1582") and close("+0.007350", "+0.007351")
    assert not close("-2.1585", "-2.1625") and not close("+0.007350", "+0.007380")
    assert close("1.2e-05", "1.3e-05") and not close("1.2e-05", "1.9e-05")
    assert close("7", "7") and not close("7", "8") and not close("0.5", None)


def test_the_page_shows_the_runs_numbers(numbers):
    with open(worked_step.page_path, encoding="utf-8") as f:
        page = f.read()
    printed = worked_step.read_block(page)
    fresh = worked_step.read_block(worked_step.render(numbers))
    assert printed, "docs/worked-step.md has no numbers block: regenerate it"
    stale = {name: (printed.get(name), fresh.get(name)) for name in printed.keys() | fresh.keys()
             if not close(printed.get(name, ""), fresh.get(name))}
    assert not stale, f"page vs run (name: (page, run)), regenerate the page: {stale}"
    # the tables and the prose too (the response texts, the prompts, the counts): equal but
    # for the decimals, and those close
    rendered = worked_step.render(numbers)
    assert decimal_number.sub("#", page) == decimal_number.sub("#", rendered), \
        "docs/worked-step.md is stale: regenerate it"
    pairs = zip(decimal_number.findall(page), decimal_number.findall(rendered))
    assert all(close(a, b) for a, b in pairs), "docs/worked-step.md is stale: regenerate it"


def hand_penalty(length, max_len, buffer):
    """DAPO's soft overlong punishment: 0 up to max_len - buffer, -1 at max_len."""
    return -min(1.0, max(0, length - (max_len - buffer)) / buffer)


def hand_token_loss(ratio, advantage, low, high, c):
    """-min(r Â, clip(r) Â), then for Â < 0 at most -c Â: written out, not rlep's code."""
    clipped = min(max(ratio, 1 - low), 1 + high)
    loss = -min(ratio * advantage, clipped * advantage)
    return min(loss, -c * advantage) if advantage < 0 else loss


def test_the_group_follows_the_rules_by_hand(numbers):
    group, n, m = numbers["group"], numbers["n"], numbers["m"]
    samples = group["samples"]
    assert len(samples) == n + m and [s["replay"] for s in samples] == [False] * n + [True] * m
    # the shown prompt is a rescue: every fresh answer wrong, the replays right
    assert group["rescued"], ("the off-policy mini-batch holds no rescue any more: choose "
                              "another shown_step in tools/worked_step.py")
    assert not any(s["correct"] for s in samples[:n]) and all(s["correct"] for s in samples[n:])
    # the replays are the drawn pool answers, ended like fresh responses
    assert [s["text"] for s in samples[n:]] == [f"{text}<|im_end|>" for text in group["drawn"]]
    rewards = []
    for s in samples:
        penalty = hand_penalty(s["length"], numbers["max_response_len"],
                               numbers["overlong_buffer"])
        assert s["penalty"] == penalty
        rewards.append((1.0 if s["correct"] else -1.0) + penalty)
    assert [s["reward"] for s in samples] == rewards == group["rewards"]
    mean, std = statistics.mean(rewards), statistics.stdev(rewards)  # stdev: divisor n + m - 1
    assert group["mean"] == pytest.approx(mean, abs=1e-6)
    assert group["std"] == pytest.approx(std, abs=1e-6)
    for s in samples:
        assert s["advantage"] == pytest.approx((s["reward"] - mean) / (std + 1e-6), abs=1e-5)


def test_the_tokens_follow_the_rules_by_hand(numbers):
    low, high, c = numbers["clip_low"], numbers["clip_high"], numbers["clip_c"]
    assert (low, high, c) == (0.2, 0.28, 10.0)
    tokens = numbers["tokens"]["group"] + numbers["tokens"]["examples"]
    assert any(t["clipped"] for t in tokens), "the page's example of a clipped token is gone"
    for t in tokens:
        ratio, advantage = t["ratio"], t["advantage"]
        assert ratio == pytest.approx(math.exp(t["logprob"] - t["old_logprob"]), rel=1e-5)
        assert t["clipped"] == ((advantage > 0 and ratio > 1 + high)
                                or (advantage < 0 and ratio < 1 - low))
        assert t["dual_clipped"] == (advantage < 0 and ratio > c)
        assert t["token_loss"] == pytest.approx(hand_token_loss(ratio, advantage, low, high, c),
                                                abs=1e-5)


def test_the_off_policy_loss_by_hand(numbers):
    """L = -(1/N) Σ min(r Â, clip(r) Â) over every token of the mini-batch, replays included,
    with the dual clip: summed here in float64 from the log-probs policy_loss received."""
    low, high, c = numbers["clip_low"], numbers["clip_high"], numbers["clip_c"]
    first, off = numbers["mini_batches"][0], numbers["mini_batches"][numbers["offpolicy"] - 1]
    assert first["max_abs_log_ratio"] == 0.0 < off["max_abs_log_ratio"]  # r = 1, then not
    total, tokens = 0.0, 0
    for micro in numbers["raw"]:
        assert micro["num_tokens"] == off["N"]
        rows = zip(micro["logprobs"].double(), micro["old_logprobs"].double(),
                   micro["advantages"].double(), micro["mask"].bool())
        for logprobs, old, advantage, mask in rows:
            for logprob, old_logprob in zip(logprobs[mask].tolist(), old[mask].tolist()):
                ratio = math.exp(logprob - old_logprob)
                total += hand_token_loss(ratio, advantage.item(), low, high, c)
                tokens += 1
    assert tokens == off["N"] == off["fresh_tokens"] + off["replay_tokens"]
    assert off["replay_tokens"] > 0
    assert off["loss"] == pytest.approx(total / tokens, abs=1e-6)
    assert sum(numbers["tokens"]["counts"].values()) == off["N"]
