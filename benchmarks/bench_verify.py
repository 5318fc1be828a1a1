"""Benchmark verify.py on the labelled peer cases and on hostile inputs.

    python benchmarks/bench_verify.py [--cases PATH] [--misses] [--slowest N] [--verdicts OUT.json]

Prints accuracy on the unambiguous cases (overall and per source), latency (median, p99, max) over
every labelled case (ambiguous ones included) with the slowest of them, latency on hostile inputs
(tests/test_verify.py asserts their verdicts, not their times), a call from a thread and one with
a 5 ms deadline, and, when math-verify is installed, its accuracy and latency on the same cases
for comparison. --verdicts writes every case's verdict, to check that a change to verify.py
changes none. The cases, with their sources and licenses, are tests/data/verifier_peer_cases.jsonl
(see tests/data/README.md).
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
        return [json.loads(line) for line in f if line.strip()]


def source_name(case):
    """The repository a case comes from; issue reports ('issue:owner/repo#N') by repository."""
    source = case["source"]
    if source.startswith("issue:"):
        return source[len("issue:"):].split("#")[0] + " (issue reports)"
    return source.split(":")[0].split("#")[0]


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
    default_cases = os.path.join(repo_root, "tests", "data", "verifier_peer_cases.jsonl")
    parser.add_argument("--cases", default=default_cases)
    parser.add_argument("--misses", action="store_true",
                        help="print the cases decided against the label")
    parser.add_argument("--slowest", type=int, default=5, help="print the N slowest cases")
    parser.add_argument("--verdicts", help="write {case id: verdict} of every case to this file")
    args = parser.parse_args()
    every_case = load_cases(args.cases)

    # start the sympy worker outside the timing, and let its spare finish warming up
    verify.verify(r"\boxed{x+1}", "1+x")
    select.select([verify._workers[1].stdout], [], [], 60)
    every_verdict, every_second = time_calls(verify.verify, every_case)
    if args.verdicts:
        with open(args.verdicts, "w") as f:
            json.dump({c["id"]: v for c, v in zip(every_case, every_verdict)}, f, indent=0)
    print(f"verify.py    latency over all {len(every_case)} cases: {summary(every_second)}")
    slowest = sorted(zip(every_second, every_case), key=lambda pair: -pair[0])[:args.slowest]
    for second, case in slowest:
        print(f"    slow {case['id']} {second * 1e3:6.1f} ms  gold={case['gold'][-40:]!r} "
              f"pred={case['pred'][-60:]!r}")
    unambiguous = [i for i, case in enumerate(every_case) if not case.get("ambiguous")]
    cases = [every_case[i] for i in unambiguous]
    verdicts = [every_verdict[i] for i in unambiguous]
    seconds = [every_second[i] for i in unambiguous]
    by_source = defaultdict(lambda: [0, 0])
    for case, verdict in zip(cases, verdicts):
        source = source_name(case)
        by_source[source][0] += verdict == case["expected"]
        by_source[source][1] += 1
        if args.misses and verdict != case["expected"]:
            print(f"MISS {case['id']} expected={case['expected']} gold={case['gold'][-80:]!r} "
                  f"pred={case['pred'][-120:]!r} extracted={verify.extract_answer(case['pred'])!r}")
    correct = sum(v == c["expected"] for v, c in zip(verdicts, cases))
    percent = 100 * correct / len(cases)
    print(f"verify.py    accuracy {correct}/{len(cases)} = {percent:.1f} %   {summary(seconds)}")
    for source, (right, total) in sorted(by_source.items(), key=lambda kv: -kv[1][1]):
        print(f"    {source:48s} {right:3d}/{total:3d} = {100 * right / total:5.1f} %")

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
