"""The replay study's analysis (tests/study_replay.py, docs/study-plan.md) on hand-made numbers:
t quantiles without scipy, Holm's step-down and its intervals, the words of an interval, the
mechanism on matched prompts and the compute charges, from metrics.jsonl files written here.
No model, a few seconds.
Run: python -m pytest -q tests/test_study.py"""
import json
import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import study_replay as study  # noqa: E402


def test_t_quantiles_match_the_95_table_and_known_values():
    table = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}
    for df, t in table.items():
        assert round(study.t_quantile(0.975, df), 2) == t
    # Cauchy: P(|T| <= 1) = 1/2; df 2: P(|T| <= t) = t / sqrt(2 + t^2)
    assert study.t_central(1.0, 1) == pytest.approx(0.5)
    assert study.t_central(2.0, 2) == pytest.approx(2 / math.sqrt(6))
    # t(0.995, 7) = 3.4995, t(0.99, 5) = 3.3649 (printed tables)
    assert study.t_quantile(0.995, 7) == pytest.approx(3.4995, abs=1e-4)
    assert study.t_quantile(0.99, 5) == pytest.approx(3.3649, abs=1e-4)
    # the p-value at the 95 % quantile is 0.05
    test = study.paired_test([1.0, 2.0, 0.5, 1.5, 3.0, 0.2, 1.1, 2.2])
    t = test["mean"] / test["se"]
    assert 1 - study.t_central(study.t_quantile(0.975, 7), 7) == pytest.approx(0.05)
    assert test["p"] == pytest.approx(1 - study.t_central(t, 7))


def test_the_raw_interval_beyond_the_table_takes_the_exact_quantile():
    # 12 seeds, df 11: t(0.975, 11) = 2.2010 (printed tables), not the normal's 2.0
    values = [0.01 * i for i in range(12)]
    mean, low, high = study.t95_bounds(values)
    se = np.std(values, ddof=1) / math.sqrt(12)
    assert (high - mean) / se == pytest.approx(2.2010, abs=1e-4)
    # within the table: its two-decimal value, as the plan states (df 7: 2.36)
    mean, low, high = study.t95_bounds(values[:8])
    assert (high - mean) / (np.std(values[:8], ddof=1) / math.sqrt(8)) == pytest.approx(2.36)


def test_holm_against_a_hand_example():
    # sorted: 0.005 (x4 = 0.02, <= 0.0125: rejected), 0.01 (x3 = 0.03, <= 0.0167: rejected),
    # 0.03 (x2 = 0.06, > 0.025: stops here), 0.04 (x1, running max 0.06: kept at 0.025)
    out = study.holm([0.01, 0.04, 0.03, 0.005])
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
        rows = study.contrasts_table(acc, study.family)
        assert len(rows) == 8
        for r in rows:
            assert study.excludes_zero(*r["holm"]) == r["rejected"]
            # the Holm interval is never narrower than the raw 95 % one
            assert r["holm"][0] <= r["raw"][0] + 0.02 and r["holm"][1] >= r["raw"][1] - 0.02
            assert r["word"].startswith("a difference") == r["rejected"]


def test_contrasts_by_hand():
    # 3 seeds, points at steps 0, 2, 4: peak = best after step 0, final = the last point
    acc = {"A3": np.array([[0.1, 0.30, 0.25], [0.1, 0.20, 0.28], [0.1, 0.22, 0.24]]),
           "A1": np.array([[0.1, 0.20, 0.21], [0.1, 0.18, 0.20], [0.1, 0.19, 0.22]])}
    peak, final = study.contrasts_table(acc, [("A3", "A1")])
    assert peak["values"] == pytest.approx([9.0, 8.0, 2.0])  # 30-21, 28-20, 24-22
    assert final["values"] == pytest.approx([4.0, 8.0, 2.0])
    mean, sd = np.mean([9, 8, 2]), np.std([9, 8, 2], ddof=1)
    assert peak["raw"][1] == pytest.approx(mean + 4.30 * sd / math.sqrt(3))
    assert study.interval(np.array([9, 8, 2]) / 100) == \
        f"{mean:+.1f} [{mean - 4.30 * sd / 3 ** 0.5:+.1f}, {mean + 4.30 * sd / 3 ** 0.5:+.1f}]"


