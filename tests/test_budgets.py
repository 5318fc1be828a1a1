"""The reading budgets: rlep.py stays a reference a reader finishes in one sitting, the modules
beside it stay short, and README.md is a guide read in ten minutes (the rest is in docs/). Lines
per file, columns per line, rlep.py's mean line length (nanoGPT's train.py: 47 characters,
nanochat's chat_rl.py: 56), README's words and the width of its prose.
Run: python -m pytest -q tests/test_budgets.py"""
import glob
import os

import pytest

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
max_lines = {"rlep.py": 900, "machinery.py": 600, "data.py": 600, "verify.py": 560,
             "eval.py": 360}
python_files = sorted(os.path.relpath(path, root) for folder in (root, os.path.join(root, "tests"))
                      for path in glob.glob(os.path.join(folder, "*.py")))


def read_lines(name):
    with open(os.path.join(root, name), encoding="utf-8") as f:
        return f.read().splitlines()


def prose_lines(name):
    """A markdown file's lines outside code blocks and tables: what a reader reads as text."""
    inside_code = False
    for number, line in enumerate(read_lines(name), start=1):
        if line.lstrip().startswith("```"):
            inside_code = not inside_code
        elif not inside_code and not line.lstrip().startswith("|"):
            yield number, line


@pytest.mark.parametrize("name", sorted(max_lines))
def test_files_stay_within_their_line_budget(name):
    assert len(read_lines(name)) <= max_lines[name]


@pytest.mark.parametrize("name", python_files)
def test_no_line_is_wider_than_100_columns(name):
    wide = [i for i, line in enumerate(read_lines(name), start=1) if len(line) > 100]
    assert wide == [], f"{name}: lines over 100 columns: {wide[:10]}"


def test_rlep_lines_average_at_most_58_characters():
    lines = [line for line in read_lines("rlep.py") if line.strip()]
    assert sum(map(len, lines)) / len(lines) <= 58


def test_the_readme_is_a_ten_minute_guide():
    words = sum(len(line.split()) for line in read_lines("README.md"))
    wide = [number for number, line in prose_lines("README.md") if len(line) > 120]
    assert words <= 2500 and wide == [], f"README.md: {words} words; wide prose lines {wide[:10]}"
