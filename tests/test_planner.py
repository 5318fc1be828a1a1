"""The update's planner, without a model: mini-batches as runs of the step's prompts give every
rank the same number of prompts whenever W divides the mini-batch, cover each prompt once an
epoch; every rank splits its rows into as many micro-batches as the busiest needs (fewer only
where it holds fewer rows), balanced by tokens, each row once, within the token budget or the
size.
Run: python -m pytest -q tests/test_planner.py"""
import collections

import numpy as np
import pytest

from machinery import planner
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


def padded(micro, row_lengths):
    return len(micro) * max(row_lengths[i] for i in micro)


def test_fixed_micro_batches_are_balanced_runs_of_rows_in_order():
    # 7 rows of 5 tokens, 3 a micro-batch: 3 runs; the old split's [3, 3, 1] rows weighed
    # 15, 15, 5; balanced: 2, 3, 2 (10, 15, 10 tokens), heaviest first
    split = planner.split_micro_batches([5] * 7, 0, max_rows=3, max_tokens=0)
    assert split == [[2, 3, 4], [0, 1], [5, 6]]


def test_a_token_budget_split_is_balanced_by_hand():
    row_lengths = [30, 100, 60, 90, 40, 80]  # longest first: rows 1, 3, 5, 2, 4, 0
    # budget 300: rows 1, 3, 5 fill one (3 x 100); 80 + 60 + 40 + 30 would be 320, so the
    # rows need 2: [100, 90, 80] and [60, 40, 30]
    assert planner.split_micro_batches(row_lengths, 0, 8, 300) == [[1, 3, 5], [2, 4, 0]]
    # a busier rank needs 3: the old split ran 300 and 180 padded tokens and one idle
    # pass; an equal share is 400 / 3 = 133: [100] alone (200 is farther), then of the
    # rest's 150 a share [90, 80] (90 alone would leave 4 rows at 320 for 1), then the rest
    split = planner.split_micro_batches(row_lengths, 3, 8, 300)
    assert split == [[3, 5], [2, 4, 0], [1]]  # 180, 180, 100 padded: heaviest first
    assert max(padded(m, row_lengths) for m in split) == 180


def test_a_count_below_the_rows_needs_still_holds_every_row():
    split = planner.split_micro_batches([30, 100, 60, 90, 40, 80], 1, 8, 300)
    assert sorted(i for m in split for i in m) == list(range(6)) and len(split) == 2


def test_token_budget_micro_batches_hold_every_row_once_within_the_budget():
    rng = np.random.default_rng(0)
    row_lengths = rng.integers(200, 3200, 300).tolist()
    budget = 8 * 4096
    fewest = len(planner.split_micro_batches(row_lengths, 0, max_rows=8, max_tokens=budget))
    for count in (0, fewest + 3, 299, 300, 400):
        split = planner.split_micro_batches(row_lengths, count, max_rows=8, max_tokens=budget)
        assert len(split) == min(max(count, fewest), 300)
        assert sorted(i for micro in split for i in micro) == list(range(300))
        for micro in split:
            assert padded(micro, row_lengths) <= budget or len(micro) == 1
    # longest first: similar lengths together, so padding is a small share
    split = planner.split_micro_batches(row_lengths, 0, max_rows=8, max_tokens=budget)
    assert 1 - sum(row_lengths) / sum(padded(m, row_lengths) for m in split) < 0.10
    fixed = planner.split_micro_batches(row_lengths, 0, max_rows=8, max_tokens=0)
    assert 1 - sum(row_lengths) / sum(padded(m, row_lengths) for m in fixed) > 0.25


def test_fixed_micro_batches_keep_the_order_within_the_size():
    # share_prompts: a group's rows are consecutive and stay together where they can
    rng = np.random.default_rng(2)
    row_lengths = rng.integers(50, 900, 45).tolist()
    for count in (0, 7, 9, 44):
        split = planner.split_micro_batches(row_lengths, count, max_rows=8, max_tokens=0)
        assert len(split) == max(count, 6)
        for micro in split:
            assert micro == list(range(micro[0], micro[-1] + 1)) and len(micro) <= 8
        assert sorted(i for m in split for i in m) == list(range(45))


def test_a_rank_without_rows_has_no_micro_batch():
    assert planner.split_micro_batches([], 4, max_rows=8, max_tokens=0) == []
    assert planner.split_micro_batches([], 4, max_rows=8, max_tokens=100) == []


def test_a_row_longer_than_the_budget_goes_alone():
    split = planner.split_micro_batches([10, 100, 10, 10], 0, max_rows=8, max_tokens=40)
    assert split == [[1], [0, 2, 3]]


def split_of(cfg):
    return planner.Split(cfg.micro_batch_size, cfg.micro_batch_tokens, cfg.share_prompts)


