"""Mutation check: each named edit of RLEP's method, applied to a temporary copy of the
repository, must make the fast tests fail ("killed"). A mutation whose pattern no longer
occurs exactly once is reported stale (the code moved: update its pattern), never passed.

    python tests/mutate.py              # every mutation: one line each, then the total
    python tests/mutate.py NAME ...     # only these
    python tests/mutate.py --list

Exits 0 only when the unmutated copy passes and every mutation is killed. A script, not a
test (pytest does not collect it); it takes minutes, outside CI's time."""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the tests that must catch every mutation, quickest to fail first
fast_tests = ["tests/test_loss.py", "tests/test_paper.py", "tests/test_data.py",
              "tests/test_replay_variants.py"]

# (name, file, pattern, replacement): the pattern must occur exactly once in the file
mutations = [
    # the loss
    ("eps swapped in the clip", "rlep.py",
     "ratio.clamp(1 - clip_low, 1 + clip_high)", "ratio.clamp(1 - clip_high, 1 + clip_low)"),
    ("eps swapped in the update's call", "rlep.py",
     "cfg.clip_low, cfg.clip_high, cfg.clip_c", "cfg.clip_high, cfg.clip_low, cfg.clip_c"),
    ("dual clip dropped", "rlep.py",
     "per_token_loss = torch.where(adv < 0, dual_clipped, pessimistic)",
     "per_token_loss = pessimistic"),
    ("dual clip at a fixed c = 10", "rlep.py", "-adv * clip_c)", "-adv * 10.0)"),
    ("per-sequence mean", "rlep.py", "loss = (per_token_loss * mask).sum() / num_tokens",
     "loss = ((per_token_loss * mask).sum(1) / mask.sum(1)).mean()"),
    ("N per micro-batch", "rlep.py", "num_tokens=mini_batch.num_tokens)", "num_tokens=None)"),
    # the advantage
    ("population std", "rlep.py", "groups.std(dim=1, keepdim=True)",
     "groups.std(dim=1, keepdim=True, unbiased=False)"),
    ("fresh-only standardisation", "rlep.py",
     'scored = group if cfg.replay_loss == "group" else group[:len(completions)]',
     "scored = group[:len(completions)]"),
    # the reward
    ("overlong sign flipped", "rlep.py", "reward = (1.0 if correct else -1.0) + penalty",
     "reward = (1.0 if correct else -1.0) - penalty"),
    ("overlong factor ignored", "rlep.py", "cfg.overlong_factor)", "1.0)"),
    ("overlong window from L_max - 2 L_cache", "rlep.py",
     "length - (max_len - buffer_len)", "length - (max_len - 2 * buffer_len)"),
    ("reward 0/1 instead of +-1", "rlep.py", "reward = (1.0 if correct else -1.0) + penalty",
     "reward = (1.0 if correct else 0.0) + penalty"),
    ("replays not re-verified", "rlep.py",
     'correct = verify.verify(text, row["answer"], mode=cfg.verify_mode)',
     'correct = replay or verify.verify(text, row["answer"], mode=cfg.verify_mode)'),
    ("reward ignores the paper rule", "rlep.py",
     'correct = verify.verify(text, row["answer"], mode=cfg.verify_mode)',
     'correct = verify.verify(text, row["answer"])'),
    ("replays not ended", "rlep.py",
     "ids = tokenizer.encode(text, add_special_tokens=False) + [end_id]",
     "ids = tokenizer.encode(text, add_special_tokens=False)"),
    ("replays not cut to L_max", "rlep.py",
     "candidates.append((ids[:cfg.max_response_len], None, True))",
     "candidates.append((ids, None, True))"),
    ("paper rule window dropped", "verify.py",
     'matches = re.findall(r"(?i)Answer\\s*:\\s*([^\\n]+)", response[-300:])',
     'matches = re.findall(r"(?i)Answer\\s*:\\s*([^\\n]+)", response)'),
    ("paper rule window 400", "verify.py", "response[-300:]", "response[-400:]"),
    # replay
    ("replays with replacement", "rlep.py", "replace=False)", "replace=True)"),
    ("none replayed when fewer than m", "rlep.py",
     "if len(responses) <= m:  # RLEP: fewer than m: the authors' code takes them all\n"
     "        return list(responses)",
     "if len(responses) <= m:  # RLEP: fewer than m: the authors' code takes them all\n"
     "        return []"),
    ("replays drawn once per prompt", "rlep.py",
     'rng = np.random.default_rng(seed_for(cfg.seed, part, step, row["id"]))',
     'rng = np.random.default_rng(seed_for(cfg.seed, part, row["id"]))'),
    ("phase two from the phase-one checkpoint", "rlep.py",
     'train(cfg, "phase2", rows, engine, tokenizer, end_id, base_path, d, val_rows, replay=True)',
     'train(cfg, "phase2", rows, engine, tokenizer, end_id, checkpoint_path(os.path.join('
     'cfg.out_dir, "phase1"), cfg.collect_step), d, val_rows, replay=True)'),
    # the collection
    ("collection from phase one's last checkpoint", "rlep.py", "engine.push(path=ckpt)",
     'engine.push(path=checkpoint_path(os.path.join(cfg.out_dir, "phase1"), '
     "cfg.phase1_steps))"),
    ("collection K ignored", "rlep.py", "cfg.collect_k, cfg, [end_id],", "cfg.n, cfg, [end_id],"),
    ("collection temperature ignored", "rlep.py",
     'temperature=cfg.collect_temperature,', 'temperature=cfg.temperature,'),
    ("collection top-p ignored", "rlep.py", "top_p=cfg.collect_top_p,", "top_p=cfg.top_p,"),
    ("min_successes ignored", "rlep.py", 'if len(successes[row["id"]]) >= cfg.min_successes]',
     'if len(successes[row["id"]]) >= 1]'),
    ("collection keeps unverified answers", "data.py",
     'right = [t for t, ok in zip(record["responses"], record["correct"]) if ok]',
     'right = list(record["responses"])'),
    # validation
    ("phase two validates on other draws", "rlep.py",
     "step=step + 1))", "step=step + 1 + 1000 * replay))"),
    ("phase two's step 0 on other draws", "rlep.py",
     "validate(engine, tokenizer, val_rows, cfg, stop_ids, d, step=0)",
     "validate(engine, tokenizer, val_rows, cfg, stop_ids, d, step=int(replay))"),
    # the optimiser
    ("warm-up removed", "rlep.py", "return cfg.lr * min(1.0, step / cfg.warmup_steps)",
     "return cfg.lr"),
    ("warm-up from lr / warmup_steps", "rlep.py", "min(1.0, step / cfg.warmup_steps)",
     "min(1.0, (step + 1) / cfg.warmup_steps)"),
    ("lr not applied", "rlep.py", 'group["lr"] = lr', 'group["lr"] = cfg.lr'),
    ("weight decay dropped", "rlep.py", "weight_decay=cfg.weight_decay, fused=True",
     "weight_decay=0.0, fused=True"),
    ("grad clip removed", "rlep.py", "clip_grad_norm_(policy.parameters(), cfg.grad_clip)",
     'clip_grad_norm_(policy.parameters(), float("inf"))'),
    ("grad clip at a fixed 1.0", "rlep.py", "clip_grad_norm_(policy.parameters(), cfg.grad_clip)",
     "clip_grad_norm_(policy.parameters(), 1.0)"),
    ("non-finite skip removed", "rlep.py", "if math.isfinite(grad_norm):", "if True:"),
    ("update count ignores replays", "rlep.py",
     "total_samples = sum(len(g.row_lengths) for g in sizes.values())",
     "total_samples = len(sizes) * cfg.n"),
    ("equal_updates ignored", "rlep.py",
     "per_prompt = cfg.n + cfg.replay_m if replay and cfg.equal_updates else cfg.n",
     "per_prompt = cfg.n"),
    ("equal_updates always on", "rlep.py",
     "per_prompt = cfg.n + cfg.replay_m if replay and cfg.equal_updates else cfg.n",
     "per_prompt = cfg.n + cfg.replay_m if replay else cfg.n"),
    ("autocast disabled", "rlep.py", 'enabled=cfg.dtype != "float32"', "enabled=False"),
    # the preset and main
    ("paper preset: collect_k 32", "rlep.py", "collect_k: int = 64", "collect_k: int = 32"),
    ("paper preset: warm-up 5", "rlep.py", "warmup_steps: int = 10", "warmup_steps: int = 5"),
    ("disk check removed from the start checks", "checks.py",
     "check_disk(cfg, model_path, len(train_rows), world_size)", "pass"),
]


