"""The replay study's analysis (studies/study_replay.py and its modules in studies/replay/,
docs/study-plan.md) on hand-made numbers: t quantiles and p-values (scipy's, and the plans'
table), Holm's step-down and its intervals, the words of an interval, the mechanism on matched
prompts and the compute charges, from metrics.jsonl files written here. No model, a few seconds;
needs scipy, as the study does.
Run: python -m pytest -q tests/test_study.py"""
import dataclasses
import glob
import json
import math
import os
import shutil
import sys
import types

import numpy as np
import pytest
from scipy import stats

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "studies"))
import study_replay as study  # noqa: E402
from replay import (archiving, arms, compute, dynamic_report, intervals, mechanism,  # noqa: E402
                    offpolicy_report, runner)


def test_t_quantiles_and_p_values_match_the_95_table_and_known_values():
    # the plans' two-decimal table is the exact quantiles rounded
    for df, t in intervals.t95_table.items():
        assert round(stats.t.ppf(0.975, df), 2) == t
    table = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}
    assert intervals.t95_table == table
    # p-values in closed form: df 1 (Cauchy), [0, 2]: t = 1, P(|T| > 1) = 1/2; df 2, [0, 1, 2]:
    # t = sqrt(3), P(|T| > t) = 1 - t / sqrt(2 + t^2)
    assert intervals.paired_test([0.0, 2.0])["p"] == pytest.approx(0.5)
    assert intervals.paired_test([0.0, 1.0, 2.0])["p"] == pytest.approx(1 - math.sqrt(3 / 5))
    # t(0.995, 7) = 3.4995, t(0.99, 5) = 3.3649 (printed tables): Holm intervals at those levels
    assert intervals.level_bounds({"n": 8, "mean": 0.0, "se": 1.0}, 0.01)[1] == \
        pytest.approx(3.4995, abs=1e-4)
    assert intervals.level_bounds({"n": 6, "mean": 1.0, "se": 2.0}, 0.02) == \
        pytest.approx((1 - 2 * 3.3649, 1 + 2 * 3.3649), abs=2e-4)
    # the p-value at the 95 % quantile is 0.05: differences whose t is t(0.975, 7) = 2.3646
    values = np.array([1.0, 2.0, 0.5, 1.5, 3.0, 0.2, 1.1, 2.2])
    se = np.std(values, ddof=1) / math.sqrt(8)
    shifted = values - values.mean() + 2.364624 * se
    assert intervals.paired_test(shifted)["p"] == pytest.approx(0.05, abs=1e-6)
    test = intervals.paired_test(values)
    assert test["p"] < 0.05 and test["se"] == pytest.approx(se)


def test_the_raw_interval_beyond_the_table_takes_the_exact_quantile():
    # 12 seeds, df 11: t(0.975, 11) = 2.2010 (printed tables), not the normal's 2.0
    values = [0.01 * i for i in range(12)]
    mean, low, high = intervals.t95_bounds(values)
    se = np.std(values, ddof=1) / math.sqrt(12)
    assert (high - mean) / se == pytest.approx(2.2010, abs=1e-4)
    # within the table: its two-decimal value, as the plan states (df 7: 2.36)
    mean, low, high = intervals.t95_bounds(values[:8])
    assert (high - mean) / (np.std(values[:8], ddof=1) / math.sqrt(8)) == pytest.approx(2.36)


def test_holm_against_a_hand_example():
    # sorted: 0.005 (x4 = 0.02, <= 0.0125: rejected), 0.01 (x3 = 0.03, <= 0.0167: rejected),
    # 0.03 (x2 = 0.06, > 0.025: stops here), 0.04 (x1, running max 0.06: kept at 0.025)
    out = intervals.holm([0.01, 0.04, 0.03, 0.005])
    assert [o["rejected"] for o in out] == [True, False, False, True]
    assert [o["p_holm"] for o in out] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [o["level"] for o in out] == pytest.approx([0.05 / 3, 0.025, 0.025, 0.0125])
    assert [o["rank"] for o in out] == [2, 4, 3, 1]


def test_a_holm_interval_excludes_zero_exactly_where_holm_rejects():
    rng = np.random.default_rng(0)
    for trial in range(50):
        # 8 contrasts over 8 seeds, some with an effect
        acc = {arm: rng.normal(0.2, 0.02, (8, 4)) for arm in ("A1", "A2", "A3", "A4", "A5")}
        acc["A3"] += rng.uniform(0, 0.05)
        acc["A4"] += rng.uniform(0, 0.05)
        rows = intervals.contrasts_table(acc, arms.family)
        assert len(rows) == 8
        for r in rows:
            assert intervals.excludes_zero(*r["holm"]) == r["rejected"]
            # the Holm interval is never narrower than the raw 95 % one
            assert r["holm"][0] <= r["raw"][0] + 0.02 and r["holm"][1] >= r["raw"][1] - 0.02
            assert r["word"].startswith("a difference") == r["rejected"]


def test_contrasts_by_hand():
    # 3 seeds, points at steps 0, 2, 4: peak = best after step 0, final = the last point
    acc = {"A3": np.array([[0.1, 0.30, 0.25], [0.1, 0.20, 0.28], [0.1, 0.22, 0.24]]),
           "A1": np.array([[0.1, 0.20, 0.21], [0.1, 0.18, 0.20], [0.1, 0.19, 0.22]])}
    peak, final = intervals.contrasts_table(acc, [("A3", "A1")])
    assert peak["values"] == pytest.approx([9.0, 8.0, 2.0])  # 30-21, 28-20, 24-22
    assert final["values"] == pytest.approx([4.0, 8.0, 2.0])
    mean, sd = np.mean([9, 8, 2]), np.std([9, 8, 2], ddof=1)
    assert peak["raw"][1] == pytest.approx(mean + 4.30 * sd / math.sqrt(3))
    assert intervals.interval(np.array([9, 8, 2]) / 100) == \
        f"{mean:+.1f} [{mean - 4.30 * sd / 3 ** 0.5:+.1f}, {mean + 4.30 * sd / 3 ** 0.5:+.1f}]"


def test_interval_words():
    assert intervals.word(0.5, 3.0, 2.0) == "a difference (+)"
    assert intervals.word(-3.0, -0.1, 2.0) == "a difference (-)"
    assert intervals.word(-1.5, 1.8, 2.0) == "a null (inside ±2.0)"
    assert intervals.word(-2.0, 2.0, 2.0) == "a null (inside ±2.0)"
    assert intervals.word(-2.5, 1.0, 2.0) == "uninformative"
    assert intervals.word(-0.5, 4.0, 2.0, raw=(0.3, 3.0)) == \
        "uninformative (raw interval excludes 0; not after Holm)"
    assert intervals.word(float("nan"), float("nan"), 2.0) == "no interval"


def visit(prompt, fresh_correct, replays=0):
    return {"id": prompt, "fresh_correct": fresh_correct, "replays": replays,
            "rescued": replays > 0 and fresh_correct == 0}


def write_part(folder, part, visits_by_step, acc, kinds=None, extra=None):
    """A part's metrics.jsonl: step 0 and every other step validated (acc: step -> val_acc);
    extra: step -> more fields of its row."""
    os.makedirs(os.path.join(folder, part), exist_ok=True)
    rows = [{"step": 0, "val_acc": acc[0], **(kinds or {})}]
    for step, visits in visits_by_step.items():
        row = {"step": step, "visits": visits, "rescued": sum(v["rescued"] for v in visits),
               "response_len": 10.0, **(extra or {}).get(step, {})}
        if step in acc:
            row.update(val_acc=acc[step], **(kinds or {}))
        rows.append(row)
    with open(os.path.join(folder, part, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"dtype": "float32"}, f)


# seed 1 (n = 8): matched all-wrong visits (1, p1) and (2, p4), next visits at step 3:
# A3 5/8 - A2 2/8 = +37.5 and A3 1/8 - A2 0/8 = +12.5, seed mean +25.0; (4, p5) is matched
# but has no next visit; (3, p4) is all wrong in A2 only, (1, p3) in A3 only
a2_seed1 = {1: [visit("p1", 0), visit("p2", 0), visit("p3", 3)],
            2: [visit("p4", 0), visit("p5", 1)],
            3: [visit("p1", 2), visit("p2", 1), visit("p4", 0)],
            4: [visit("p3", 8), visit("p5", 0)]}
