"""The reading budgets: rlep.py stays a reference a reader finishes in one sitting, and
README.md a guide read in ten minutes (the rest is in docs/). Lines per file, columns per
line, and rlep.py's mean line length (nanoGPT's train.py: 47 characters, nanochat's
chat_rl.py: 56).
Run: python -m pytest -q tests/test_budgets.py"""
import glob
import os

import pytest

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
max_lines = {"rlep.py": 1200, "verify.py": 560, "eval.py": 360, "README.md": 350}
narrow_files = ["rlep.py", "verify.py", "eval.py", "data.py", "builtin.py", "checks.py"] + sorted(
    os.path.relpath(path, root) for path in glob.glob(os.path.join(root, "tests", "*.py")))


def read_lines(name):
    with open(os.path.join(root, name), encoding="utf-8") as f:
        return f.read().splitlines()


@pytest.mark.parametrize("name", sorted(max_lines))
def test_files_stay_within_their_line_budget(name):
    assert len(read_lines(name)) <= max_lines[name]


@pytest.mark.parametrize("name", narrow_files)
def test_no_line_is_wider_than_100_columns(name):
    wide = [i for i, line in enumerate(read_lines(name), start=1) if len(line) > 100]
    assert wide == [], f"{name}: lines over 100 columns: {wide[:10]}"


def test_rlep_lines_average_at_most_58_characters():
    lines = [line for line in read_lines("rlep.py") if line.strip()]
    assert sum(map(len, lines)) / len(lines) <= 58
