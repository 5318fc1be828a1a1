"""Host memory and time of reading the paper's training file: a parquet file shaped as
DAPO-Math-17k's (each of --unique prompts repeated --repeats times, 1.8 M rows by default, with
its columns: data_source, prompt, ability, reward_model, extra_info) is written to a temporary
folder, then data.read_rows reads it in a fresh process, which prints its peak resident memory
(ru_maxrss), the time, the rows kept and the bytes rank 0 hands the other ranks (the pickle
rlep.main broadcasts).

    python benchmarks/bench_read_rows.py                    # this checkout's data.py
    python benchmarks/bench_read_rows.py --repo /tmp/old    # another checkout's (git worktree add)
"""
import argparse
import os
import subprocess
import sys
import tempfile
import uuid

repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
template = ("Solve the following math problem step by step. The last line of your response should "
            "be of the form Answer: $Answer (without quotes) where $Answer is the answer to the "
            "problem.\n\n{}\n\nRemember to put your answer on its own line after \"Answer:\".")

measure = """
import pickle, resource, sys, time
sys.path.insert(0, sys.argv[1])
try:
    from machinery import data
except ImportError:  # a checkout from before the machinery package
    import data
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
start = time.perf_counter()
rows = data.read_rows(sys.argv[2])
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"{len(rows)} rows kept in {seconds:.1f} s; peak resident memory {peak:,.0f} MiB "
      f"({before:,.0f} MiB after imports); handed to each other rank: "
      f"{len(pickle.dumps(rows)) / 2**20:.1f} MiB pickled")
"""


def write_file(path: str, unique: int, repeats: int):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = np.random.default_rng(0)
    words = "let x y be real numbers such that the sum of squares equals find value".split()
    rows = [{"data_source": "math_dapo", "ability": "MATH",
             "prompt": [{"content": template.format(" ".join(rng.choice(words, 60)) + f" #{i}"),
                         "role": "user"}],
             "reward_model": {"ground_truth": str(i), "style": "rule-lighteval/MATH_v2"},
             "extra_info": {"index": str(uuid.UUID(int=i))}} for i in range(unique)]
    table = pa.Table.from_pylist(rows)
    with pq.ParquetWriter(path, table.schema) as writer:
        for _ in range(repeats):
            writer.write_table(table)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--unique", type=int, default=17917, help="DAPO-Math-17k's prompts")
    parser.add_argument("--repeats", type=int, default=100, help="each prompt's rows")
    parser.add_argument("--repo", default=repo_root, help="the checkout whose data.py reads")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "dapo-math-17k.parquet")
        write_file(path, args.unique, args.repeats)
        print(f"{args.unique * args.repeats:,} rows ({args.unique:,} prompts x {args.repeats}), "
              f"{os.path.getsize(path) / 2**20:,.0f} MiB of parquet; read by {args.repo}")
        subprocess.run([sys.executable, "-c", measure, os.path.abspath(args.repo), path],
                       check=True)


if __name__ == "__main__":
    main()