a3_seed1 = {1: [visit("p1", 0, 2), visit("p2", 2, 2), visit("p3", 0, 2)],
            2: [visit("p4", 0, 2), visit("p5", 0, 2)],
            3: [visit("p1", 5, 2), visit("p2", 4, 2), visit("p4", 1, 2)],
            4: [visit("p3", 6, 2), visit("p5", 0, 2)]}
# seed 2: one matched pair, (1, p1), next visit at step 2: A3 1/8 - A2 2/8 = -12.5
a2_seed2 = {1: [visit("p1", 0), visit("p2", 4)], 2: [visit("p1", 2)], 3: [visit("p2", 4)],
            4: [visit("p1", 1)]}
a3_seed2 = {1: [visit("p1", 0, 2), visit("p2", 0, 2)], 2: [visit("p1", 1, 2)],
            3: [visit("p2", 5, 2)], 4: [visit("p1", 3, 2)]}


def test_matched_next_visits_by_hand():
    rows = {name: [{"step": s, "visits": v} for s, v in visits.items()]
            for name, visits in (("a2", a2_seed1), ("a3", a3_seed1))}
    found = mechanism.matched_next_visits(rows["a3"], rows["a2"], 8)
    assert found["matched"] == 3 and found["rescued"] == 3 and found["unmatched"] == 0
    assert found["differences"] == pytest.approx([0.375, 0.125])
    assert found["a"] == pytest.approx([5 / 8, 1 / 8]) and found["b"] == pytest.approx([2 / 8, 0])
    # visit orders that differ are counted, not paired
    shifted = {**a2_seed1, 3: [visit("p2", 1)], 4: [visit("p1", 2), visit("p3", 8),
                                                     visit("p5", 0), visit("p4", 0)]}
    found = mechanism.matched_next_visits(
        rows["a3"], [{"step": s, "visits": v} for s, v in shifted.items()], 8)
    assert found["unmatched"] == 2 and found["differences"] == []
    # the comparator: in A3 seed 1, rescued visits (1, p1), (1, p3), (2, p4), (2, p5) have next
    # visits 5/8, 6/8, 1/8, 0/8; the pooled visit (1, p2), not rescued, has 4/8
    comparator = mechanism.rescue_comparator(rows["a3"], 8)
    assert sorted(comparator["rescued"]) == pytest.approx(sorted([5 / 8, 6 / 8, 1 / 8, 0.0]))
    assert comparator["not rescued"] == pytest.approx([4 / 8])


def write_collection(main, tried):
    """A main run's collect/: a pool of p1-p3, and `tried` prompts tried (100 tokens each)."""
    os.makedirs(os.path.join(main, "collect"))
    with open(os.path.join(main, "collect", "pool.jsonl"), "w") as f:
        f.writelines(json.dumps({"id": p, "responses": ["1", "2"]}) + "\n"
                     for p in ("p1", "p2", "p3"))
    with open(os.path.join(main, "collect", "progress.jsonl"), "w") as f:
        f.writelines(json.dumps({"id": f"q{i}", "successes": [], "tokens": 100}) + "\n"
                     for i in range(tried))


def test_the_report_on_synthetic_runs(tmp_path):
    """Two seeds of the five arms as metrics folders: the report's mechanism, compute and
    contrasts against the hand computation; its table and both figures are written."""
    cfg = study.rlep.parse_config(["--preset", "tiny", "--val_k", "4", "--val_every", "2"])
    out = str(tmp_path)
    kinds = {"val_acc/x": 0.1, "val_acc/y": 0.3}
    level = {"A1": 0.20, "A2": 0.22, "A3": 0.26, "A4": 0.25, "A5": 0.24}
    for seed, (a2, a3) in {1: (a2_seed1, a3_seed1), 2: (a2_seed2, a3_seed2)}.items():
        main = os.path.join(out, f"seed{seed}")
        bump = 0.01 * seed
        for arm, (_, suffix, part) in arms.arms.items():
            visits = {"A2": a2, "A3": a3, "A5": a3}.get(arm, a2)
            acc = {0: 0.1, 2: level[arm] - 0.02, 4: level[arm] + bump}
            write_part(main + suffix, part, visits, acc, kinds)
        write_collection(main, tried=5)
    results = offpolicy_report.report(out, [1, 2], cfg)
    mech = results["mechanism"]["A3 - A2"]
    assert mech["values"] == pytest.approx([25.0, -12.5]) and mech["mean"] == pytest.approx(6.25)
    assert mech["pairs"] == [2, 1] and mech["matched"] == [3, 1]
    spread = np.std([25.0, -12.5], ddof=1) / math.sqrt(2)
    assert mech["raw"] == pytest.approx((6.25 - 12.71 * spread, 6.25 + 12.71 * spread))
    assert mech["word"] == "uninformative"
    # A5 had A3's visits: the same numbers
    assert results["mechanism"]["A5 - A2"]["values"] == pytest.approx([25.0, -12.5])
    # compute, seed 1: A1 trains on A2's visits (10 over 4 steps x 8 = 80 responses); the
    # arms on the pool are charged those 80 up to the collection (step 4) and 5 prompts x K = 16
    costs = results["costs"][1]
    assert costs["A1"] == {"before": 0, "collection": 0, "own": 80, "total": 80,
                           "trained": 80, "tokens": 800.0}
    assert costs["A2"]["total"] == 80 + 80 + 80
    assert costs["A3"]["total"] == 80 + 80 + 80 and costs["A3"]["trained"] == 80 + 2 * 10
    assert costs["A3"]["tokens"] == 800 + 800 + 500
    # the contrasts: final A3 - A1 = 6 points in both seeds (sd 0): a difference
    final = [r for r in results["contrasts"] if r["contrast"] == "A3 - A1"
             and r["measure"] == "final"][0]
    assert final["values"] == pytest.approx([6.0, 6.0]) and final["word"] == "a difference (+)"
    assert len(results["contrasts"]) == 8
    table = open(tmp_path / "table.md").read()
    assert "Holm" in table and "a difference (+)" in table and "cannot show a compute" in table
    pytest.importorskip("matplotlib")
    assert os.path.getsize(tmp_path / "forest.png") > 0
    assert os.path.getsize(tmp_path / "curves.png") > 0


def test_a_run_in_another_regime_is_stale(tmp_path):
    cfg = study.rlep.parse_config(["--preset", "cpu-hard"])
    folder = tmp_path / "seed1"
    folder.mkdir()
    config = {k: getattr(cfg, k) for k in runner.regime_keys}
    (folder / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    assert runner.stale_reason(str(folder), "bfloat16", cfg) == ""
    assert runner.stale_reason(str(folder), "float32", cfg) == "not in float32"
    # the on-policy study's runs: one mini-batch of 8 prompts a step
    (folder / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16",
                                                    "mini_batch_prompts": 8}))
    assert runner.stale_reason(str(folder), "bfloat16", cfg) == \
        "another regime (mini_batch_prompts)"
    assert runner.stale_reason(str(tmp_path / "none"), "bfloat16", cfg) == ""


# --study dynamic (docs/study-plan-dynamic.md) ---------------------------------------------

def test_the_dynamic_study_runs_its_arms_in_order():
    settings = ["--preset", "cpu-hard"]
    cfg = study.rlep.parse_config(settings)
    runs = arms.dynamic_runs_of("out", 3, settings, family_seed=True)
    pool = os.path.join("out", "seed3", "collect", "pool.jsonl")
    assert [folder for folder, _ in runs] == ["out/seed3", "out/seed3-A5", "out/seed3-A7",
                                              "out/seed3-A8"]
    assert runs[2][1] == settings + ["--phase", "1", "--dynamic_sampling"]
    assert runs[3][1] == settings + ["--phase", "2", "--pool", pool, "--dynamic_sampling"]
    # A5 is the off-policy study's A5, flag for flag
    assert runs[1] == arms.runs_of("out", 3, settings, cfg)[3]
    assert len(arms.dynamic_runs_of("out", 9, settings, family_seed=False)) == 2


