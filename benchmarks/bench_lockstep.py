"""How busy FSDP2's lockstep leaves the ranks: the trainer's own planner
(rlep.plan_mini_batches, planner.plan_micro_batches) on the paper preset's step, no
model. Every rank runs as many passes a mini-batch as the busiest needs; a rank holding fewer
rows runs idle ones. Response lengths follow a wide distribution (a normal of mean 1,500 and sd
800 tokens cut to [200, 3,072]; prompts 100-400 tokens); in phase two 15 % of the prompts hold a
single pooled answer, the rest m. One line per configuration:

    lockstep W=64 phase=2 busiest_over_mean=1.12 idle_share=0.11 empty_share=0.11 ...

busiest_over_mean: the busiest rank's passes over the mean rank's (real passes, idle ones not
counted), summed over a step's mini-batches; idle_share: the share of all passes that are idle;
empty_share: the share run idle by ranks that hold no prompt of the mini-batch (no split helps
them); padded_share: the share of the real micro-batches' tokens (rows x the longest row) that are
padding; heaviest_over_mean: pass by pass, the heaviest rank's padded tokens over the mean rank's
(what a lockstep pass waits on), summed over the step; passes: a rank's update passes a step;
heaviest_tokens: the padded tokens of the heaviest rank of each pass, summed over a step.
Means over --trials steps.
Run: python benchmarks/bench_lockstep.py [--micro_batch_tokens 0] [--whole_groups | --before]
(seconds)
`--whole_groups` keeps each group on the rank that generated it (the placement rows replaced,
and share_prompts' still); `--before` also replaces the split by the one it replaced: each rank
packs its rows alone, longest first, as many as fit (fewer passes where it holds fewer tokens),
and runs idle passes up to the busiest. `--random_draws` replaces the runs by the planner they
replaced, each mini-batch a random draw of the step's prompts (their ranks as uneven as chance
makes them), for comparison."""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machinery import planner, ranks
import rlep  # noqa: E402


def draw_lengths(rng, size, low=200, high=3072, mean=1500.0, sd=800.0):
    """Response lengths from a normal cut to [low, high], by rejection."""
    out = np.empty(0, dtype=int)
    while out.size < size:
        draw = rng.normal(mean, sd, 2 * size)
        out = np.concatenate([out, draw[(draw >= low) & (draw <= high)].astype(int)])
    return out[:size]


def step_sizes(cfg, phase, rng):
    """GroupSize per position of one training step, as the trainer gathers them."""
    sizes = {}
    for position in range(cfg.prompts_per_step):
        replays = 0
        if phase == 2:
            # RLEP: m replays, or the one answer a prompt's pool holds
            replays = 1 if rng.random() < 0.15 else cfg.replay_m
        samples = cfg.n + replays
        prompt = int(rng.integers(100, 401))
        responses = draw_lengths(rng, samples)
        row_lengths = tuple(int(prompt + r) for r in responses)
        sizes[position] = planner.GroupSize(position, int(responses.sum()), row_lengths)
    return sizes


def random_draws(num_prompts, num_updates, epoch, seed):
    """The planner before the runs: mini-batches as parts of a seeded permutation."""
    order = np.random.default_rng(seed).permutation(num_prompts)
    return np.array_split(order, num_updates)


def packed_alone(positions, sizes, rank, world_size, split):
    """The split before the lockstep count: the rank's rows longest first, each micro-batch as
    many as fit in the token budget (runs of micro_batch_size rows, in order, without one)."""
    held = [(p, i) for p in positions if p % world_size == rank
            for i in range(len(sizes[p].row_lengths))]
    lengths = [sizes[p].row_lengths[i] for p, i in held]
    if not split.max_tokens:
        size = split.max_rows
        return [held[i:i + size] for i in range(0, len(held), size)]
    micro_batches = []
    for i in sorted(range(len(held)), key=lambda i: -lengths[i]):
        if micro_batches:
            current = micro_batches[-1]
            if (len(current) + 1) * lengths[current[0]] <= split.max_tokens:
                current.append(i)
                continue
        micro_batches.append([i])
    return [[held[i] for i in micro] for micro in micro_batches]


def whole_groups(positions, sizes, world_size, split):
    """The trainer's split of whole groups, each on the rank that generated it."""
    return planner.plan_micro_batches(positions, sizes, world_size,
                                        split._replace(share_prompts=True))


def before(positions, sizes, world_size, split):
    return [packed_alone(positions, sizes, r, world_size, split) for r in range(world_size)]