def run_tests(copy: str) -> int:
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
               *fast_tests]
    return subprocess.run(command, cwd=copy, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, timeout=1800).returncode


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="mutations to run (default: all)")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    chosen = [m for m in mutations if not args.names or m[0] in args.names]
    unknown = set(args.names) - {m[0] for m in mutations}
    if args.list or unknown:
        print("\n".join(m[0] for m in mutations))
        sys.exit(f"unknown mutations: {sorted(unknown)}" if unknown else 0)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rlep-mutate-") as tmp:
        copy = os.path.join(tmp, "repo")
        shutil.copytree(repo, copy, ignore=shutil.ignore_patterns(
            ".git", ".venv", ".cache", "runs", "__pycache__", ".pytest_cache"))
        if run_tests(copy) != 0:
            sys.exit("the unmutated copy fails the fast tests: fix them first")
        print(f"unmutated: the fast tests pass ({time.perf_counter() - started:.0f} s)",
              flush=True)
        killed = 0
        for name, file, pattern, replacement in chosen:
            path = os.path.join(copy, file)
            original = open(path, encoding="utf-8").read()
            found = original.count(pattern)
            if found != 1:
                print(f"STALE     {name}: the pattern occurs {found} times in {file}",
                      flush=True)
                continue
            start = time.perf_counter()
            with open(path, "w", encoding="utf-8") as f:
                f.write(original.replace(pattern, replacement))
            try:
                status = run_tests(copy)
            finally:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(original)
            seconds = time.perf_counter() - start
            # 1: a test failed; anything else (an error, a crash) is not a clean kill
            verdict = {0: "SURVIVED", 1: "killed"}.get(status, f"ERROR rc={status}")
            killed += status == 1
            print(f"{verdict:9s} {name} ({seconds:.0f} s)", flush=True)
    print(f"{killed}/{len(chosen)} mutations killed in {time.perf_counter() - started:.0f} s")
    sys.exit(0 if killed == len(chosen) else 1)


if __name__ == "__main__":
    main()