def test_dynamic_sampling_makes_a_run_stale_where_the_arm_asks_otherwise(tmp_path):
    cfg = study.rlep.parse_config(["--preset", "cpu-hard"])
    config = {**{k: getattr(cfg, k) for k in runner.regime_keys}, "dtype": "bfloat16"}
    rounds = getattr(cfg, "max_gen_rounds", None)

    def reason(saved, dynamic):
        (tmp_path / "config.json").write_text(json.dumps({**config, **saved}))
        return runner.stale_reason(str(tmp_path), "bfloat16", cfg, dynamic)
    # a run made before the flag had none: it serves an arm without it, not one with it
    assert reason({}, False) == "" and reason({}, None) == ""
    assert reason({}, True).startswith("another regime (dynamic_sampling")
    assert reason({"dynamic_sampling": True, "max_gen_rounds": rounds}, True) == ""
    assert reason({"dynamic_sampling": True, "max_gen_rounds": rounds}, False) == \
        "another regime (dynamic_sampling)"
    assert reason({"dynamic_sampling": True, "max_gen_rounds": 99}, True) == \
        "another regime (max_gen_rounds)"
    # the off-policy study does not look
    assert reason({"dynamic_sampling": True}, None) == ""


def test_a_stale_main_run_takes_the_runs_on_its_pool_not_a7(tmp_path):
    cfg = study.rlep.parse_config(["--preset", "cpu-hard"])
    config = {**{k: getattr(cfg, k) for k in runner.regime_keys}, "dtype": "bfloat16",
              "max_gen_rounds": getattr(cfg, "max_gen_rounds", None)}
    runs = arms.dynamic_runs_of(str(tmp_path), 1, [], family_seed=True)
    for folder, flags in runs:
        os.makedirs(folder)
        dynamic = "--dynamic_sampling" in flags
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump({**config, "dynamic_sampling": dynamic,
                       "dtype": "float32" if folder == runs[0][0] else "bfloat16"}, f)
    runner.set_aside_stale(runs, "bfloat16", cfg, dynamic=True)
    assert sorted(os.listdir(tmp_path)) == ["seed1-A5.bfloat16", "seed1-A7",
                                            "seed1-A8.bfloat16", "seed1.float32"]


def test_equal_compute_by_hand():
    # overlapping: a ends at 160, b at 80; x* = 80: a at its second point (x 80), b at its end
    a = (np.array([0, 80, 160]), np.array([0.1, 0.22, 0.27]))
    b = (np.array([0, 40, 80]), np.array([0.1, 0.20, 0.24]))
    assert compute.equal_compute(*a, *b) == {"x": 80, "diff": pytest.approx(22 - 24)}
    # between points: a's x 0 -> 96 at 0.10 -> 0.21, at x* = 40: 0.1 + 0.11 x 40 / 96
    a = (np.array([0, 96, 192]), np.array([0.1, 0.21, 0.25]))
    b = (np.array([0, 24, 40]), np.array([0.1, 0.18, 0.20]))
    assert compute.equal_compute(*a, *b)["diff"] == \
        pytest.approx(100 * (0.1 + 0.11 * 40 / 96 - 0.2))
    assert compute.equal_compute(*b, *a)["diff"] == \
        pytest.approx(100 * (0.2 - 0.1 - 0.11 * 40 / 96))
    # apart: a starts (4,480) after b ends (1,150)
    a = (np.array([4480, 4544, 4608]), np.array([0.1, 0.2, 0.3]))
    b = (np.array([0, 600, 1150]), np.array([0.1, 0.15, 0.2]))
    assert compute.equal_compute(*a, *b) is None and compute.equal_compute(*b, *a) is None
    xs = {(1, "A3"): a[0], (1, "A7"): b[0]}
    acc = {(1, "A3"): a[1], (1, "A7"): b[1]}
    row, = compute.equal_compute_table(xs, acc, [("A3", "A7")], [1])
    assert row["apart"] == "A3's curve starts at 4,480 responses, after A7's ends at 1,150"
    row, = compute.equal_compute_table(xs, acc, [("A7", "A3")], [1])
    assert row["apart"].startswith("A3's curve starts at 4,480")


def test_compute_charges_with_and_without_gen_responses():
    old = [{"step": 0}, {"step": 1, "visits": [visit("p1", 0)] * 3, "response_len": 10.0},
           {"step": 2, "visits": [visit("p1", 0, 2)] * 2, "response_len": 5.0}]
    new = [{"step": 0}, {**old[1], "gen_responses": 40, "gen_rounds": 2, "gen_prompts": 5,
                         "kept_groups": 3, "gen_capped": False},
           {**old[2], "gen_responses": 64, "gen_rounds": 3, "gen_prompts": 8,
            "kept_groups": 2, "gen_capped": True}]
    # without: n = 8 a visit: 24 and 16
    assert compute.part_cost(old, 8, 2) == {"responses": 40, "tokens": 24 * 10 + 16 * 5,
                                            "trained": 24 + 16 + 2 * 2}
    assert list(compute.compute_axis(old, [0, 1, 2], 8, 100)) == [100, 124, 140]
    assert compute.metering(old, 8, 100) == {"responses": 140, "rounds": 2, "prompts": 5,
                                             "kept": 5, "capped": 0}
    # with: what was generated, not what was kept; trained is still the kept visits'
    assert compute.part_cost(new, 8, 2) == {"responses": 104, "tokens": 40 * 10 + 64 * 5,
                                            "trained": 24 + 16 + 2 * 2}
    assert list(compute.compute_axis(new, [0, 2], 8, 0)) == [0, 104]
    assert compute.metering(new, 8, 0) == {"responses": 104, "rounds": 5, "prompts": 13,
                                           "kept": 5, "capped": 1}


def test_the_dynamic_family_is_holm_over_six():
    rng = np.random.default_rng(1)
    acc = {arm: rng.normal(0.2, 0.02, (8, 4)) for arm in arms.family_arms}
    acc["A3"] += 0.03
    rows = intervals.contrasts_table(acc, arms.dynamic_family)
    assert [(r["contrast"], r["measure"]) for r in rows] == [
        (c, m) for c in ("A3 - A7", "A8 - A3", "A7 - A1") for m in ("peak", "final")]
    # Holm by hand: sorted p, adjusted (6 - i) p_(i), running max, capped at 1
    p = sorted(r["p"] for r in rows)
    adjusted = np.minimum(1, np.maximum.accumulate([(6 - i) * q for i, q in enumerate(p)]))
    assert sorted(r["p_holm"] for r in rows) == pytest.approx(list(adjusted))
    first = min(rows, key=lambda r: r["p"])
    assert first["rank"] == 1
    if first["rejected"]:
        assert first["level"] == pytest.approx(0.05 / 6)


def test_the_seed1_check():
    rows = [{"step": s, "visits": v, "rescued": sum(x["rescued"] for x in v)}
            for s, v in a3_seed1.items()]
    # a3_seed1: rescued (1, p1), (1, p3), (2, p4), (2, p5), (4, p5): 5; steps 1-3: 4 of the 8
    # visits to pooled prompts
    assert mechanism.rescues(rows) == (5, 0.5)
    assert dynamic_report.seed1_check(38, {"A3": (18, 0.58), "A5": (15, 0.5)}) == \
        "reproduces to the digit"
    assert dynamic_report.seed1_check(38, {"A3": (18, 0.5842), "A5": (15, 0.4951)}) == \
        "reproduces to the digit"
    assert dynamic_report.seed1_check(38, {"A3": (18, 0.58), "A5": (14, 0.5)}) == \
        "differs: A5 rescued 14, published 15"
    assert dynamic_report.seed1_check(3, {"A3": mechanism.rescues(rows), "A5": (15, 0.47)}) == \
        "differs: pool 3 prompts, published 38; A3 rescued 5, published 18; A3's share 50 %, " \
        "published 58 %; A5's share 47 %, published 50 %"


