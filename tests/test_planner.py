"""The update's planner, without a model: mini-batches as runs of the step's prompts give every
rank the same number of prompts whenever W divides the mini-batch, cover each prompt once an
epoch, and micro-batches by a token budget keep every row once and within the budget.
Run: python -m pytest -q tests/test_planner.py"""
import collections

import numpy as np
import pytest

import rlep


def prompts_per_rank(positions, world_size):
    counts = collections.Counter(int(p) % world_size for p in positions)
    return [counts[r] for r in range(world_size)]


@pytest.mark.parametrize("world_size", [1, 2, 8, 16, 64])
def test_every_rank_holds_the_same_prompts_in_each_mini_batch(world_size):
    # the paper's step: 512 prompts, mini-batches of 64 -> 8 updates
    runs = rlep.plan_mini_batches(512, 8, epoch=0, seed=3)
    assert len(runs) == 8
    for positions in runs:
        assert prompts_per_rank(positions, world_size) == [64 // world_size] * world_size


@pytest.mark.parametrize("world_size", [8, 16, 64])
def test_nine_updates_split_the_prompts_as_evenly_as_possible(world_size):
    # RLEP: 512 x 18 sequences make 9 updates; 9 does not divide 512
    for positions in rlep.plan_mini_batches(512, 9, epoch=0, seed=3):
        counts = prompts_per_rank(positions, world_size)
        assert max(counts) - min(counts) <= 1
        assert len(positions) in (56, 57)


@pytest.mark.parametrize("epoch", [0, 1, 2])
def test_an_epoch_covers_every_prompt_once(epoch):
    runs = rlep.plan_mini_batches(40, 6, epoch=epoch, seed=11)
    covered = np.concatenate(runs)
    assert sorted(covered.tolist()) == list(range(40))


def test_later_epochs_take_the_same_balanced_runs_in_another_order():
    first = [tuple(r.tolist()) for r in rlep.plan_mini_batches(64, 8, epoch=0, seed=5)]
    orders = set()
    for seed in range(6):
        later = [tuple(r.tolist()) for r in rlep.plan_mini_batches(64, 8, epoch=1, seed=seed)]
        assert sorted(later) == sorted(first)
        orders.add(tuple(later))
    # seeded: not always the first epoch's order
    assert len(orders) > 1


def test_fixed_micro_batches_are_runs_of_rows_in_order():
    split = rlep.split_micro_batches([5] * 7, max_rows=3, max_tokens=0)
    assert split == [[0, 1, 2], [3, 4, 5], [6]]


def test_token_budget_micro_batches_hold_every_row_once_within_the_budget():
    rng = np.random.default_rng(0)
    row_lengths = rng.integers(200, 3200, 300).tolist()
    budget = 8 * 4096
    split = rlep.split_micro_batches(row_lengths, max_rows=8, max_tokens=budget)
    assert sorted(i for micro in split for i in micro) == list(range(300))
    for micro in split:
        padded = len(micro) * max(row_lengths[i] for i in micro)
        assert padded <= budget or len(micro) == 1
    # longest first: similar lengths together, so padding is a small share
    padded = sum(len(m) * max(row_lengths[i] for i in m) for m in split)
    assert 1 - sum(row_lengths) / padded < 0.10
    fixed = rlep.split_micro_batches(row_lengths, max_rows=8, max_tokens=0)
    padded_fixed = sum(len(m) * max(row_lengths[i] for i in m) for m in fixed)
    assert 1 - sum(row_lengths) / padded_fixed > 0.25


def test_a_rank_without_rows_has_no_micro_batch():
    assert rlep.split_micro_batches([], max_rows=8, max_tokens=0) == []
    assert rlep.split_micro_batches([], max_rows=8, max_tokens=100) == []


def test_a_row_longer_than_the_budget_goes_alone():
    split = rlep.split_micro_batches([10, 100, 10, 10], max_rows=8, max_tokens=40)
    assert [1] in split
    assert sorted(i for m in split for i in m) == [0, 1, 2, 3]


def test_any_rank_plans_the_same_micro_batches_for_every_rank():
    cfg = rlep.parse_config(["--preset", "paper"])
    rng = np.random.default_rng(1)
    sizes = {}
    for p in range(64):
        lengths = tuple(int(x) for x in rng.integers(300, 4000, cfg.n))
        sizes[p] = rlep.GroupSize(p, sum(lengths), lengths)
    positions = rlep.plan_mini_batches(64, 1, epoch=0, seed=0)[0]
    plans = [rlep.rank_micro_batches(positions, sizes, r, 8, cfg) for r in range(8)]
    held = sorted(pair for plan in plans for micro in plan for pair in micro)
    assert held == sorted((p, i) for p in range(64) for i in range(cfg.n))
    # whole groups on their rank
    for rank, plan in enumerate(plans):
        assert all(p % 8 == rank for micro in plan for p, _ in micro)


def test_share_prompts_refuses_a_token_budget():
    with pytest.raises(SystemExit):
        rlep.parse_config(["--preset", "paper", "--share_prompts"])