def simulate(cfg, world_size, phase, trials, seed, plan_runs=rlep.plan_mini_batches,
             splitter=planner.plan_micro_batches):
    busiest_sum = mean_sum = idle = empty = passes = padding = computed = 0.0
    heaviest_sum = mean_tokens_sum = 0.0
    rng = np.random.default_rng(seed)
    for trial in range(trials):
        # as generated: prompt p on rank p % W
        sizes = {p: g._replace(rank=p % world_size)
                 for p, g in step_sizes(cfg, phase, rng).items()}
        total_samples = sum(len(g.row_lengths) for g in sizes.values())
        # the trainer's count: RLEP's 512 x 18 sequences make 9 updates, the baseline's 8
        num_updates = max(1, round(total_samples / (cfg.mini_batch_prompts * cfg.n)))
        runs = plan_runs(len(sizes), num_updates, epoch=0, seed=trial)
        for positions in runs:
            split = planner.Split(cfg.micro_batch_size, cfg.micro_batch_tokens, cfg.share_prompts)
            plans = splitter(positions, sizes, world_size, split)
            counts = [len(plan) for plan in plans]
            busiest = max(counts)
            busiest_sum += busiest
            mean_sum += np.mean(counts)
            idle += world_size * busiest - sum(counts)
            empty += busiest * counts.count(0)
            passes += world_size * busiest
            # tokens[r, j]: rank r's padded tokens in its pass j (0: idle)
            tokens = np.zeros((world_size, busiest))
            for r, plan in enumerate(plans):
                for j, micro in enumerate(plan):
                    lengths = [sizes[p].row_lengths[i] for p, i in micro]
                    tokens[r, j] = len(lengths) * max(lengths)
                    padding += len(lengths) * max(lengths) - sum(lengths)
            computed += tokens.sum()
            heaviest_sum += tokens.max(axis=0).sum()
            mean_tokens_sum += tokens.mean(axis=0).sum()
    return {"busiest_over_mean": busiest_sum / mean_sum, "idle_share": idle / passes,
            "empty_share": empty / passes, "padded_share": padding / computed,
            "heaviest_over_mean": heaviest_sum / mean_tokens_sum,
            "passes": busiest_sum / trials, "heaviest_tokens": heaviest_sum / trials}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro_batch_tokens", type=int, default=None,
                        help="the paper preset's unless given; 0: fixed micro-batches")
    parser.add_argument("--random_draws", action="store_true",
                        help="the earlier planner: mini-batches drawn at random")
    parser.add_argument("--whole_groups", action="store_true",
                        help="the earlier placement: each group on the rank that generated it")
    parser.add_argument("--before", action="store_true",
                        help="the earlier split: each rank packs alone, idle up to the busiest")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    flags = ["--preset", "paper"]
    if args.micro_batch_tokens is not None:
        flags += ["--micro_batch_tokens", str(args.micro_batch_tokens)]
    cfg = rlep.parse_config(flags)
    mini_batches = random_draws if args.random_draws else rlep.plan_mini_batches
    splitter = planner.plan_micro_batches
    if args.whole_groups or args.before:
        splitter = before if args.before else whole_groups
    for world_size in (1, 8, 16, 64):
        for phase in (1, 2):
            result = simulate(cfg, world_size, phase, args.trials, args.seed, mini_batches,
                              splitter)
            passes, heaviest = result.pop("passes"), result.pop("heaviest_tokens")
            print(f"lockstep W={world_size} phase={phase} "
                  + " ".join(f"{k}={v:.2f}" for k, v in result.items())
                  + f" passes={passes:.1f} heaviest_tokens={heaviest:.0f}"
                  f" micro_batch_size={cfg.micro_batch_size} "
                  f"micro_batch_tokens={cfg.micro_batch_tokens}")
    # what planner.deal's exchange sends of a row: its token ids (Qwen's vocabulary) and vLLM's
    # log-prob of each fresh token, pickled as ranks.exchange pickles them
    rng = np.random.default_rng(args.seed)
    prompt = rng.integers(0, 151936, 250).tolist()  # a group's rows share their prompt's list
    lengths = draw_lengths(rng, cfg.n)
    rows = [((0, i), rlep.Sample(prompt, rng.integers(0, 151936, length).tolist(), True, 1.0,
                                 vllm_logprobs=(-rng.random(length)).tolist()))
            for i, length in enumerate(lengths)]
    print(f"exchange: {len(ranks.row_bytes(rows)) / lengths.sum():.1f} bytes a response "
          "token (ranks.row_bytes of a group's rows)")


if __name__ == "__main__":
    main()