def test_a_runs_start_is_the_logged_one_else_a_files_mtime(tmp_path):
    folder = tmp_path / "seed1"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    os.utime(folder / "config.json", (1e9, 1e9))
    assert runner.run_started(str(folder)) == ("2001-09-09T01:46:40Z", "file mtime (last write)")
    (tmp_path / "seed1.log").write_text("rlep: preset\n" + runner.started_mark
                                        + "2026-12-01T10:00:00Z\n" + runner.started_mark
                                        + "2026-12-02T10:00:00Z\n")
    assert runner.run_started(str(folder)) == ("2026-12-01T10:00:00Z", "logged")
    assert runner.run_machine(str(folder)) == ""  # a start line from before the machine
    (tmp_path / "seed1.log").write_text(runner.started_mark + "2026-12-01T10:00:00Z on Intel(R) "
                                        "Xeon(R) CPU @ 2.10GHz (bf16 emulated)\n")
    assert runner.run_started(str(folder)) == ("2026-12-01T10:00:00Z", "logged")
    assert runner.run_machine(str(folder)) == "Intel(R) Xeon(R) CPU @ 2.10GHz (bf16 emulated)"
    assert runner.run_started(str(tmp_path / "none"))[1] == "not started"


def test_the_machine_is_the_first_cpus_with_its_bf16(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"

    def machine(flags):
        cpuinfo.write_text("".join(f"processor\t: {i}\nmodel name\t: CPU {i}\nflags\t\t: "
                                   f"{flags if i == 0 else 'fpu amx_bf16'}\n\n"
                                   for i in range(2)))
        return runner.machine(str(cpuinfo))
    assert machine("fpu avx512f amx_bf16 amx_tile avx512_bf16") == "CPU 0 (bf16 native: amx)"
    assert machine("fpu avx512f avx512_bf16") == "CPU 0 (bf16 native: avx512_bf16)"
    assert machine("fpu avx512f avx2") == "CPU 0 (bf16 emulated)"
    monkeypatch.setattr(runner.platform, "processor", lambda: "")
    assert runner.machine(str(tmp_path / "none")) == "unknown CPU (bf16 emulated)"
    monkeypatch.setattr(runner.platform, "processor", lambda: "x86_64")
    assert runner.machine(str(tmp_path / "none")) == "x86_64 (bf16 emulated)"


def synthetic_dynamic(out):
    """--study dynamic's runs by hand: seeds 1 and 2 with A1, A3, A5, A7, A8; seed 3 with A1, A3,
    A5 (metrics, config.json with the dtype only, the collection)."""
    kinds = {"val_acc/x": 0.1, "val_acc/y": 0.3}
    level = {1: {"A1": (.20, .24), "A3": (.26, .30), "A5": (.25, .28), "A7": (.22, .27),
                 "A8": (.29, .33)},
             2: {"A1": (.18, .20), "A3": (.24, .31), "A5": (.22, .27), "A7": (.21, .25),
                 "A8": (.27, .35)},
             3: {"A1": (.19, .22), "A3": (.25, .29), "A5": (.24, .27)}}
    # A7: seed 1 generates 48, 32, 64, 16 responses (8 rounds, 20 prompts, step 3 capped);
    # seed 2 48 a step (2 rounds and 6 prompts a step); A8: 40 a step
    a7 = {1: {1: (48, 2, 6, False), 2: (32, 2, 4, False), 3: (64, 3, 8, True),
              4: (16, 1, 2, False)},
          2: {s: (48, 2, 6, False) for s in range(1, 5)}}
    visits = {1: (a2_seed1, a3_seed1), 2: (a2_seed2, a3_seed2), 3: (a2_seed2, a3_seed2)}
    for seed, arm_levels in level.items():
        main = os.path.join(out, f"seed{seed}")
        a2, a3 = visits[seed]
        for arm, (at2, at4) in arm_levels.items():
            _, suffix, part = arms.dynamic_arms[arm]
            extra = {}
            if arm == "A7":
                extra = {s: {"gen_responses": g, "gen_rounds": r, "gen_prompts": p,
                             "kept_groups": len(a2[s]), "gen_capped": c}
                         for s, (g, r, p, c) in a7[seed].items()}
            if arm == "A8":
                extra = {s: {"gen_responses": 40, "gen_rounds": 1, "gen_prompts": 5,
                             "kept_groups": len(a3[s]), "gen_capped": False} for s in a3}
            write_part(main + suffix, part, a3 if arm in ("A3", "A5", "A8") else a2,
                       {0: 0.1, 2: at2, 4: at4}, kinds, extra)
        write_collection(main, tried=10)


def test_the_dynamic_report_on_synthetic_runs(tmp_path):
    """Seeds 1 and 2 with A1, A3, A5, A7, A8; seed 3 with A1, A3, A5 only: the family over 1
    and 2, A3 - A5 over all three; curves in x, metering and the seed-1 check by hand."""
    cfg = study.rlep.parse_config(["--preset", "tiny", "--val_k", "4", "--val_every", "2"])
    out = str(tmp_path)
    synthetic_dynamic(out)
    (tmp_path / "seed1.log").write_text(runner.started_mark + "2020-01-05T09:00:00Z on CPU A "
                                        "(bf16 native: amx)\n")
    (tmp_path / "seed1-A5.log").write_text(runner.started_mark + "2020-01-06T09:00:00Z on CPU B "
                                           "(bf16 emulated)\n")
    (tmp_path / "seed2-A5.log").write_text(runner.started_mark + "2020-01-06T10:00:00Z on CPU B "
                                           "(bf16 emulated)\n")
    results = dynamic_report.report_dynamic(out, [1, 2, 3], [1, 2, 3], cfg)
    assert results["family_seeds"] == [1, 2] and results["a3_a5_seeds"] == [1, 2, 3]
    # the family: A3 - A7's final 30 - 27 = 3 and 31 - 25 = 6; A8 - A3's peak 3 and 4
    rows = {(r["contrast"], r["measure"]): r for r in results["contrasts"]}
    assert len(rows) == 6
    assert rows["A3 - A7", "final"]["values"] == pytest.approx([3.0, 6.0])
    assert rows["A8 - A3", "peak"]["values"] == pytest.approx([3.0, 4.0])
    assert rows["A7 - A1", "final"]["values"] == pytest.approx([3.0, 5.0])
    # A3 - A5 over three seeds, Holm over its own two
    a3_a5 = results["a3_a5"]
    assert [r["measure"] for r in a3_a5] == ["peak", "final"]
    assert a3_a5[1]["values"] == pytest.approx([2.0, 4.0, 2.0])
    assert a3_a5[0]["p_holm"] == pytest.approx(min(1, 2 * min(r["p"] for r in a3_a5)))
    # x: A1 seed 1 generates 24, 16, 24, 16 (its visits x 8); the arms on the pool are charged
    # that (80, the collection's checkpoint is step 4) and 10 prompts x K = 16
    assert results["x"]["A1"][0] == [0, 40, 80]
    assert results["x"]["A7"] == [[0, 80, 160], [0, 96, 192]]
    assert results["x"]["A3"][0] == [240, 280, 320]
    # seed 2: A1 16, 8, 8, 8; charge 40 + 160
    assert results["x"]["A3"][1] == [200, 224, 240] and results["x"]["A8"][1] == [200, 280, 360]
    eq = {r["contrast"]: r for r in results["equal_compute"]}
    assert eq["A3 - A7"]["apart"] == \
        "A3's curve starts at 200-240 responses, after A7's ends at 160-192"
    # A7 - A1: seed 1 at x* 80: 22 - 24; seed 2 at x* 40: A7 0.1 + 0.11 x 40 / 96, A1 20
    seed2 = 100 * (0.1 + 0.11 * 40 / 96 - 0.20)
    assert eq["A7 - A1"]["values"] == pytest.approx([-2.0, seed2])
    half = 12.71 * np.std([-2.0, seed2], ddof=1) / math.sqrt(2)
    assert eq["A7 - A1"]["raw"] == pytest.approx([(-2 + seed2) / 2 - half, (-2 + seed2) / 2 + half])
    # A8 - A3: seed 1 at x* 320: A8's 29 - A3's 30; seed 2 at 240: 0.1 + 0.17 / 2 = 18.5 - 31
    assert eq["A8 - A3"]["values"] == pytest.approx([-1.0, -12.5])
    assert eq["A8 - A3"]["x"] == [320, 240]
    # the metering: A7 generated 160 and 192, 8 rounds each, 20 and 24 prompts, 1 and 0 capped
    meter = results["metering"]["A7"]
    assert [m["responses"] for m in meter] == [160, 192] and [m["capped"] for m in meter] == [1, 0]
    assert [m["prompts"] for m in meter] == [20, 24] and [m["kept"] for m in meter] == [10, 5]
    assert results["metering"]["A8"][0]["responses"] == 240 + 160
    # seed 1 against the published numbers, cpu-hard's: this pool has 3 prompts, A3 and A5
    # rescued 5, 4 of the 8 visits to pooled prompts in steps 1-3
    assert results["seed1"]["check"].startswith("not checked: the published numbers are")
    assert "| here | 3 | 5 (50 %) | 5 (50 %) |" in open(tmp_path / "table.md").read()
    # pools and rescues: seed 1 rescued 5 of its visits (4 of the 8 in steps 1-3), seed 2 and 3
    # 2 (2 of 4); seed 3 has no A8
    assert ["| 1 | 3 | 5 (50 %) | 5 (50 %) | 5 (50 %) |", "| 2 | 3 | 2 (50 %) | 2 (50 %) | "
            "2 (50 %) |", "| 3 | 3 | 2 (50 %) | 2 (50 %) | - |"] == \
        [line for line in open(tmp_path / "table.md").read().splitlines()
         if line.startswith(("| 1 | 3 |", "| 2 | 3 |", "| 3 | 3 |"))]
    as_cpu_hard = dynamic_report.report_dynamic(out, [1, 2, 3], [1, 2, 3],
                                                dataclasses.replace(cfg, preset="cpu-hard"))
    assert as_cpu_hard["seed1"]["check"].startswith("differs: pool 3 prompts, published 38; "
                                                    "A3 rescued 5, published 18")
    results = dynamic_report.report_dynamic(out, [1, 2, 3], [1, 2, 3], cfg)
    assert results["starts"]["A1"] == {"folder": "seed1", "time": "2020-01-05T09:00:00Z",
                                       "from": "logged"}
    assert results["starts"]["A7"]["from"] == "file mtime (last write)"
    # the machines: seed 1's main run on A, its A5 on B; seed 2's A5 on B, the rest not logged
    assert results["machines"] == {
        "seedS": {"CPU A (bf16 native: amx)": 1, "not logged": 2},
        "seedS-A5": {"CPU B (bf16 emulated)": 2, "not logged": 1},
        "seedS-A7": {"not logged": 2}, "seedS-A8": {"not logged": 2}}
    assert results["seeds_on_several_machines"] == [1]
    table = open(tmp_path / "table.md").read()
    assert "| seedS | A1, A3 | 3 | CPU A (bf16 native: amx): 1; not logged: 2 |" in table
    assert "| seedS-A7 | A7 | 2 | not logged: 2 |" in table
    assert "Seeds whose runs ran on more than one machine: 1 of the 2 with a logged machine " \
        "(seeds 1)." in table
    for heading in ("The family", "A3 - A5 over the 3 seeds", "Seed 1: not checked",
                    "At equal generated responses, raw, uncorrected", "Metering",
                    "The plan's commits against", "by kind", "no overlap: A3's curve starts"):
        assert heading in table, heading
    assert "| A7 | 176.0 (160-192) | 8.0 (8) | 22.0 (20-24) | 7.5 (5-10) | 0.5 (0-1) |" in table
    # A1's curve over the family's 2 seeds and over all 3
    assert "| A1: baseline, all prompts | 2 (family) | 10.0 (0.0) | 19.0 (1.4) |" in table
    assert "| A1: baseline, all prompts | 3 (all) |" in table
    pytest.importorskip("matplotlib")
    for figure in ("forest.png", "curves.png", "compute.png"):
        assert os.path.getsize(tmp_path / figure) > 0


def test_a_run_logs_its_start_before_rlep_writes(tmp_path, monkeypatch):
    class Done:
        returncode = 0
    commands = []
    monkeypatch.setattr(runner.subprocess, "run", lambda command, **kw: commands.append(command)
                        or Done())
    folder = str(tmp_path / "seed1-A7")
    runner.run(folder, ["--phase", "1", "--dynamic_sampling"], str(tmp_path / "seed1"))
    first = open(folder + ".log").readline()
    assert first.startswith(runner.started_mark) and commands[0][-2:] == ["1", "--dynamic_sampling"]
    assert first.endswith(f"Z on {runner.machine()}\n") and "(bf16 " in first
    assert runner.run_machine(folder) == runner.machine()
    when, how = runner.run_started(folder)
    assert how == "logged" and abs(runner.time.mktime(runner.time.strptime(
        when, "%Y-%m-%dT%H:%M:%SZ")) - runner.time.mktime(runner.time.gmtime())) < 60


def test_the_plan_came_first_only_where_a_logged_start_says_so():
    plan = "2026-12-03T10:00:00Z"
    assert dynamic_report.came_after("2026-12-03T11:00:00Z", "logged", plan) == "yes"
    assert dynamic_report.came_after("2026-12-03T09:00:00Z", "logged", plan) == "NO"
    # a last write after the commit does not show that the run started after it
    assert dynamic_report.came_after("2026-12-03T11:00:00Z", "file mtime (last write)", plan) == \
        "not shown (a last write)"
    assert dynamic_report.came_after("2026-12-03T09:00:00Z", "file mtime (last write)",
                                     plan) == "NO"
    assert dynamic_report.came_after("2026-12-03T11:00:00Z", "logged", "") == "-"
    # the off-policy plan: committed in 2b04552, amended in 7c0a0e0 (docs/studies.md)
    first, newest = dynamic_report.plan_times("docs/study-plan.md")
    assert first and newest and first < newest
    assert dynamic_report.plan_times("docs/no-such-plan.md") == ("", "")


def test_a_finished_seeds_checkpoints_go_not_seed_10s(tmp_path):
    for folder in ("seed1", "seed1-A7", "seed10", "seed10-A5"):
        os.makedirs(tmp_path / folder / "phase1" / "step_000002")
        (tmp_path / folder / "phase1" / "metrics.jsonl").write_text("")
    runner.drop_checkpoints(str(tmp_path), 1)
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.glob("*/phase1/*"))
    assert left == ["seed1-A7/phase1/metrics.jsonl", "seed1/phase1/metrics.jsonl",
                    "seed10-A5/phase1/metrics.jsonl", "seed10-A5/phase1/step_000002",
                    "seed10/phase1/metrics.jsonl", "seed10/phase1/step_000002"]