def paper_sizes(num_prompts, seed, replays=False):
    cfg = rlep.parse_config(["--preset", "paper"])
    rng = np.random.default_rng(seed)
    sizes = {}
    for p in range(num_prompts):
        samples = cfg.n + (int(rng.choice([1, cfg.replay_m])) if replays else 0)
        lengths = tuple(int(x) for x in rng.integers(300, 3400, samples))
        sizes[p] = planner.GroupSize(p, sum(lengths), lengths)
    return cfg, sizes


def dealt(sizes, world_size):
    """The sizes as the trainer gathers them: prompt p generated on rank p % W."""
    return {p: g._replace(rank=p % world_size) for p, g in sizes.items()}


def test_any_rank_plans_the_same_micro_batches_for_every_rank():
    cfg, sizes = paper_sizes(64, seed=1)
    sizes = dealt(sizes, 8)
    positions = rlep.plan_mini_batches(64, 1, epoch=0, seed=0)[0]
    plan = planner.plan_micro_batches(positions, sizes, 8, split_of(cfg))
    held = sorted(pair for micro_batches in plan for micro in micro_batches for pair in micro)
    assert held == sorted((p, i) for p in range(64) for i in range(cfg.n))
    # rows, not groups: a rank trains rows of prompts generated on other ranks
    assert any(len({p % 8 for micro in micro_batches for p, _ in micro}) > 1
               for micro_batches in plan)
    # deterministic: planned again, the same
    assert plan == planner.plan_micro_batches(positions, sizes, 8, split_of(cfg))


@pytest.mark.parametrize("world_size", [2, 8, 64])
@pytest.mark.parametrize("micro_batch_tokens", [16384, 0])
def test_every_rank_runs_the_same_passes_balanced_and_none_idles(world_size,
                                                                micro_batch_tokens):
    cfg, sizes = paper_sizes(512, seed=4, replays=True)
    sizes = dealt(sizes, world_size)
    cfg.micro_batch_tokens = micro_batch_tokens
    # RLEP's 9 runs of 56 or 57 prompts (the first 3): at W = 64 fewer prompts than ranks
    for positions in rlep.plan_mini_batches(512, 9, epoch=0, seed=0)[:3]:
        plan = planner.plan_micro_batches(positions, sizes, world_size, split_of(cfg))
        lengths = [n for p in positions for n in sizes[p].row_lengths]
        fewest = len(planner.split_micro_batches(lengths, 0, cfg.micro_batch_size,
                                                   micro_batch_tokens))
        # no idle pass, and no more passes than the fewest the mini-batch needs over W
        assert {len(micro_batches) for micro_batches in plan} == {-(-fewest // world_size)}
        loads = []
        for micro_batches in plan:
            for micro in micro_batches:
                lengths = [sizes[p].row_lengths[i] for p, i in micro]
                if micro_batch_tokens:
                    assert len(lengths) * max(lengths) <= micro_batch_tokens or len(micro) == 1
                else:
                    assert len(micro) <= cfg.micro_batch_size
            loads.append(sum(sizes[p].row_lengths[i] for micro in micro_batches
                             for p, i in micro))
        # under a token budget the ranks' tokens balance (by rows, runs are in order)
        assert max(loads) / np.mean(loads) < (1.1 if micro_batch_tokens else 1.5)


def test_shared_prompts_keep_each_group_where_it_was_generated():
    cfg, sizes = paper_sizes(64, seed=2)
    # held where generated, not by position (dynamic sampling keeps groups of any rank)
    sizes = {p: g._replace(rank=p // 2 % 8) for p, g in sizes.items()}
    split = planner.Split(cfg.micro_batch_size, 0, share_prompts=True)
    for positions in rlep.plan_mini_batches(64, 3, epoch=0, seed=0):
        plan = planner.plan_micro_batches(positions, sizes, 8, split)
        for rank, micro_batches in enumerate(plan):
            held = sorted(pair for micro in micro_batches for pair in micro)
            assert held == [(p, i) for p in positions if p // 2 % 8 == rank
                            for i in range(cfg.n)]
        # as many passes on every rank (idle ones are the update's, for a rank without rows)
        assert len({len(micro_batches) for micro_batches in plan if micro_batches}) == 1


def test_one_rank_plans_the_split_of_the_whole_mini_batch():
    cfg, sizes = paper_sizes(16, seed=3, replays=True)
    positions = range(16)
    lengths = [n for p in positions for n in sizes[p].row_lengths]
    rows = [(p, i) for p in positions for i in range(len(sizes[p].row_lengths))]
    for split in (split_of(cfg), split_of(cfg)._replace(max_tokens=0)):
        one = planner.plan_micro_batches(positions, sizes, 1, split)[0]
        alone = planner.split_micro_batches(lengths, 0, split.max_rows, split.max_tokens)
        assert one == [[rows[j] for j in micro] for micro in alone]


def test_share_prompts_refuses_a_token_budget():
    with pytest.raises(SystemExit):
        rlep.parse_config(["--preset", "paper", "--share_prompts"])
