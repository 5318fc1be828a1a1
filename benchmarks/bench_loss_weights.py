"""How much one response weighs in the policy gradient: verl's per-micro-batch token mean vs
rlep.py's exact one.

    # about a second; the same as --seed 0 --sigma 0.7 --median 1100 --ranks 64 --mini_batch 1024
    # --max_token_len 4096 --trials 200
    .venv/bin/python benchmarks/bench_loss_weights.py

docs/paper.md, deviation 2. The authors' verl fork (Kwai-Klear/RLEP, recipe/rlep: token-mean,
use_dynamic_bsz, 64 GPUs, 64 prompts x 16 answers per mini-batch, ppo_max_token_len_per_gpu 4096)
packs each rank's 16 sequences into ceil(prompt + response tokens / 4096) micro-batches balanced by
tokens, the count all-reduced with MAX over the ranks (seqlen_balancing.py:251-258; ~1% of
micro-batches then exceed 4096). Each micro-batch's loss is the mean over its response tokens times
len(micro) / 16 (dp_actor.py:419); gradients are averaged over the ranks. rlep.py divides every
response token by the response tokens of the whole mini-batch. Reference: the per-sequence mean.
Lengths: prompts uniform 120-400, responses log-normal (median 1100, sigma 0.7), capped
(= truncated) at 3072.
Printed: mean of (a response's total weight) / (its weight under the per-sequence mean), by
response length.
Sigma 0.5 / 0.6 / 0.8: verl 1.06x and 0.42 / 0.41 / 0.41x;
token mean 2.49 / 2.41 / 2.28x and 0.33 / 0.30 / 0.26x.
--no_sync (each rank its own count, split until none exceeds 4096): verl 1.20x and 0.35x at
sigma 0.7.
Output for the defaults:

    204800 responses (200 mini-batches), sigma 0.7, truncated 7.2%, micro-batches per rank 8.61
    response tokens      share  verl/seq  token-mean/seq
    < 500                13.0%      0.41            0.28
    500-1000             31.5%      0.79            0.57
    1000-2000            35.7%      1.29            1.08
    2000-3071            12.5%      1.29            1.85
    = 3072 (truncated)    7.2%      1.06            2.34
    headline: truncated 1.06x (verl) 2.34x (token mean); < 500 0.41x (verl) 0.28x (token mean)
"""
import argparse

import numpy as np

BUCKETS = [("< 500", 0, 500), ("500-1000", 500, 1000), ("1000-2000", 1000, 2000),
           ("2000-3071", 2000, 3072)]


def draw_lengths(rng, n, median=1100.0, sigma=0.7, max_response=3072, prompt_range=(120, 400)):
    """(prompt, response) token counts of n sequences; responses log-normal, capped
    (= truncated) at max_response."""
    prompt = rng.integers(prompt_range[0], prompt_range[1] + 1, size=n)
    log_normal = median * np.exp(sigma * rng.standard_normal(n))
    response = np.clip(np.rint(log_normal), 1, max_response).astype(int)
    return prompt, response


def balanced_partition(lengths, k):
    """k groups of indices: largest sequence first into the currently lightest group (equal-ish
    token sums)."""
    sums = np.zeros(k, dtype=np.int64)
    groups = [[] for _ in range(k)]
    for i in np.argsort(-np.asarray(lengths), kind="stable"):
        g = int(np.argmin(sums))
        groups[g].append(int(i))
        sums[g] += lengths[i]
    return [g for g in groups if g]