def test_a_finished_runs_checkpoints_go_but_main_phase_one_while_a6_needs_it(tmp_path):
    runs = arms.runs_of(str(tmp_path), 1, [], study.rlep.parse_config(tiny), with_a6=True)
    main, a6 = runs[0][0], runs[-1][0]
    for folder, part in ((main, "phase1"), (main, "phase2"), (a6, "phase2")):
        os.makedirs(os.path.join(folder, part, "step_000002"))
    os.symlink(os.path.join(main, "phase1"), os.path.join(a6, "phase1"))
    runner.drop_run_checkpoints(main, runs)
    steps = lambda: sorted(os.path.relpath(p, tmp_path)  # noqa
                           for p in glob.glob(str(tmp_path / "*" / "phase*" / "step_*")))
    # A6 unfinished: it collects from the main run's phase one, whose step stays
    assert steps() == ["seed1-A6/phase1/step_000002", "seed1-A6/phase2/step_000002",
                       "seed1/phase1/step_000002"]
    (tmp_path / "seed1-A6" / "timings.json").write_text("{}")
    runner.drop_run_checkpoints(a6, runs)  # not through its link
    assert steps() == ["seed1-A6/phase1/step_000002", "seed1/phase1/step_000002"]
    runner.drop_run_checkpoints(main, runs)
    assert steps() == []