def test_interval_words():
    assert study.word(0.5, 3.0, 2.0) == "a difference (+)"
    assert study.word(-3.0, -0.1, 2.0) == "a difference (-)"
    assert study.word(-1.5, 1.8, 2.0) == "a null (inside ±2.0)"
    assert study.word(-2.0, 2.0, 2.0) == "a null (inside ±2.0)"
    assert study.word(-2.5, 1.0, 2.0) == "uninformative"
    assert study.word(-0.5, 4.0, 2.0, raw=(0.3, 3.0)) == \
        "uninformative (raw interval excludes 0; not after Holm)"
    assert study.word(float("nan"), float("nan"), 2.0) == "no interval"


def visit(prompt, fresh_correct, replays=0):
    return {"id": prompt, "fresh_correct": fresh_correct, "replays": replays,
            "rescued": replays > 0 and fresh_correct == 0}


def write_part(folder, part, visits_by_step, acc, kinds=None):
    """A part's metrics.jsonl: step 0 and every other step validated (acc: step -> val_acc)."""
    os.makedirs(os.path.join(folder, part), exist_ok=True)
    rows = [{"step": 0, "val_acc": acc[0], **(kinds or {})}]
    for step, visits in visits_by_step.items():
        row = {"step": step, "visits": visits, "rescued": sum(v["rescued"] for v in visits),
               "response_len": 10.0}
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
    found = study.matched_next_visits(rows["a3"], rows["a2"], 8)
    assert found["matched"] == 3 and found["rescued"] == 3 and found["unmatched"] == 0
    assert found["differences"] == pytest.approx([0.375, 0.125])
    assert found["a"] == pytest.approx([5 / 8, 1 / 8]) and found["b"] == pytest.approx([2 / 8, 0])
    # visit orders that differ are counted, not paired
    shifted = {**a2_seed1, 3: [visit("p2", 1)], 4: [visit("p1", 2), visit("p3", 8),
                                                     visit("p5", 0), visit("p4", 0)]}
    found = study.matched_next_visits(rows["a3"],
                                      [{"step": s, "visits": v} for s, v in shifted.items()], 8)
    assert found["unmatched"] == 2 and found["differences"] == []
    # the comparator: in A3 seed 1, rescued visits (1, p1), (1, p3), (2, p4), (2, p5) have next
    # visits 5/8, 6/8, 1/8, 0/8; the pooled visit (1, p2), not rescued, has 4/8
    comparator = study.rescue_comparator(rows["a3"], 8)
    assert sorted(comparator["rescued"]) == pytest.approx(sorted([5 / 8, 6 / 8, 1 / 8, 0.0]))
    assert comparator["not rescued"] == pytest.approx([4 / 8])


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
        for arm, (_, suffix, part) in study.arms.items():
            visits = {"A2": a2, "A3": a3, "A5": a3}.get(arm, a2)
            acc = {0: 0.1, 2: level[arm] - 0.02, 4: level[arm] + bump}
            write_part(main + suffix, part, visits, acc, kinds)
        os.makedirs(os.path.join(main, "collect"))
        with open(os.path.join(main, "collect", "pool.jsonl"), "w") as f:
            f.writelines(json.dumps({"id": p, "responses": ["1", "2"]}) + "\n"
                         for p in ("p1", "p2", "p3"))
        with open(os.path.join(main, "collect", "progress.jsonl"), "w") as f:
            f.writelines(json.dumps({"id": f"q{i}", "successes": [], "tokens": 100}) + "\n"
                         for i in range(5))
    results = study.report(out, [1, 2], cfg)
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
    config = {k: getattr(cfg, k) for k in study.regime_keys}
    (folder / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    assert study.stale_reason(str(folder), "bfloat16", cfg) == ""
    assert study.stale_reason(str(folder), "float32", cfg) == "not in float32"
    # the on-policy study's runs: one mini-batch of 8 prompts a step
    (folder / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16",
                                                    "mini_batch_prompts": 8}))
    assert study.stale_reason(str(folder), "bfloat16", cfg) == \
        "another regime (mini_batch_prompts)"
    assert study.stale_reason(str(tmp_path / "none"), "bfloat16", cfg) == ""
