"""notebook/rlep.ipynb, the guided path through rlep.py: it runs top to bottom in a fresh kernel,
its own asserts checking what it teaches; each Try cell holds with the setting it asks the reader
to try; it defines none of rlep.py's functions (no second copy of the method); its committed
outputs were made by the cells and code as they are (else: python tools/run_notebook.py --write).
Run: python -m pytest -q tests/test_notebook.py"""
import ast
import copy
import os
import re

import nbformat

from tools import run_notebook

nb = nbformat.read(run_notebook.notebook_path, as_version=4)
code_cells = [(i, cell) for i, cell in enumerate(nb.cells) if cell.cell_type == "code"]
try_cells = [(i, cell) for i, cell in code_cells if "try" in cell.metadata.get("tags", [])]
# a Try cell's setting: `name = value  # try: other value`
try_line = re.compile(r"^(\w+) = (.+?)  # try: (.+)$", re.M)


def test_the_notebook_defines_no_function_of_rlep_py():
    with open(os.path.join(run_notebook.root, "rlep.py")) as f:
        tree = ast.parse(f.read())
    method = {node.name for node in tree.body
              if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert {"policy_loss", "group_advantages", "build_group"} <= method  # what the check reads
    defined = {node.name for _, cell in code_cells for node in ast.walk(ast.parse(cell.source))
               if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert not defined & method, f"the notebook re-defines rlep.py's {sorted(defined & method)}"
    called = {node.attr for _, cell in code_cells for node in ast.walk(ast.parse(cell.source))
              if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "rlep"}
    # the method's steps, each called from rlep.py itself
    assert {"overlong_penalty", "group_advantages", "make_groups", "draw_replays", "build_group",
            "policy_loss", "ppo_update", "sample_and_grade", "verified_answers"} <= called


def test_the_notebook_reads_as_code_of_the_repository():
    lines = [(i, line) for i, cell in code_cells for line in cell.source.splitlines()]
    assert all(len(line) <= 100 for _, line in lines), "a code line over 100 columns"
    assert len(try_cells) >= 4
    for i, cell in try_cells:
        assert len(try_line.findall(cell.source)) == 1, f"cell {i}: one `x = a  # try: b` line"


def test_the_committed_outputs_are_the_code_s():
    assert all(cell.execution_count for _, cell in code_cells), \
        "a code cell never run: python tools/run_notebook.py --write"
    assert nb.metadata.get("rlep", {}).get("digest") == run_notebook.digest(nb), \
        "the outputs are stale against the cells or the code: python tools/run_notebook.py --write"
    errors = [i for i, cell in code_cells for out in cell.outputs if out.output_type == "error"]
    assert not errors, f"cells {errors} hold errors"


def stdout(cell) -> str:
    return "".join(out.get("text", "") for out in cell.outputs if out.get("name") == "stdout")


def test_the_notebook_runs_and_each_try_cell_holds_with_its_other_setting():
    """Top to bottom in a fresh kernel (a failed assert or any error fails it, naming the
    cell), then each Try cell again, in the same kernel, with the setting it offers: its asserts
    for that setting hold and what it prints changes."""
    fresh = copy.deepcopy(nb)
    runner = run_notebook.client(fresh)
    with runner.setup_kernel():
        for index, cell in enumerate(fresh.cells):
            runner.execute_cell(cell, index)
        for index, cell in try_cells:
            name, _, other = try_line.search(cell.source).groups()
            printed = stdout(fresh.cells[index])
            tried = copy.deepcopy(fresh.cells[index])
            tried.source = try_line.sub(f"{name} = {other}", cell.source)
            runner.execute_cell(tried, index)
            assert stdout(tried) != printed, f"cell {index}: {name} = {other} printed the same"