def micro_batch_counts(shares, max_token_len, sync=True):
    """verl: ceil(tokens of a rank's share / max_token_len), at most one per sequence; sync: the max
    over ranks."""
    k = [min(len(s), -(-int(np.sum(s)) // max_token_len)) for s in shares]
    return [max(k)] * len(k) if sync else k


def micro_batches(lengths, k, max_token_len, split_overflow=False):
    """k balanced micro-batches; split_overflow: more until none exceeds max_token_len (verl never
    splits)."""
    while True:
        groups = balanced_partition(lengths, k)
        if not split_overflow or k >= len(lengths):
            return groups
        if max(int(np.sum(lengths[g])) for g in groups) <= max_token_len:
            return groups
        k += 1


def verl_weights(prompt, response, ranks, max_token_len, sync=True):
    """Total weight of each response: per-micro-batch token mean x len(micro) / per-rank share,
    mean over ranks."""
    weights = np.zeros(len(response))
    n_micro = []
    # each rank's contiguous share of the mini-batch
    idxs = np.array_split(np.arange(len(response)), ranks)
    counts = micro_batch_counts([prompt[i] + response[i] for i in idxs], max_token_len, sync)
    for idx, k in zip(idxs, counts):
        lengths = prompt[idx] + response[idx]
        groups = micro_batches(lengths, k, max_token_len, split_overflow=not sync)
        n_micro.append(len(groups))
        for g in groups:
            j = idx[g]
            weights[j] = response[j] / response[j].sum() * (len(j) / len(idx)) / ranks
    return weights, float(np.mean(n_micro))


def token_mean_weights(response):
    """rlep.py: every response token weighs 1 / (response tokens of the whole mini-batch)."""
    return response / response.sum()


def seq_mean_weights(response):
    """Reference (seq-mean-token-mean): every response weighs 1 / (sequences of the mini-batch)."""
    return np.full(len(response), 1.0 / len(response))


def simulate(seed=0, sigma=0.7, median=1100.0, ranks=64, mini_batch=1024, max_token_len=4096,
             trials=200, max_response=3072, sync=True):
    """Per-response ratios (verl / seq mean, token mean / seq mean), the response lengths, mean
    micro-batches."""
    rng = np.random.default_rng(seed)
    out = {"verl": [], "token": [], "length": [], "micro": []}
    for _ in range(trials):
        prompt, response = draw_lengths(rng, mini_batch, median, sigma, max_response)
        ref = seq_mean_weights(response)
        w, micro = verl_weights(prompt, response, ranks, max_token_len, sync)
        for key, v in zip(out, (w / ref, token_mean_weights(response) / ref, response, micro)):
            out[key].append(v)
    return {k: float(np.mean(v)) if k == "micro" else np.concatenate(v) for k, v in out.items()}


def report(r, trials, sigma, max_response=3072):
    length = r["length"]
    trunc = length == max_response
    short = length < 500
    print(f"{len(length)} responses ({trials} mini-batches), sigma {sigma}, "
          f"truncated {trunc.mean():.1%}, micro-batches per rank {r['micro']:.2f}")
    print(f"{'response tokens':<19} {'share':>6} {'verl/seq':>9} {'token-mean/seq':>15}")
    rows = [(name, (length >= lo) & (length < hi)) for name, lo, hi in BUCKETS]
    for name, m in rows + [(f"= {max_response} (truncated)", trunc)]:
        v = r["verl"][m].mean() if m.any() else np.nan
        t = r["token"][m].mean() if m.any() else np.nan
        print(f"{name:<19} {m.mean():>6.1%} {v:>9.2f} {t:>15.2f}")
    print(f"headline: truncated {r['verl'][trunc].mean():.2f}x (verl) "
          f"{r['token'][trunc].mean():.2f}x (token mean); "
          f"< 500 {r['verl'][short].mean():.2f}x (verl) "
          f"{r['token'][short].mean():.2f}x (token mean)")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sigma", type=float, default=0.7)
    p.add_argument("--median", type=float, default=1100.0)
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--mini_batch", type=int, default=1024)
    p.add_argument("--max_token_len", type=int, default=4096)
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--no_sync", action="store_true",
                   help="per-rank micro-batch count, split until none overflows")
    a = p.parse_args()
    r = simulate(a.seed, a.sigma, a.median, a.ranks, a.mini_batch, a.max_token_len, a.trials,
                 sync=not a.no_sync)
    report(r, a.trials, a.sigma)
