"""Benchmark verify.py on the labelled peer cases and on hostile inputs.

    python tests/bench_verify.py [--cases PATH] [--misses]

Prints accuracy on the unambiguous cases (overall and per source), latency (median, p99, max) on
the same cases and on hostile inputs (tests/test_verify.py asserts their verdicts, not their
times), a call from a thread and one with a 5 ms deadline, and, when math-verify is installed,
its accuracy and latency on the same cases for comparison. The default case file is
../shared/data/ beside the repository.
"""
import argparse
import json
import os
import select
import statistics
import sys
import threading
import time
from collections import defaultdict

repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, repo_root)
import verify  # noqa: E402


def hostile_inputs():
    """(name, response, gold): injection, magnitude, nesting, size and Unicode attacks."""
    payload = "__import__('os').system('touch /tmp/verify_bench_canary')"
    return [
        ("code injection", rf"\boxed{{{payload}}}", "1"),
        ("exec in latex", r"\boxed{\exec(open('/tmp/verify_bench_canary','w'))}", "1"),
        ("tower", r"\boxed{9^{9^{9^{9}}}}", "1"),
        ("tower vs tower", r"\boxed{9^{9^{9^{9}}}}", r"9^{9^{9^{9}}}"),
        ("huge factorial", r"\boxed{(10^{10})!}", "1"),
        ("huge power", r"\boxed{2^{10^{12}} - 2^{10^{12}}}", "0"),
        ("symbolic huge power", r"\boxed{(x+1)^{100000000}}", "x"),
        ("deep nesting", r"\boxed{" + "(" * 5000 + "1" + ")" * 5000 + "}", "1"),
        ("deep braces", r"\boxed{" + "{" * 20000 + "1" + "}" * 20000 + "}", "1"),
        ("1 MB response", "x" * 1_000_000 + r"\boxed{7}", "7"),
        ("1 MB of digits", "9" * 1_000_000, "7"),
        ("many boxes", r"\boxed{1} " * 100_000, "1"),
        ("unbalanced braces", r"\boxed{" * 50_000, "1"),
        ("unclosed dollars", "$$ 1 " * 100_000, "1"),
        ("odd unicode", "Answer: ７\u200b\u202e½" + "\U0001d7d9" * 1000, "7"),
        ("long sympy answer", r"\boxed{" + "+".join(f"x^{{{i}}}" for i in range(300)) + "}", "x"),
        ("integral", r"\boxed{\int_0^{\infty} e^{-x^2} dx}", r"\frac{\sqrt{\pi}}{2}"),
        ("sum", r"\boxed{\sum_{k=1}^{10^{12}} k}", "1"),
    ]


def load_cases(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if not r.get("ambiguous")]


def time_calls(check, cases):
    """(verdicts, per-call seconds) for check(pred, gold) over the cases."""
    verdicts, seconds = [], []
    for case in cases:
        start = time.perf_counter()
        verdicts.append(check(case["pred"], case["gold"]))
        seconds.append(time.perf_counter() - start)
    return verdicts, seconds


def summary(seconds):
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (f"median {statistics.median(ordered) * 1e3:.2f} ms  p99 {p99 * 1e3:.1f} ms  "
            f"max {ordered[-1] * 1e3:.0f} ms")


def math_verify_check():
    try:
        import math_verify
    except ImportError:
        return None

    def check(pred, gold):
        try:
            return bool(math_verify.verify(math_verify.parse(gold), math_verify.parse(pred)))
        except Exception:
            return False
    return check


def main():
    parser = argparse.ArgumentParser()
    default_cases = os.path.join(repo_root, "..", "shared", "data", "verifier_peer_cases.jsonl")
    parser.add_argument("--cases", default=default_cases)
    parser.add_argument("--misses", action="store_true",
                        help="print the cases decided against the label")
    args = parser.parse_args()
    cases = load_cases(args.cases)

    # start the sympy worker outside the timing, and let its spare finish warming up
    verify.verify(r"\boxed{x+1}", "1+x")
    select.select([verify._workers[1].stdout], [], [], 60)
    verdicts, seconds = time_calls(verify.verify, cases)
    by_source = defaultdict(lambda: [0, 0])
    for case, verdict in zip(cases, verdicts):
        source = case["source"].split(":")[0].split("#")[0]
        by_source[source][0] += verdict == case["expected"]
        by_source[source][1] += 1
        if args.misses and verdict != case["expected"]:
            print(f"MISS {case['id']} expected={case['expected']} gold={case['gold'][-80:]!r} "
                  f"pred={case['pred'][-120:]!r} extracted={verify.extract_answer(case['pred'])!r}")
    correct = sum(v == c["expected"] for v, c in zip(verdicts, cases))
    percent = 100 * correct / len(cases)
    print(f"verify.py    accuracy {correct}/{len(cases)} = {percent:.1f} %   {summary(seconds)}")
    for source, (right, total) in sorted(by_source.items(), key=lambda kv: -kv[1][1]):
        print(f"    {source:40s} {right:3d}/{total:3d} = {100 * right / total:5.1f} %")

    hostile = hostile_inputs()
    hostile_seconds = []
    for name, response, gold in hostile:
        start = time.perf_counter()
        verdict = verify.verify(response, gold)
        hostile_seconds.append(time.perf_counter() - start)
        print(f"    hostile {name:22s} -> {verdict!s:5s} {hostile_seconds[-1] * 1e3:8.1f} ms")
    # the deadline from a thread (no signal.alarm there), and a 5 ms one the worker overruns
    timed = {}

    def tower():
        start = time.perf_counter()
        timed["verdict"] = verify.verify(r"\boxed{9^{9^{9^{9}}}}", "1")
        timed["seconds"] = time.perf_counter() - start
    thread = threading.Thread(target=tower)
    thread.start()
    thread.join()
    print(f"    from a thread: tower -> {timed['verdict']!s:5s} {timed['seconds'] * 1e3:8.1f} ms")
    start = time.perf_counter()
    verdict = verify.verify(r"\boxed{\tan^2 y + 1}", r"\sec^2 y", timeout=5e-3)
    print(f"    5 ms deadline: sympy -> {verdict!s:5s} "
          f"{(time.perf_counter() - start) * 1e3:8.1f} ms (the worker killed if it overran)")
    canary = os.path.exists("/tmp/verify_bench_canary")
    print(f"hostile inputs: {summary(hostile_seconds)}  canary written: {canary}")

    check = math_verify_check()
    if check is None:
        print("math-verify not installed: no comparison")
        return
    check(r"\boxed{x+1}", "1+x")
    mv_verdicts, mv_seconds = time_calls(check, cases)
    mv_correct = sum(v == c["expected"] for v, c in zip(mv_verdicts, cases))
    percent = 100 * mv_correct / len(cases)
    print(f"math-verify  accuracy {mv_correct}/{len(cases)} = {percent:.1f} %   "
          f"{summary(mv_seconds)}")
    ratio = statistics.median(seconds) / statistics.median(mv_seconds)
    print(f"median latency ratio verify.py / math-verify = {ratio:.2f}")


if __name__ == "__main__":
    main()