# --archive: each finished run kept small in the repository, read back in a later sitting ------

tiny = ["--preset", "tiny", "--val_k", "4", "--val_every", "2"]


def finish_dynamic(out, dtype="float32"):
    """synthetic_dynamic's runs as a finished study leaves them: the study's config.json, a
    timings.json, a log with two starts (the first on CPU A, seed 2's A7 on CPU B), samples and
    a checkpoint in each part, answer texts in the pool and the progress."""
    cfg = study.rlep.parse_config(tiny + ["--dtype", "float32"])
    config = {**{k: getattr(cfg, k) for k in runner.regime_keys}, "dtype": dtype,
              "max_gen_rounds": getattr(cfg, "max_gen_rounds", None)}
    for seed in (1, 2, 3):
        for folder, flags in arms.dynamic_runs_of(out, seed, [], family_seed=seed < 3):
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump({**config, "dynamic_sampling": "--dynamic_sampling" in flags}, f)
            with open(os.path.join(folder, "timings.json"), "w") as f:
                json.dump({"total_s": 10.0 + seed, "parts_s": {}, "processes": 1}, f)
            cpu = "CPU B (bf16 native: amx)" if folder.endswith("seed2-A7") else \
                "CPU A (bf16 emulated)"
            with open(folder + ".log", "w") as f:
                f.write(f"{runner.started_mark}2026-12-0{seed}T10:00:00Z on {cpu}\nrlep: step 1\n"
                        f"{runner.started_mark}2026-12-0{seed}T11:00:00Z on {cpu}\n")
            for part in glob.glob(os.path.join(folder, "phase*")):
                os.makedirs(os.path.join(part, "step_000004"))
                with open(os.path.join(part, "step_000004", "model.bin"), "wb") as f:
                    f.write(b"x" * 1000)
                with open(os.path.join(part, "samples.jsonl"), "w") as f:
                    f.write(json.dumps({"step": 1, "response": "2 + 2 = 4"}) + "\n")
        collect = os.path.join(out, f"seed{seed}", "collect")
        with open(os.path.join(collect, "progress.jsonl"), "w") as f:
            f.writelines(json.dumps({"id": f"q{i}", "successes": ["4", "four"], "tokens": 100})
                         + "\n" for i in range(10))


def finished_study(folder):
    """synthetic_dynamic's runs, finished (finish_dynamic), in folder; its path."""
    synthetic_dynamic(str(folder))
    finish_dynamic(str(folder))
    return str(folder)


def tree(folder):
    """{path: bytes} of every file under folder."""
    return {os.path.relpath(os.path.join(root, f), folder):
            open(os.path.join(root, f), "rb").read()
            for root, _, files in os.walk(folder) for f in files}


def archive_all(out, archive):
    for seed in (1, 2, 3):
        archiving.archive_runs(out, archive, seed, arms.dynamic_runs_of(out, seed, [], seed < 3))


def archived_study(tmp_path):
    """A finished synthetic dynamic study archived: (the archive, an empty out_dir)."""
    archive = tmp_path / "archive"
    archive_all(finished_study(tmp_path / "full"), str(archive))
    return archive, tmp_path / "out"


def run_main(monkeypatch, out, archive, *more, dtype="float32", on_run=None):
    """study_replay.py --study dynamic on tiny, seeds 1-3, the family 1 and 2, with `run`, the
    model and the dtype's measure patched; the folders `run` was called for. on_run(folder):
    what the patched run does (else nothing: the run stays as it is)."""
    calls = []

    def run(folder, flags, main):
        calls.append(folder)
        if on_run:
            on_run(folder)
    monkeypatch.setattr(runner, "run", run)
    monkeypatch.setattr(study.hub, "model_folder", lambda *a, **k: "model")
    monkeypatch.setattr(study.fsdp, "resolve_dtype", lambda *a, **k: types.SimpleNamespace(
        dtype=dtype, why="measured (a test)", gflops={}))
    monkeypatch.setattr(sys, "argv", ["study_replay.py", "--study", "dynamic", *tiny,
                                      "--seeds", "1", "2", "3", "--family_seeds", "1", "2",
                                      "--out_dir", str(out), "--archive", str(archive), *more])
    study.main()
    return calls


def copied_from(full):
    """on_run for run_main: the run done, as full's finished run of the same name."""
    def done(folder):
        name = os.path.basename(folder)
        shutil.copytree(os.path.join(full, name), folder)
        shutil.copy(os.path.join(full, name + ".log"), folder + ".log")
    return done


def document(archive, name):
    """An archived run's document, archive/NAME.json."""
    return json.load(open(os.path.join(archive, f"{name}.json")))


def mark(folder):
    """An archived run's mark: its document (FOLDER.json) less its files and log."""
    held = json.load(open(f"{folder}.json"))
    return {k: v for k, v in held.items() if k not in ("files", "log")}


def test_an_archived_study_holds_the_reports_files_only_and_gives_its_report(tmp_path, capsys):
    cfg = study.rlep.parse_config(tiny)
    full = finished_study(tmp_path / "full")
    archive, again = (str(tmp_path / name) for name in ("archive", "again"))
    archive_all(full, archive)
    printed = capsys.readouterr().out
    assert "seed1 archived in" in printed and "seed1-A8 archived in" in printed
    assert f"{archive}/seed1.json: its pool reduced" in printed
    run_files = ["archived.json", "config.json", "timings.json"]
    expected, names = [], []
    for seed in (1, 2, 3):
        main = f"seed{seed}"
        names += [main] + [f"{main}-{arm}" for arm in ("A5", "A7", "A8")[:3 if seed < 3 else 1]]
        expected += [f"{main}.log", f"{main}/collect/pool.jsonl", f"{main}/collect/progress.jsonl",
                     f"{main}/phase1/metrics.jsonl", f"{main}/phase2/metrics.jsonl",
                     *(f"{main}/{f}" for f in run_files)]
        for arm, part in (("A5", "phase2"), ("A7", "phase1"), ("A8", "phase2"))[:3 if seed < 3
                                                                                 else 1]:
            expected += [f"{main}-{arm}.log", f"{main}-{arm}/{part}/metrics.jsonl",
                         *(f"{main}-{arm}/{f}" for f in run_files)]
    # one document a run; read back as run folders, the report's files only
    held = tree(archive)
    assert sorted(held) == sorted(f"{name}.json" for name in names)
    assert archiving.restore_archived(again, archive, [1, 2, 3]) == names
    restored = tree(again)
    assert sorted(restored) == sorted(expected)
    rows = lambda path: [json.loads(line) for line in restored[path].decode().splitlines()]  # noqa
    assert rows("seed1/collect/pool.jsonl") == [{"id": p, "answers": 2} for p in ("p1", "p2", "p3")]
    assert rows("seed1/collect/progress.jsonl") == [{"id": f"q{i}", "tokens": 100}
                                                    for i in range(10)]
    # every run of each seed archived: the pools reduced, and marked so
    assert [mark(os.path.join(archive, f"seed{s}"))["pool"] for s in (1, 2, 3)] == ["reduced"] * 3
    assert "pool" not in mark(os.path.join(archive, "seed1-A5"))
    assert sorted(document(archive, "seed1-A5")["files"]) == [
        "config.json", "phase2/metrics.jsonl", "timings.json"]
    assert restored["seed2-A7.log"] == \
        f"{runner.started_mark}2026-12-02T10:00:00Z on CPU B (bf16 native: amx)\n".encode()
    assert restored["seed1/phase1/metrics.jsonl"] == \
        open(os.path.join(full, "seed1", "phase1", "metrics.jsonl"), "rb").read()
    assert sum(map(len, held.values())) < 40_000
    # the report from the archive alone, as the run folders give it
    assert tree(archive) == held and all(runner.archived(os.path.join(again, n)) for n in names)
    reports = [dynamic_report.report_dynamic(out, [1, 2, 3], [1, 2], cfg) for out in (full, again)]
    tables = [open(os.path.join(out, "table.md")).read().split("\n") for out in (full, again)]
    assert tables[0][1:] == tables[1][1:] and "| A7 | seed1-A7 | 2026-12-01T10:00:00Z" \
        in "\n".join(tables[1])
    assert "| seedS-A7 | A7 | 2 | CPU A (bf16 emulated): 1; CPU B (bf16 native: amx): 1 |" \
        in tables[1] and reports[1]["seeds_on_several_machines"] == [2]
    saved = [json.load(open(os.path.join(out, "results.json"))) for out in (full, again)]
    for results in reports + saved:
        results.pop("provenance")
    assert json.dumps(reports[0], default=float) == json.dumps(reports[1], default=float)
    assert saved[0] == saved[1]
    pytest.importorskip("matplotlib")
    for figure in ("forest.png", "curves.png", "compute.png"):
        assert open(os.path.join(full, figure), "rb").read() == \
            open(os.path.join(again, figure), "rb").read()


