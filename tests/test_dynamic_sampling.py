"""--dynamic_sampling (DAPO's, as verl's filter_groups with metric acc): which groups are dropped
(replays counted), the rounds a step draws and the places its kept groups take, the cap, the
gen_* counts every run logs; with the real engine on the tiny preset, a resumed run and a 2-rank
run against an uninterrupted 1-rank one.
Run: python -m pytest -q tests/test_dynamic_sampling.py"""
import json
import os
import random

import pytest
import torch
import torch.distributed as dist
from transformers import AutoTokenizer

from machinery import checkpoints, data, metrics, ranks, vllm_engine
import forked
import rlep
from test_rlep import assert_same_weights, read_jsonl, relative_gap, run_rlep

cpu = torch.device("cpu")
single = ranks.Dist(False, 0, 1, cpu, True)


def sample(correct, replay=False, reward=None):
    reward = (1.0 if correct else -1.0) if reward is None else reward
    return rlep.Sample([1, 2], [3, 4], correct, reward, replay)


def test_a_group_is_dropped_when_its_answers_all_agree_replays_included():
    right, wrong = sample(True), sample(False)
    right_replay, wrong_replay = sample(True, True), sample(False, True)
    assert rlep.right_and_wrong([right, wrong, wrong])
    assert not rlep.right_and_wrong([wrong] * 4) and not rlep.right_and_wrong([right] * 4)
    # RLEP's rescue: every fresh rollout wrong, a replay right: kept
    assert rlep.right_and_wrong([wrong] * 4 + [right_replay] * 2)
    # all right, replays right too: no signal, dropped
    assert not rlep.right_and_wrong([right] * 4 + [right_replay] * 2)
    assert not rlep.right_and_wrong([wrong] * 4 + [wrong_replay] * 2)
    # verl's metric acc: correctness, not the overlong penalty's reward differences
    assert not rlep.right_and_wrong([sample(True, reward=1.0), sample(True, reward=0.5)])


def test_the_first_mixed_groups_in_stream_order_are_kept_and_dropped_ones_fill_a_short_step():
    flags = [((0, 0), True), ((0, 1), False), ((0, 2), True), ((1, 0), False), ((1, 1), True),
             ((1, 2), True)]
    assert rlep.first_flagged(flags, 3) == [(0, 0), (0, 2), (1, 1)]
    # the order the ranks' reports arrive in does not matter
    shuffled = flags[:]
    random.Random(0).shuffle(shuffled)
    assert rlep.first_flagged(shuffled, 3) == [(0, 0), (0, 2), (1, 1)]
    # fewer mixed than the count: the earliest dropped fill in, all in stream order
    assert rlep.first_flagged(flags, 5) == [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2)]
    assert rlep.first_flagged(flags[:2], 2) == [(0, 0), (0, 1)]


class ScheduledEngine:
    """vLLM's place, with a schedule: in generate call j, prompt i's group is mixed (half its
    answers right) when schedule[j][i], else all wrong. Records the seeds of each call."""

    def __init__(self, tokenizer, rows, cfg, schedule):
        self.tokenizer, self.schedule, self.seeds = tokenizer, schedule, []
        self.gold = {tuple(rlep.render_prompt(tokenizer, row, cfg.prompt_template,
                                              cfg.max_prompt_len)): row["answer"]
                     for row in rows}

    def sleep(self):
        pass

    def generate(self, prompts, n, temperature, top_p, max_tokens, stop_ids, seeds,
                 logprobs=False, progress=False):
        mixed = self.schedule[len(self.seeds)]
        self.seeds.append(seeds)
        out = []
        for prompt, flag in zip(prompts, mixed):
            gold = int(self.gold[tuple(prompt)])
            texts = [f"Answer: {gold if flag and j % 2 == 0 else gold + 10}" for j in range(n)]
            ids = [self.tokenizer(t + "<|im_end|>")["input_ids"] for t in texts]
            out.append([vllm_engine.Completion(i, [-1.0] * len(i)) for i in ids])
        return out


def flags_of(*patterns):
    """A schedule from strings, a round each: "x" mixed, "." all wrong."""
    return [[c == "x" for c in p] for p in patterns]


