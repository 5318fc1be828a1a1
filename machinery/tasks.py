"""The built-in tasks of the small presets, made here (nothing comes from a hub): single-digit
sums (tiny), 2-digit sums and 1-digit x 2-digit products after two worked examples (cpu), four
kinds of arithmetic (cpu-hard)."""

import numpy as np


def chat_rows(problems: dict, prefix: str) -> list[dict]:
    """Rows of the cpu presets' chat: an empty system turn (no default system prompt, 14 tokens
    less), two worked examples, the question. problems: {question: answer} or {question: (answer,
    kind)}, a kind becoming the row's data_source."""
    shots = []
    for question, answer in (("17 + 25", 42), ("6 * 13", 78)):
        shots.append({"role": "user", "content": f"What is {question}?"})
        reply = f"{question} = {answer}.\nAnswer: {answer}"
        shots.append({"role": "assistant", "content": reply})
    system = [{"role": "system", "content": ""}]
    rows = []
    for i, (question, answer) in enumerate(problems.items()):
        problem = f"What is {question}?"
        user = {"role": "user", "content": problem}
        row = {"id": f"{prefix}-{i}", "problem": problem, "prompt": system + shots + [user]}
        if isinstance(answer, tuple):
            answer, row["data_source"] = answer
        rows.append({**row, "answer": str(answer)})
    return rows


# arith-mix's kinds of problem, easiest first: (first operand, second operand) ranges
mix_kinds = {"sum-2d": ("+", (10, 100), (10, 100)), "product-1x2d": ("*", (2, 10), (11, 100)),
             "sum-3d": ("+", (100, 1000), (100, 1000)),
             "product-1x3d": ("*", (2, 10), (100, 1000))}


def builtin_rows(name: str) -> list[dict]:
    """`builtin:tiny:train|val`: the 110 single-digit sums and differences ("3+4").
    `builtin:arith:train|val`: 2-digit sums and 1-digit x 2-digit products, after two worked
    examples (SmolLM2-135M starts at about 20 %). `builtin:arith-mix:train|val`: 32 problems of
    each of mix_kinds, 16 to train and 16 to validate, the kind as data_source (the cpu-hard
    preset)."""
    _, task, split = (name.split(":") + [""])[:3]
    if task == "tiny":
        sums = [(f"{a}+{b}", a + b) for a in range(10) for b in range(10 - a)]
        differences = [(f"{a}-{b}", a - b) for a in range(10) for b in range(a + 1)]
        rows = [{"id": f"tiny-{p}", "problem": p, "answer": str(x)}
                for p, x in sums + differences]
        np.random.default_rng(0).shuffle(rows)
        splits = {"val": rows[:30], "train": rows[30:]}
    elif task == "arith":
        rng = np.random.default_rng(0)
        problems = {}
        while len(problems) < 128:
            if rng.random() < 0.5:
                a, b = rng.integers(10, 100), rng.integers(10, 100)
                problems[f"{a} + {b}"] = a + b
            else:
                a, b = rng.integers(2, 10), rng.integers(11, 100)
                problems[f"{a} * {b}"] = a * b
        rows = chat_rows(problems, "arith")
        splits = {"train": rows[:64], "val": rows[64:]}
    elif task == "arith-mix":
        rng = np.random.default_rng(0)
        splits = {"train": [], "val": []}
        for kind, (op, first, second) in mix_kinds.items():
            problems = {}
            while len(problems) < 32:
                a, b = int(rng.integers(*first)), int(rng.integers(*second))
                problems[f"{a} {op} {b}"] = (a + b if op == "+" else a * b, kind)
            rows = chat_rows(problems, f"mix-{kind}")
            splits["train"] += rows[:16]
            splits["val"] += rows[16:]
    if task not in ("tiny", "arith", "arith-mix") or split not in splits:
        raise ValueError(f"{name}: unknown built-in data; use builtin:tiny:train|val, "
                         "builtin:arith:train|val or builtin:arith-mix:train|val")
    return splits[split]