def test_a_finished_run_is_archived_its_pool_whole_while_an_arm_on_it_is_not(tmp_path, capsys):
    full, archive = finished_study(tmp_path / "full"), str(tmp_path / "archive")
    runs = arms.dynamic_runs_of(full, 1, [], True)
    for arm in ("A7", "A8"):  # not finished yet
        os.rename(os.path.join(full, f"seed1-{arm}", "timings.json"), tmp_path / arm)
    archiving.archive_runs(full, archive, 1, runs)
    assert sorted(os.listdir(archive)) == ["seed1-A5.json", "seed1.json"]
    assert "its pool in full for seed1-A5, seed1-A8" in capsys.readouterr().out
    # the pool row for row, answer texts and all, for A8 in a later sitting; the progress not
    pool = open(os.path.join(full, "seed1", "collect", "pool.jsonl"), "rb").read()
    assert b'"responses": ["1", "2"]' in pool
    assert document(archive, "seed1")["files"]["collect/pool.jsonl"] == \
        [json.loads(line) for line in pool.splitlines()]
    assert b"successes" not in open(os.path.join(archive, "seed1.json"), "rb").read()
    assert mark(os.path.join(archive, "seed1"))["pool"] == "full"
    # A7 finishes: archived on its own; A8, on the pool, is still to come
    os.rename(tmp_path / "A7", os.path.join(full, "seed1-A7", "timings.json"))
    archiving.archive_runs(full, archive, 1, runs)
    assert os.path.isfile(os.path.join(archive, "seed1-A7.json"))
    assert mark(os.path.join(archive, "seed1"))["pool"] == "full"
    before = tree(archive)
    # A8 finishes: archived, and the pool reduced; nothing else in the archive changes
    os.rename(tmp_path / "A8", os.path.join(full, "seed1-A8", "timings.json"))
    capsys.readouterr()
    archiving.archive_runs(full, archive, 1, runs)
    assert "seed1.json: its pool reduced" in capsys.readouterr().out
    after = tree(archive)
    assert sorted(set(after) - set(before)) == ["seed1-A8.json"]
    assert sorted(p for p in before if after[p] != before[p]) == ["seed1.json"]
    was, now = (json.loads(files["seed1.json"]) for files in (before, after))
    reduced = [{"id": p, "answers": 2} for p in ("p1", "p2", "p3")]
    assert now == {**was, "pool": "reduced",
                   "files": {**was["files"], "collect/pool.jsonl": reduced}}
    # as archiving the finished seed at once makes it; and a further call changes nothing
    archiving.archive_runs(full, str(tmp_path / "at_once"), 1, runs)
    assert tree(tmp_path / "at_once") == after
    assert archiving.archive_runs(full, archive, 1, runs) == 0 and tree(archive) == after


def test_a_stopped_pool_reduction_is_finished_from_what_the_archive_holds(tmp_path, monkeypatch):
    full, archive = finished_study(tmp_path / "full"), str(tmp_path / "archive")
    runs = arms.dynamic_runs_of(full, 1, [], True)
    archiving.archive_runs(full, str(tmp_path / "at_once"), 1, runs)
    os.rename(os.path.join(full, "seed1-A8", "timings.json"), tmp_path / "A8")
    archiving.archive_runs(full, archive, 1, runs)
    os.rename(tmp_path / "A8", os.path.join(full, "seed1-A8", "timings.json"))
    replace = os.replace

    def failing(source, target):
        if target == os.path.join(archive, "seed1.json"):
            raise OSError("stopped")
        replace(source, target)
    monkeypatch.setattr(archiving.os, "replace", failing)
    with pytest.raises(OSError, match="stopped"):
        archiving.archive_runs(full, archive, 1, runs)
    # stopped at the document's one replacement: the pool still full, its mark too
    held = os.path.join(archive, "seed1")
    assert mark(held)["pool"] == "full"
    assert b"responses" in open(held + ".json", "rb").read()
    whole = open(held + ".json", "rb").read()
    monkeypatch.setattr(archiving.os, "replace", replace)
    # the next call reduces it: as at once
    archiving.archive_runs(full, archive, 1, runs)
    assert tree(archive) == tree(tmp_path / "at_once")
    # the reduced pool comes from the archive's full pool, not from the run folder's
    archiving.replace_file(held + ".json", whole)
    with open(os.path.join(full, "seed1", "collect", "pool.jsonl"), "a") as f:
        f.write(json.dumps({"id": "p4", "responses": ["7"]}) + "\n")
    assert archiving.reduce_pool(archive, runs[0][0], runs)
    assert tree(archive) == tree(tmp_path / "at_once")
    texts_gone = json.loads(whole)
    texts_gone["files"]["collect/pool.jsonl"] = [{"id": "p1", "texts": 2}]
    archiving.replace_file(held + ".json", json.dumps(texts_gone).encode())
    with pytest.raises(SystemExit, match="marked full but lacks answer texts"):
        archiving.reduce_pool(archive, runs[0][0], runs)


def test_the_runner_archives_each_finished_run_at_the_start_and_after_it(tmp_path, monkeypatch):
    out, archive = finished_study(tmp_path / "out"), tmp_path / "archive"
    os.remove(os.path.join(out, "seed1-A8", "timings.json"))
    seen = []
    calls = run_main(monkeypatch, out, archive, on_run=lambda f: seen.append(
        (os.listdir(archive), glob.glob(os.path.join(out, "seed*", "phase*", "step_*")))))
    # the patched run leaves A8 unfinished: every run archived but it, seeds 2 and 3's before it;
    # by then, every finished run's checkpoints are gone
    assert calls == [os.path.join(out, "seed1-A8")] and "seed3-A5.json" in seen[0][0]
    assert seen[0][1] == [os.path.join(out, "seed1-A8", "phase2", "step_000004")]
    assert sorted(os.listdir(archive)) == sorted(f"{name}.json" for name in [
        "seed1", "seed1-A5", "seed1-A7", "seed2", "seed2-A5", "seed2-A7", "seed2-A8", "seed3",
        "seed3-A5"])
    assert [mark(archive / f"seed{s}")["pool"] for s in (1, 2, 3)] == ["full", "reduced",
                                                                       "reduced"]
    assert archiving.archive_runs(out, str(archive), 1,
                              arms.dynamic_runs_of(out, 1, [], True)) == 0
    # checkpoints dropped, A8's too (the seed's end)
    assert not glob.glob(os.path.join(out, "*", "phase*", "step_*"))


