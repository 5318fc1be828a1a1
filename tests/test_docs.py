"""The guide's words stay true of the code: every flag the README and docs/ give a script is one
that script takes (rlep.py's: a Config field), every `module.name` they cite is defined in that
module, and every file they name exists. The study plans are records, left as committed (their
day's layout: docs/studies.md), so not read. Run: python -m pytest -q tests/test_docs.py"""
import ast
import functools
import glob
import os
import re

import pytest

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
guides = ["README.md"] + sorted(os.path.relpath(p, root)
                                for p in glob.glob(os.path.join(root, "docs", "*.md"))
                                if not os.path.basename(p).startswith("study-plan"))
# a file's name, not a module's attribute: `metrics.jsonl`, `rlep.lock`
extensions = {"json", "jsonl", "lock", "png", "txt", "pt", "safetensors", "parquet"}
modules = {os.path.splitext(os.path.basename(p))[0]: p for p in
           [os.path.join(root, name) for name in ("rlep.py", "verify.py", "eval.py")]
           + glob.glob(os.path.join(root, "machinery", "*.py"))}


@functools.cache
def read(path: str) -> str:
    with open(os.path.join(root, path), encoding="utf-8") as f:
        return f.read()


@functools.cache
def defined_names(path: str) -> set:
    """A module's top-level functions, classes and assignments, and its classes' own names."""
    names = set()
    for node in ast.parse(read(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}.{n}" for n in defined_class_names(node)}
    return names


def defined_class_names(node: ast.ClassDef) -> set:
    return {item.name if isinstance(item, ast.FunctionDef) else item.target.id
            for item in node.body if isinstance(item, ast.FunctionDef)
            or (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name))}


def script_flags(path: str) -> set:
    """The flags a script takes: rlep.py's are Config's fields (and --no-field); others' are the
    `"--flag"` strings of their argument parsers."""
    if os.path.basename(path) == "rlep.py":
        fields = {n.split(".", 1)[1] for n in defined_names(path) if n.startswith("Config.")}
        return fields | {f"no-{f}" for f in fields} | {"help"}
    return set(re.findall(r"""["']--([\w-]+)["']""", read(path))) | {"help"}


def commands(text: str):
    """(script, the rest of its command line) for each `python X.py ...` or `torchrun ... X.py ...`
    in a text, a command continued over `\\` lines read as one."""
    text = text.replace("\\\n", " ")
    for match in re.finditer(r"(?:python|torchrun)[^\n`|]*?\s([\w/.-]+\.py)([^\n`|]*)", text):
        yield match.group(1), match.group(2)


@pytest.mark.parametrize("guide", guides)
def test_each_command_s_flags_are_its_script_s(guide):
    wrong = []
    for script, rest in commands(read(guide)):
        path = os.path.join(root, script)
        if not os.path.isfile(path):
            wrong.append(f"{script}: no such script")
            continue
        flags = script_flags(script)
        # a study's or benchmark's own flags, then `--` and rlep.py's
        own, _, passed = rest.partition(" -- ")
        for words, takes in ((own, flags), (passed, script_flags("rlep.py"))):
            given = re.findall(r"(?<![\w-])--([a-z][\w-]*)", words)
            wrong += [f"{script} --{flag}" for flag in given if flag not in takes]
    assert not wrong, f"{guide}: {wrong}"


def wrong_citations(text: str) -> list:
    """The `module.name` spans whose module lacks the name, and the files named that are not."""
    wrong = []
    for span in re.findall(r"`([^`\n]+)`", text):
        for module, name in re.findall(r"(?<![\w./])([a-z_]+)\.([A-Za-z_]\w*(?:\.\w+)?)\b", span):
            if module in modules and name not in extensions | {"py", "md"} \
                    and name not in defined_names(modules[module]):
                wrong.append(f"{module}.{name}")
    folders = "docs|tests|tools|benchmarks|studies|machinery|notebook"
    paths = set(re.findall(rf"(?<![\w/.-])((?:{folders})/[\w/.-]+\.(?:py|md|ipynb|png))", text))
    wrong += [p for p in paths if not os.path.exists(os.path.join(root, p))
              and not os.path.exists(os.path.join(root, "docs", p))]
    return sorted(set(wrong))


@pytest.mark.parametrize("guide", guides)
def test_each_cited_name_and_file_exists(guide):
    wrong = wrong_citations(read(guide))
    assert not wrong, f"{guide}: {wrong}"


def test_the_checks_see_what_they_check():
    """The readers find what is there, and a name or flag that is not."""
    assert "ppo_update" in defined_names(modules["rlep"])
    assert {"lr", "no-share_prompts", "replay_m"} <= script_flags("rlep.py")
    assert "resample" not in script_flags("rlep.py")
    assert wrong_citations("`rlep.setup_distributed`, `ranks.setup_distributed`, `Config.n`, "
                           "`metrics.jsonl`, docs/nothing.md, docs/paper.md") == \
        ["docs/nothing.md", "rlep.setup_distributed"]
    assert list(commands("run `python rlep.py --preset tiny \\\n --lr 2e-6`")) == \
        [("rlep.py", " --preset tiny   --lr 2e-6")]
