"""The studies' arms, their families of contrasts and the runs a seed needs (docs/study-plan.md,
docs/study-plan-dynamic.md): each arm's label, folder and part, and each run's rlep.py flags."""
import os

# arm -> (label, folder suffix, part whose curve it is)
arms = {"A1": ("baseline, all prompts", "", "phase1"),
        "A2": ("baseline, pool's prompts", "-A2", "phase1"),
        "A3": ("RLEP (the paper)", "", "phase2"),
        "A4": ("RLEP, all prompts", "-A4", "phase2"),
        "A5": ("replays imitated (nll)", "-A5", "phase2")}
arm_a6 = ("RLEP, pool at T = 1.0", "-A6", "phase2")
# the family (docs/study-plan.md), each on the peak and on the final; --with_a6 adds A3 - A6
family = [("A3", "A2"), ("A4", "A1"), ("A3", "A5"), ("A3", "A1")]
# --study dynamic (docs/study-plan-dynamic.md): A1, A3 and A5 as above on every seed; A7 and A8,
# DAPO's dynamic sampling (--dynamic_sampling), on the family's seeds only
dynamic_plan = "docs/study-plan-dynamic.md"
dynamic_arms = {"A1": arms["A1"], "A3": arms["A3"], "A5": arms["A5"],
                "A7": ("baseline, dynamic sampling", "-A7", "phase1"),
                "A8": ("RLEP, dynamic sampling", "-A8", "phase2")}
family_arms = ("A1", "A3", "A7", "A8")  # a seed of the family has all four
# replay against DAPO's remedy; what dynamic sampling adds to replay; what it buys the baseline
dynamic_family = [("A3", "A7"), ("A8", "A3"), ("A7", "A1")]
on_pool = ("A3", "A5", "A8")  # charged phase one up to the collection, and the collection


def study_arms(with_a6: bool) -> dict:
    return {**arms, "A6": arm_a6} if with_a6 else dict(arms)


def study_family(with_a6: bool) -> list:
    return family + [("A3", "A6")] if with_a6 else list(family)


def runs_of(out: str, seed: int, settings: list, cfg, with_a6: bool = False) -> list:
    """(folder, rlep.py flags) of a seed's runs, in the order they must run."""
    main = os.path.join(out, f"seed{seed}")
    pool = os.path.join(main, "collect", "pool.jsonl")
    runs = [(main, settings),
            (main + "-A2", settings + ["--phase", "1", "--phase1_prompts", "pool", "--pool", pool,
                                       "--phase1_steps", str(cfg.phase2_steps)]),
            (main + "-A4", settings + ["--phase", "2", "--pool", pool, "--phase2_prompts", "all"]),
            (main + "-A5", settings + ["--phase", "2", "--pool", pool, "--replay_loss", "nll"])]
    if with_a6:
        runs.append((main + "-A6", settings + ["--collect_temperature", "1.0"]))
    return runs


def dynamic_runs_of(out: str, seed: int, settings: list, family_seed: bool) -> list:
    """(folder, rlep.py flags) of a seed's runs in --study dynamic, in the order they must run:
    the main run (A1, A3) and A5 as runs_of's; on a seed of the family also A7 and A8."""
    main = os.path.join(out, f"seed{seed}")
    pooled = ["--phase", "2", "--pool", os.path.join(main, "collect", "pool.jsonl")]
    runs = [(main, settings), (main + "-A5", settings + pooled + ["--replay_loss", "nll"])]
    if family_seed:
        runs += [(main + "-A7", settings + ["--phase", "1", "--dynamic_sampling"]),
                 (main + "-A8", settings + pooled + ["--dynamic_sampling"])]
    return runs