def groups_of_step(tiny_model, schedule, *flags, first_round=3, step=2, replay=False):
    cfg = rlep.parse_config(["--preset", "tiny", *flags])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rows = data.read_rows(cfg.train_file)
    if replay:
        rows = [{**row, "responses": [f"Answer: {row['answer']}"] * 2} for row in rows]
    engine = ScheduledEngine(tokenizer, rows, cfg, schedule)
    my_groups, meter = rlep.make_groups(cfg, "phase1", step, first_round, rows, engine,
                                        tokenizer, tokenizer.eos_token_id, single, replay, {})
    # the row ids of round j's prompts, in their positions
    ids = [[rows[i]["id"] for i in rlep.step_prompts(len(rows), 8, first_round + j, cfg.seed)]
           for j in range(len(engine.seeds))]
    return cfg, my_groups, meter, ids, engine


def test_the_step_is_refilled_from_the_next_rounds_in_their_order(tiny_model):
    schedule = flags_of("xx.x..x.", ".x...x..", "x.xx.xxx", "xxxxxxxx")
    cfg, my_groups, meter, ids, engine = groups_of_step(tiny_model, schedule,
                                                        "--dynamic_sampling")
    # 4 mixed, then 2 (6), then 5: the third round fills the step and the last is not drawn
    assert meter == {"gen_rounds": 3, "gen_prompts": 24, "gen_responses": 24 * cfg.n,
                     "kept_groups": 8, "gen_capped": False}
    expected = ([ids[0][p] for p in (0, 1, 3, 6)] + [ids[1][p] for p in (1, 5)]
                + [ids[2][p] for p in (0, 2)])
    assert list(my_groups) == list(range(8))
    assert [g[0].row_id for g in my_groups.values()] == expected
    assert all(rlep.right_and_wrong(g) for g in my_groups.values())
    # round 0 keeps the key of a run without the flag; round j adds j
    for j, seeds in enumerate(engine.seeds):
        extra = (j,) if j else ()
        assert seeds == [rlep.seed_for(cfg.seed, "phase1", 2, i, *extra) for i in ids[j]]
    assert engine.seeds[1] != [rlep.seed_for(cfg.seed, "phase1", 2, i) for i in ids[1]]


def test_at_the_cap_the_dropped_groups_fill_the_step_earliest_first(tiny_model, capsys):
    schedule = flags_of("x..x....", ".x......")
    cfg, my_groups, meter, ids, _ = groups_of_step(tiny_model, schedule, "--dynamic_sampling",
                                                   "--max_gen_rounds", "2")
    assert meter["gen_capped"] and meter["kept_groups"] == 3 and meter["gen_rounds"] == 2
    # the 3 mixed ones and round 0's first 5 dropped, in stream order: a full step of B
    kept = [(0, p) for p in range(7)] + [(1, 1)]
    assert [g[0].row_id for g in my_groups.values()] == [ids[j][p] for j, p in kept]
    record = {"reward_mean": 0.0, **meter}
    metrics.log_step("phase1", 3, 4, record)
    assert "capped: 3 groups mixed" in capsys.readouterr().out


# Two rounds on 2 ranks where the choice binds: 3 mixed groups, then 7 for the 5 places left.
# Rank r reports positions r, r + 2, ... (make_groups's gather, in rank order): the first 5
# mixed of round 1 in that order are positions 0, 4, 6, 1, 3, where the stream's are 0, 1, 3,
# 4, 5
binding = (".xx..x..", "xx.xxxxx")
binding_kept = [(0, 1), (0, 2), (0, 5), (1, 0), (1, 1), (1, 3), (1, 4), (1, 5)]


def gathered(patterns, world_size):
    """make_groups's flags on `world_size` ranks: each round's, every rank's in rank order."""
    return [((j, p), pattern[p] == "x") for j, pattern in enumerate(patterns)
            for rank in range(world_size) for p in range(rank, len(pattern), world_size)]


def test_the_choice_takes_stream_order_not_the_order_the_ranks_report_in():
    for world_size in (1, 2, 4):
        assert rlep.first_flagged(gathered(binding, world_size), 8) == binding_kept
    # it binds: the first 8 mixed in the 2 ranks' report order are other groups
    reported = [key for key, flag in gathered(binding, 2) if flag][:8]
    assert sorted(reported) != binding_kept


