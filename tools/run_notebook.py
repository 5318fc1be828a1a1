"""Runs notebook/rlep.ipynb top to bottom in a fresh kernel (nbclient, Jupyter's own executor) and
prints each code cell's seconds and the total: the notebook's compute, measured. With --write it
stores the outputs in the notebook, with the digest of what made them (the cells, rlep.py,
verify.py, machinery/), by which tests/test_notebook.py tells stale outputs.

Run (from the repository's root):
    python tools/run_notebook.py            # the benchmark: seconds per cell, the total
    python tools/run_notebook.py --write    # refresh the committed outputs"""
import argparse
import glob
import hashlib
import os
import sys
import time

import nbformat
from nbclient import NotebookClient

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
notebook_path = os.path.join(root, "notebook", "rlep.ipynb")
code_files = ["rlep.py", "verify.py"] + sorted(
    os.path.relpath(path, root) for path in glob.glob(os.path.join(root, "machinery", "*.py")))


def digest(nb) -> str:
    """What the outputs depend on: every cell's source and the code the notebook calls."""
    h = hashlib.sha256()
    for cell in nb.cells:
        h.update(f"{cell.cell_type}\0{cell.source}\0".encode())
    for name in code_files:
        with open(os.path.join(root, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()


def client(nb, timeout: int = 900) -> NotebookClient:
    """A client whose kernel starts in notebook/, as Jupyter's would."""
    return NotebookClient(nb, timeout=timeout, kernel_name="python3",
                          resources={"metadata": {"path": os.path.dirname(notebook_path)}})


def execute(nb) -> list[float]:
    """Runs every cell in a fresh kernel (an error raises nbclient's CellExecutionError, with the
    cell and its traceback); each code cell's seconds."""
    seconds = []
    runner = client(nb)
    with runner.setup_kernel():
        for index, cell in enumerate(nb.cells):
            start = time.perf_counter()
            runner.execute_cell(cell, index)
            if cell.cell_type == "code":
                seconds.append(time.perf_counter() - start)
                cell.metadata.pop("execution", None)  # timestamps: a diff at every refresh
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="store the outputs and the digest")
    args = parser.parse_args()
    nb = nbformat.read(notebook_path, as_version=4)
    started = time.perf_counter()
    seconds = execute(nb)
    total = time.perf_counter() - started
    for number, s in enumerate(seconds, start=1):
        print(f"code cell {number:2}: {s:6.1f} s")
    print(f"total: {total:.0f} s on {os.cpu_count()} cores ({sys.platform})")
    if args.write:
        nb.metadata["rlep"] = {"digest": digest(nb),
                               "refresh": "python tools/run_notebook.py --write"}
        nbformat.write(nb, notebook_path)
        print(f"wrote {os.path.relpath(notebook_path, root)}")


if __name__ == "__main__":
    main()