def test_a_sitting_restores_the_archived_runs_and_runs_only_the_others(tmp_path, monkeypatch):
    full = finished_study(tmp_path / "full")
    first, archive = tmp_path / "first", tmp_path / "archive"
    shutil.copytree(full, first)
    for arm in ("A7", "A8"):  # seed 1's A7 and A8 cut short in the first sitting
        os.remove(first / f"seed1-{arm}" / "timings.json")
    for _ in range(2):  # the first sitting, and the same out_dir started again
        assert run_main(monkeypatch, first, archive) == [str(first / "seed1-A7"),
                                                         str(first / "seed1-A8")]
        assert not {"seed1-A7.json", "seed1-A8.json"} & set(os.listdir(archive))
    held = tree(archive)
    # a second sitting, from a fresh clone: seed 1's A7 and A8 run, the archived runs never
    second = tmp_path / "second"
    pools = []

    def done(folder):
        pools.append(open(second / "seed1" / "collect" / "pool.jsonl", "rb").read())
        copied_from(full)(folder)
    calls = run_main(monkeypatch, second, archive, on_run=done)
    assert calls == [str(second / "seed1-A7"), str(second / "seed1-A8")]
    # A8 read the archived main run's pool, its answer texts and all
    assert pools[1] == open(os.path.join(full, "seed1", "collect", "pool.jsonl"), "rb").read()
    assert runner.archived(str(second / "seed1")) and runner.archived(str(second / "seed2-A8"))
    assert not runner.archived(str(second / "seed1-A8"))
    assert not glob.glob(str(second / "*" / "phase*" / "step_*"))
    # now archived, seed 1's pool reduced; the runs before unchanged
    after = tree(archive)
    assert {p: after[p] for p in held if p != "seed1.json"} == \
        {p: v for p, v in held.items() if p != "seed1.json"}
    archive_all(full, str(tmp_path / "at_once"))
    assert after == tree(tmp_path / "at_once")
    # a third sitting runs nothing
    assert run_main(monkeypatch, tmp_path / "third", archive) == []
    assert tree(archive) == after
    # a run of out_dir the archive holds otherwise stops the study, nothing replaced: the
    # first sitting's cut-short A7, and a finished run that differs
    with pytest.raises(SystemExit, match=r"first/seed1-A7: seed1-A7 is archived in .* another "):
        run_main(monkeypatch, first, archive)
    for arm in ("A7", "A8"):
        shutil.rmtree(first / f"seed1-{arm}")
        os.remove(first / f"seed1-{arm}.log")
    (first / "seed2-A5" / "timings.json").write_text('{"total_s": 99.0}')
    with pytest.raises(SystemExit, match=r"first/seed2-A5: seed2-A5 is archived in .* another "):
        run_main(monkeypatch, first, archive)
    assert tree(archive) == after and not (first / "seed1-A7").exists()


def test_a_restored_seed_is_never_run_nor_archived_again(tmp_path, monkeypatch):
    archive, out = archived_study(tmp_path)
    held = tree(archive)
    for sitting in range(2):  # restored, then read from out as restored copies
        assert run_main(monkeypatch, out, archive) == []
        assert runner.archived(str(out / "seed1-A8")) and (out / "table.md").is_file()
        assert tree(archive) == held


def test_a_run_the_archive_cannot_serve_stops_the_study(tmp_path, monkeypatch):
    archive, out = archived_study(tmp_path)
    # seed 3 was archived outside the family, its pool reduced: asked for in it, its A8 would
    # run on a pool without answer texts (its A7 could run; nothing does)
    with pytest.raises(SystemExit, match=r"^seed 3: archived .* its pool reduced .* without "
                                         r"arm A8 \(seed3-A8\)"):
        run_main(monkeypatch, out, archive, "--family_seeds", "1", "2", "3")
    assert not glob.glob(str(out / "*.float32")) and not (out / "seed3-A7").exists()
    # an arm on the pool archived without its main run: the main run would make another pool
    os.remove(archive / "seed2.json")
    with pytest.raises(SystemExit, match=r"^seed 2: seed2-A5 is archived .* without its pool's "
                                         r"run seed2"):
        run_main(monkeypatch, tmp_path / "fresh", archive)


def test_a_stale_archived_run_stops_and_nothing_moves(tmp_path, monkeypatch):
    archive, out = archived_study(tmp_path)
    held = tree(archive)
    with pytest.raises(SystemExit, match="seed1: not in bfloat16, and it is an archived run"):
        run_main(monkeypatch, out, archive, dtype="bfloat16")
    assert tree(archive) == held
    names = [f[:-len(".json")] for f in os.listdir(archive)]
    assert sorted(os.listdir(out)) == sorted(names + [f"{name}.log" for name in names])


def test_an_interrupted_archive_write_leaves_no_run(tmp_path, monkeypatch):
    full, archive = finished_study(tmp_path / "full"), str(tmp_path / "archive")
    out = str(tmp_path / "out")
    runs = arms.dynamic_runs_of(full, 1, [], True)
    replace, rename, targets = os.replace, os.rename, []

    def failing(source, target, folder, name, done):
        targets.append(os.path.relpath(target, folder))
        if target == os.path.join(folder, name):
            raise OSError("stopped")
        done(source, target)
    monkeypatch.setattr(archiving.os, "replace", lambda source, target: failing(
        source, target, archive, "seed1.json", replace))
    with pytest.raises(OSError, match="stopped"):
        archiving.archive_runs(full, archive, 1, runs)
    # the document is written under a temporary name, then renamed in: stopped, no run there
    assert targets == ["seed1.json"] and os.listdir(archive) == [".seed1.json.tmp"]
    monkeypatch.setattr(archiving.os, "replace", replace)
    # a write killed before its rename leaves the temporary: no run, replaced
    with open(os.path.join(archive, ".seed1.json.tmp"), "w") as f:
        f.write("a stopped write's\n")
    assert archiving.restore_archived(out, archive, [1]) == []
    archiving.archive_runs(full, archive, 1, runs)
    archiving.archive_runs(full, str(tmp_path / "clean"), 1, runs)
    assert tree(archive) == tree(tmp_path / "clean")
    # restored into out_dir, a run folder is renamed in after its log: the folder's rename
    # stopped, the log moved back, the temporary folder gone
    targets.clear()
    monkeypatch.setattr(archiving.os, "rename", lambda source, target: failing(
        source, target, out, "seed1", rename))
    with pytest.raises(OSError, match="stopped"):
        archiving.restore_archived(out, archive, [1])
    assert targets == ["seed1.log", "seed1", os.path.join(".seed1.tmp", "seed1.log")]
    assert os.listdir(out) == []


def test_the_committed_archive_s_report_holds_docs_studies_md_s_tables(tmp_path, monkeypatch):
    """docs/studies.md's report command on the committed archive (docs/runs/study-dynamic, the
    default with --study dynamic --preset cpu-hard): every table of table.md is in the dynamic
    section line for line, but the three it words in prose (pools and rescues, the arms' starts,
    the machines), whose figures it quotes are checked there: the published tables are the
    code's, reproduced from the committed runs."""
    seeds = [str(s) for s in range(1, 17)]
    monkeypatch.setattr(sys, "argv", ["study_replay.py", "--study", "dynamic", "--preset",
                                      "cpu-hard", "--seeds", *seeds, "--dtype", "float32",
                                      "--out_dir", str(tmp_path), "--report_only"])
    study.main()
    guide = open(os.path.join(study.repo, "docs", "studies.md"), encoding="utf-8").read()
    section = guide.split("## Replay against dynamic sampling")[1].split("\n## ")[0]
    tables, table = [], []
    for line in open(tmp_path / "table.md", encoding="utf-8").read().split("\n") + [""]:
        if line.startswith("|"):
            table.append(line)
        elif table:
            tables.append(table)
            table = []
    in_prose = {"| seed | pool | A3 | A5 | A8 |": "pools",
                "| arm | first run | started (UTC) | from | after the plan's first commit | "
                "after its last |": "starts",
                "| runs | arms | of them | machines (runs) |": "machines"}
    shown = [t for t in tables if t[0] not in in_prose]
    assert len(shown) == 8 and sorted(in_prose[t[0]] for t in tables if t[0] in in_prose) == \
        ["machines", "pools", "starts"]
    for table in shown:
        assert "\n".join(table) in section, table[0]
    pools, starts = (next(t for t in tables if in_prose.get(t[0]) == name)[2:]
                     for name in ("pools", "starts"))
    sizes = [int(row.split(" | ")[1]) for row in pools]
    assert len(sizes) == 16 and f"pools of {min(sizes)}-{max(sizes)} prompts of 64" in section
    for row in starts:
        assert row.split(" | ")[2][len("2026-12-03T"):] in section, row