def groups_on_rank(rank, port, model_path, out):
    """make_groups on rank `rank` of 2, with the binding schedule: the kept groups it holds,
    {place in the step: (row id, the (round, position) it was made at)}, saved as json."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    cfg = rlep.parse_config(["--preset", "tiny", "--dynamic_sampling"])
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    rows = data.read_rows(cfg.train_file)
    # this rank generates positions rank, rank + 2, ...
    engine = ScheduledEngine(tokenizer, rows, cfg, flags_of(*(p[rank::2] for p in binding)))
    d = ranks.Dist(True, rank, 2, cpu, rank == 0)
    my_groups, meter = rlep.make_groups(cfg, "phase1", 2, 3, rows, engine, tokenizer,
                                        tokenizer.eos_token_id, d, False, {})
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"groups": {i: g[0].row_id for i, g in my_groups.items()}, "meter": meter}, f)
    dist.destroy_process_group()


def test_two_ranks_keep_the_same_groups_in_the_same_places_as_one_where_the_choice_binds(
        tiny_model, tmp_path, free_port):
    cfg, my_groups, meter, ids, _ = groups_of_step(tiny_model, flags_of(*binding),
                                                   "--dynamic_sampling")
    one = [g[0].row_id for g in my_groups.values()]
    assert list(my_groups) == list(range(8)) and meter["gen_rounds"] == 2
    assert one == [ids[j][p] for j, p in binding_kept]
    forked.spawn(groups_on_rank, args=(free_port, tiny_model, str(tmp_path)), nprocs=2)
    ranks = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(2)]
    two = {int(i): row_id for r in ranks for i, row_id in r["groups"].items()}
    assert [two[i] for i in range(8)] == one and sum(len(r["groups"]) for r in ranks) == 8
    # each kept group stays on the rank that made it: position p on rank p % 2
    for rank, r in enumerate(ranks):
        assert sorted(map(int, r["groups"])) == [i for i, (_, p) in enumerate(binding_kept)
                                                 if p % 2 == rank]
        assert r["meter"] == meter


def test_replays_rescue_a_group_whose_fresh_rollouts_all_fail(tiny_model):
    """Phase two: every fresh rollout wrong, two right replays per prompt: every group is mixed,
    one round is enough."""
    schedule = flags_of("........", "........")
    _, my_groups, meter, _, _ = groups_of_step(tiny_model, schedule, "--dynamic_sampling",
                                               replay=True)
    assert meter["gen_rounds"] == 1 and meter["kept_groups"] == 8 and len(my_groups) == 8


def test_without_the_flag_a_step_is_one_round_and_every_group_is_trained(tiny_model):
    schedule = flags_of("x..x....")
    cfg, my_groups, meter, ids, engine = groups_of_step(tiny_model, schedule, first_round=2)
    assert meter == {"gen_rounds": 1, "gen_prompts": 8, "gen_responses": 8 * cfg.n,
                     "kept_groups": 2}
    # as before the flag: the step's slot of prompts, positions 0..B-1, today's seeds
    assert [g[0].row_id for g in my_groups.values()] == ids[0] and list(my_groups) == list(range(8))
    assert engine.seeds[0] == [rlep.seed_for(cfg.seed, "phase1", 2, i) for i in ids[0]]


def test_a_checkpoint_without_its_round_resumes_at_its_step(tmp_path):
    folder = tmp_path / "step_000002"
    folder.mkdir()
    torch.save({"step": 2, "torch_rng": torch.get_rng_state()}, folder / "trainer_state.pt")
    checkpoints.write_record(str(folder), 2)  # as a save ends: complete
    assert checkpoints.resume_point(str(tmp_path)) == (2, str(folder), 2)
    torch.save({"step": 2, "prompt_round": 5}, folder / "trainer_state.pt")
    assert checkpoints.resume_point(str(tmp_path)) == (2, str(folder), 5)
    assert checkpoints.resume_point(str(tmp_path / "none")) == (0, None, 0)


# -----------------------------------------------------------------------------------------
# The real engine on the tiny preset, phase one: a few groups are all wrong, and some steps
# take a second round (2, 1, 1, 2 rounds)

flags = ["--dynamic_sampling", "--val_every", "0", "--no-share_prompts"]


def train_phase_one(tiny_model, engine, out, steps):
    cfg = rlep.parse_config(["--preset", "tiny", "--out_dir", str(out), *flags])
    cfg.phase1_steps = steps
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rows = data.read_rows(cfg.train_file)
    rlep.train(cfg, "phase1", rows, engine, tokenizer, tokenizer.eos_token_id, tiny_model,
               single, [], rlep.RunState())
    return cfg, read_jsonl(out / "phase1" / "metrics.jsonl")


runs = {}


@pytest.fixture
def dynamic_run(tiny_model, tiny_engine, tmp_path_factory):
    """Four steps of phase one with --dynamic_sampling on the shared engine, run once."""
    if not runs:
        out = tmp_path_factory.mktemp("dynamic") / "run"
        runs["run"] = (*train_phase_one(tiny_model, tiny_engine, out, 4), out)
    return runs["run"]


def test_a_dynamic_run_logs_what_it_generated(dynamic_run):
    cfg, rows, _ = dynamic_run
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert r["gen_responses"] == r["gen_prompts"] * cfg.n
        assert r["gen_prompts"] == r["gen_rounds"] * cfg.prompts_per_step
        assert r["kept_groups"] <= cfg.prompts_per_step and r["gen_capped"] is False
        # the trained groups are the mixed ones: none without a signal
        assert r["kept_groups"] == cfg.prompts_per_step and r["zero_std_frac"] == 0
        assert len(r["visits"]) == cfg.prompts_per_step
    # more than one round somewhere, or the test shows nothing
    assert sum(r["gen_rounds"] for r in rows) > 4
    # each step's prompts come from its own rounds, the next step's rounds follow
    train_rows = data.read_rows(cfg.train_file)
    first = 0
    for r in rows:
        drawn = [train_rows[i]["id"] for g in range(first, first + r["gen_rounds"])
                 for i in rlep.step_prompts(len(train_rows), 8, g, cfg.seed)]
        assert {v["id"] for v in r["visits"]} <= set(drawn)
        if r["gen_rounds"] > 1:
            assert not {v["id"] for v in r["visits"]} <= set(drawn[:8])
        first += r["gen_rounds"]


def test_a_resumed_dynamic_run_starts_at_the_round_the_uninterrupted_one_did(
        tiny_model, tiny_engine, dynamic_run, tmp_path):
    _, rows, out = dynamic_run
    resumed = tmp_path / "resumed"
    # stopped after its checkpoint at step 2, then continued to step 4
    train_phase_one(tiny_model, tiny_engine, resumed, 2)
    _, resumed_rows = train_phase_one(tiny_model, tiny_engine, resumed, 4)
    assert [r["visits"] for r in resumed_rows] == [r["visits"] for r in rows]
    assert [r["gen_rounds"] for r in resumed_rows] == [r["gen_rounds"] for r in rows]
    assert_same_weights(checkpoints.checkpoint_path(str(resumed / "phase1"), 4),
                        checkpoints.checkpoint_path(str(out / "phase1"), 4))


def test_two_ranks_keep_the_same_groups_and_train_the_same_weights(tiny_model, dynamic_run,
                                                                    tmp_path):
    """Needs the planner to read each group's rank (GroupSize.rank): a kept group stays on the
    rank that made it, not on rank p % W."""
    _, rows, out = dynamic_run
    two = tmp_path / "two"
    # its first 2 steps, compared: as the resumed run above shows, a run of 2 steps is the first
    # 2 of a run of 4
    run_rlep(two, os.path.dirname(tiny_model), "--phase", "1", "--phase1_steps", "2", *flags,
             nproc=2)
    two_rows = read_jsonl(two / "phase1" / "metrics.jsonl")
    assert [r["step"] for r in two_rows] == [1, 2]
    # same prompts and seeds, the same global choice: the same kept prompts (the ranks' visits
    # come in rank order), until float rounding may flip a sample (as tests/test_rlep.py's)
    for r, one in zip(two_rows, rows):
        assert sorted(v["id"] for v in r["visits"]) == sorted(v["id"] for v in one["visits"])
        assert r["gen_rounds"] == one["gen_rounds"] and r["acc_fresh"] == one["acc_fresh"]
    assert relative_gap(checkpoints.checkpoint_path(str(two / "phase1"), 2),
                        checkpoints.checkpoint_path(str(out / "phase1"), 2), tiny_model) < 1e-4
