"""Math answer checker: the RL reward in rlep.py and the metric in eval.py.

verify(response, gold) extracts the final answer, normalises both sides and decides equivalence: string match,
exact rational arithmetic on plain numbers, bracket-aware tuples/sets/intervals/matrices, and only then sympy, in
a persistent worker process that parses LaTeX with latex2sympy2_extended (never eval), refuses huge magnitudes
before any arithmetic and is killed when it overruns, so every call returns in bounded time, on any thread.
mode="dapo" is the paper's own rule (math_dapo). CLI: python verify.py 'so \\boxed{\\frac12}' '0.5'
"""
import atexit, cmath, json, math, os, random, re, select, subprocess, sys, threading, time, unicodedata
from fractions import Fraction

# ----------------------------------------------------------------------------- extraction

_TAIL_CHARS = 4000      # only the end of a response can hold its final answer
_MAX_ANSWER_CHARS = 1000
_MAX_DEPTH = 40         # bracket nesting; deeper answers are refused, not parsed
_BOX = re.compile(r"\\(?:boxed|fbox)\s*")
_MARKER = re.compile(r"(?i)(?:final\s+answer|answer)\s*(?:is\b\s*:?|:)\s*(?=\S)")
_SPAN = re.compile(r"\$\$(.{1,800}?)\$\$|\\\[(.{1,800}?)\\\]|\\\((.{1,800}?)\\\)|(?<!\\)\$((?:[^$\n]|\\\$){1,800}?)(?<!\\)\$",
                   re.S)
_NUMBER = re.compile(r"(?<![\w.\\])[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\s\d+/\d+|\d+/\d+|\d+(?:\.\d+)?|\.\d+)"
                     r"(?:\s?(?:\\?%|percent|pct))?(?!\d)")
_JOINER = re.compile(r"(?:[\s$,;.]|\\quad|\\qquad|\\[()\[\]]|\\text\{[^{}]{0,30}\})*"
                     r"(?:[^\n{}$]{0,12}?(?:,|\band\b|\bor\b)(?:[\s$]|\\quad|\\qquad|\\[()\[\]]|\})*)?")
_PROSE_WORD = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{3,}")
_HOPE = re.compile(r"(?i)\.?\s*I hope it is correct.*$", re.S)

def _group_end(s, start, opening="([{", closing=")]}"):
    """Index just past the bracket group that opens at s[start], or None if it never closes."""
    depth = 0
    for i in range(start, len(s)):
        depth += (s[i] in opening) - (s[i] in closing)
        if depth == 0:
            return i + 1
    return None

def _boxes(text):
    """(start, end, content) of each of the last 50 \\boxed{...}, \\fbox{...} and \\boxed 5, in order."""
    found = []
    for m in list(_BOX.finditer(text))[-50:]:
        if text.startswith("{", m.end()) and (end := _group_end(text, m.end(), "{", "}")):
            found.append((m.start(), end, text[m.end() + 1:end - 1]))
        elif word := re.match(r"\\boxed ([\w.]+)", text[m.start():m.start() + 40]):
            found.append((m.start(), m.start() + word.end(), word[1]))
    return found

def _spans(text):
    return [(m.start(), m.end(), next(g for g in m.groups() if g is not None)) for m in _SPAN.finditer(text)]

def _join_last(items, text):
    """The last item, joined with the items before it that are separated only by ',', 'and', 'or'."""
    first = len(items) - 1
    while first > 0 and len(gap := text[items[first - 1][1]:items[first][0]]) <= 40 and _JOINER.fullmatch(gap):
        first -= 1
    return ", ".join(content for _, _, content in items[first:]), items[-1][1]

def _is_prose(text):
    return bool(_PROSE_WORD.search(re.sub(r"\\(?:text|mathrm|textbf)\{[^{}]*\}|\\[a-zA-Z]+(?:\{[a-zA-Z*]*\})?", "", text)))

def _whole_or_number(text):
    text = text.strip().rstrip(".").strip()
    numbers = _NUMBER.findall(text) if _is_prose(text) else []
    return numbers[-1] if numbers else text or None

def _from_phrase(phrase):
    """The answer in the text after an 'answer is' / 'Answer:' marker."""
    phrase = _HOPE.sub("", phrase).strip()
    if boxes := _boxes(phrase):
        return _join_last(boxes, phrase)[0]
    spans = _spans(phrase)
    if " is " in (phrase[spans[-1][1]:] if spans else phrase):
        return _whole_or_number(phrase.rsplit(" is ", 1)[1])
    return _join_last(spans, phrase)[0] if spans else _whole_or_number(phrase)

def extract_answer(response):
    """Final answer of a response: the later of the last \\boxed{} and the last 'Answer:' / 'the answer is'
    line, else the last $...$ span (or a number in prose after it), else the whole text when it reads as
    math, else its last number. Reads only the text after </think>, and only its last 4000 characters."""
    if not isinstance(response, str):
        return None
    text = response.rsplit("</think>", 1)[-1][-_TAIL_CHARS:]
    boxes, markers = _boxes(text), list(_MARKER.finditer(text))
    if markers and markers[-1].end() > (_join_last(boxes, text)[1] if boxes else -1):
        answer = _from_phrase(text[markers[-1].end():].split("\n", 1)[0])
    elif boxes:
        answer = _join_last(boxes, text)[0]
    else:
        spans = _spans(text)
        after = text[spans[-1][1]:] if spans else ""
        numbers = _NUMBER.findall(after) if _is_prose(after) else []
        answer = numbers[-1] if numbers else _join_last(spans, text)[0] if spans else _whole_or_number(text)
    return answer.strip() if answer and answer.strip() and len(answer) <= _MAX_ANSWER_CHARS else None

def _gold_answer(gold):
    """Golds are bare answers, but MATH-style golds may be whole solutions with a \\boxed{}."""
    return extract_answer(gold) if "\\boxed" in gold or "\\fbox" in gold or len(gold) > 200 else gold

# ----------------------------------------------------------------------------- normalisation

_SYMBOLS = {"−": "-", "–": "-", "·": r"\cdot ", "⋅": r"\cdot ", "×": r"\times ", "÷": "/", "⁄": "/", "π": r"\pi ",
            "√": r"\sqrt", "∞": r"\infty ", "≤": r"\le ", "≥": r"\ge ", "≠": r"\ne ", "°": r"^\circ", "∪": r"\cup "}
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u200e\u200f\u202a\u202b\u202c\u202d\u202e"))
_REWRITES = [(re.compile(p), r) for p, r in [
    (r"(?<!\.)\.\s*$", ""), (r"\\\\(?=[a-zA-Z])(?!.*(?:matrix|array|cases))", r"\\"),   # doubled backslashes
    (r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)\s*(?=[\\()\[\]|.])", ""), (r"\\(?:left|right)\.", ""),
    (r"\\[dtc]frac", r"\\frac"), (r"\\displaystyle|\\mathrm\{th\}", ""),
    (r"\\(?:mbox|textnormal|textbf|textrm|textit|mathrm|mathbf)\{", r"\\text{"),
    (r"(\d)\\,(\d{3})", r"\1\2"), (r",\\!\s*", ","), (r"\{,\}", ","), (r"(?<!\\)\\!", ""),
    (r"(?<!\\)\\[,;: ]|\\q?quad|~", " "), (r"\^\s*\{?\\circ\}?|\\circ|\\degree", ""), (r"\\\$|\$", ""),
    (r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}"), (r"\\frac\s*(\d)\s*\{", r"\\frac{\1}{"),
    (r"\\frac\s*\{([^{}]*)\}\s*(\d)", r"\\frac{\1}{\2}"), (r"\\sqrt\s*(\d+)", r"\\sqrt{\1}"),
    (r"\s*(?:\\%|%|\\text\{\s*(?:percent|percentage|pct)\s*\}|\bpercent(?:age)?\b|\bpct\b)", "%"),
    (r"(?<=[\d}])\s*\\text\{\s*[a-zA-Z .]*\}(?:\^\{?\d\}?)?\s*$", ""),          # \text{ cm}^2 after a value
    (r"^([-+]?[\d.,/ ]*\d)\s*(?!(?:pi|and|or|mod)\b)[a-zA-Z]{2,}(?:\s+[a-zA-Z]{2,})*(?:\^\{?\d\}?)?$", r"\1"),
    (r"\s*,?\s*\\text\{\s*(?:and|or)\s*\}\s*|\s*,?\s*(?<![a-zA-Z])(?:and|or)(?![a-zA-Z])\s*", ", "), (r"\*\*", ""),
    (r"\\text\{([^{}]*)\}", r"\1"), (r"^\(([A-Z])\)$", r"\1"), (r"^\+?\\infty$|^\+\s*(?=\\infty)", r"\\infty"),
    (r"\\(?:le|leqslant)\b(?!ft)", r"\\leq"), (r"\\(?:ge|geqslant)\b", r"\\geq"), (r"\\(?:ne|neq)\b", r"\\neq"),
    (r"(?<!\.)\.\s*$|[,;]\s*$|\\$", ""), (r"^[a-zA-Z]\s*\\in\s*", ""), (r"[^\S\n]+", " ")]]

def normalize(answer):
    """String-level normalisation shared by both sides; the result is still LaTeX."""
    s = re.sub(r"[⁰¹²³⁴⁵⁶⁷⁸⁹]", lambda m: "^" + str(unicodedata.digit(m.group())), answer)
    s = "".join(_SYMBOLS.get(c, c) for c in unicodedata.normalize("NFKC", s).translate(_INVISIBLE))
    s = "".join(str(unicodedata.digit(c)) if c.isdigit() and not c.isascii() else c for c in s)
    for pattern, replacement in _REWRITES:
        s = pattern.sub(replacement, s)
    return s.strip()

# ----------------------------------------------------------------------------- numbers and structure

_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?")
_PLAIN = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)")
_MIXED = re.compile(r"([+-]?)(\d+)(?: (\d+)/(\d+)|\s*\\frac\{(\d+)\}\{(\d+)\})")
_FRAC = re.compile(r"([+-]?)(?:\\frac\{([^{}]+)\}\{([^{}]+)\}|([^/\s]+)/([^/\s]+))")
_SCI = re.compile(r"(.+?)\s*(?:\\times|\\cdot|\*)\s*10\^\{?([+-]?\d{1,4})\}?|([^e]+)e([+-]?\d{1,4})")

def _number(s):
    """(value, decimals) of a plain number, or None; decimals counts the written digits after the point
    (-1 for integers and exact fractions). Handles 1,000 / 1 000 / 4 4/9 / \\frac{a}{b} / 1e-3 / 5%."""
    if s.endswith("%"):
        parsed = _number(s[:-1].strip())
        return parsed and (parsed[0] / 100, parsed[1] + 2 if parsed[1] >= 0 else -1)
    s = re.sub(r"^([+-]) +", r"\1", s)
    s = s.replace(" ", "") if re.fullmatch(r"[+-]?\d{1,3}( \d{3})+(\.\d+)?", s) else s
    s = s.replace(",", "") if _THOUSANDS.fullmatch(s) and not s.lstrip("+-").startswith("0,") else s
    if len(s) > 400:
        return None
    if _PLAIN.fullmatch(s):
        return Fraction(s), (len(s.split(".")[1]) if "." in s else -1)
    sign = -1 if s.startswith("-") else 1
    if (m := _MIXED.fullmatch(s)) and 0 <= int(m[3] or m[5]) < int(m[4] or m[6]):
        return sign * (int(m[2]) + Fraction(int(m[3] or m[5]), int(m[4] or m[6]))), -1
    if (m := _FRAC.fullmatch(s)) and (top := _number(m[2] or m[4])) and (bottom := _number(m[3] or m[5])):
        return (sign * top[0] / bottom[0], -1) if bottom[0] and top[1] < 0 and bottom[1] < 0 else None
    if (m := _SCI.fullmatch(s)) and (mantissa := _number(m[1] or m[3])):
        exponent = int(m[2] or m[4])
        return mantissa[0] * Fraction(10) ** exponent, max(mantissa[1] - exponent, 0)
    return None

def _close(approx, decimals, exact):
    """A decimal with >= 2 written digits matches what it rounds, unless that terminates within them."""
    if approx == exact or decimals < 2 or (exact * 10 ** decimals).denominator == 1:
        return approx == exact
    return abs(approx - exact) <= Fraction(1, 2 * 10 ** decimals) * (1 + Fraction(1, 10 ** 9))

def _numbers_equal(pred, gold):
    (p, pd), (g, gd) = pred, gold
    if gd < 0 and g.denominator == 1:                           # integer gold (AIME): no tolerance
        return p == g
    if pd >= 0 and gd < 0:
        return _close(p, pd, g)
    return _close(g, gd, p) if gd >= 0 and (pd < 0 or pd > gd) else p == g

def _split_top(s, sep):
    """Split s on sep outside brackets; None when brackets nest deeper than _MAX_DEPTH."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        depth += (s[i] in "([{") - (s[i] in ")]}")
        if depth > _MAX_DEPTH:
            return None
        if depth == 0 and s.startswith(sep, i):
            parts.append(s[start:i])
            start = i = i + len(sep)
        else:
            i += 1
    return parts + [s[start:]]

def _set(items):
    """A set; a member written with \\pm counts as its two values."""
    return ("set", [y for x in items for y in (x[1] if x[0] == "set" else [x])])

def _structure(s):
    """('leaf', s) | ('matrix', rows) | ('union', parts) | ('tuple', brackets, items) | ('set', items)."""
    s = s.strip()
    if env := re.fullmatch(r"[(\[]?\\begin\{([pbvB]?matrix|array)\}(?:\{[lcr|]*\})?(.*)\\end\{\1\}[)\]]?", s, re.S):
        rows = [r for r in (_split_top(env[2], r"\\") or []) if r.strip()]
        return ("matrix", [[_structure(c) for c in _split_top(r, "&")] for r in rows])
    if _THOUSANDS.fullmatch(s):
        return ("leaf", s)
    if (unions := _split_top(s, r"\cup")) and len(unions) > 1:
        return ("union", [_structure(u) for u in unions])
    if s.startswith(r"\{") and s.endswith(r"\}"):
        return _set([_structure(x) for x in _split_top(s[2:-2], ",") or []])
    if len(s) > 1 and s[0] in "([{" and s[-1] in ")]}" and _group_end(s, 0) == len(s):
        items = [_structure(x) for x in _split_top(s[1:-1], "," if "," in s else ";") or []]
        if len(items) > 1:
            return _set(items) if s[0] == "{" else ("tuple", s[0] + s[-1], items)
        if s[0] == "(":
            return _structure(s[1:-1])
    items = _split_top(s, ";" if ";" in s and "," not in s else ",") or [s]
    if len(items) > 1:
        return _set([_structure(x) for x in items if x.strip()])
    if s.count(r"\pm") == 1:
        return ("set", [("leaf", s.replace(r"\pm", sign)) for sign in "+-"])
    return ("leaf", s)

_INEQUALITY = re.compile(r"(?:(.+?)\s*(<|\\leq|>|\\geq)\s*)?([a-zA-Z](?:\([a-z]\))?)\s*(<|\\leq|>|\\geq)\s*(.+)")

def _as_interval(leaf):
    """'a < x \\leq b' or 'x > a' as an interval structure, or None."""
    if not (m := _INEQUALITY.fullmatch(leaf.replace("<=", r"\leq").replace(">=", r"\geq"))):
        return None
    lo, op1, _, op2, hi = m.groups()
    flip = {">": "<", r"\geq": r"\leq", "<": "<", r"\leq": r"\leq"}
    if lo is None:
        lo, op1, op2, hi = (r"-\infty", "<", op2, hi) if op2 in flip.values() else (hi, flip[op2], "<", r"\infty")
    elif op1 not in flip.values():
        lo, hi, op1, op2 = hi, lo, flip[op2], flip[op1]
    brackets = ("[" if op1 == r"\leq" else "(") + ("]" if op2 == r"\leq" else ")")
    return ("tuple", brackets, [("leaf", lo.strip()), ("leaf", hi.strip())])

def _match(preds, golds, equal):
    """Unordered one-to-one matching of two lists under equal()."""
    left = list(golds)
    for p in preds:
        if (hit := next((i for i, g in enumerate(left) if equal(p, g)), None)) is None:
            return False
        left.pop(hit)
    return not left

def _compare(p, g, leaf_equal):
    kinds, equal = (p[0], g[0]), (lambda a, b: _compare(a, b, leaf_equal))
    if kinds == ("leaf", "leaf"):
        return leaf_equal(p[1], g[1])
    if kinds == ("matrix", "matrix"):
        return [len(r) for r in p[1]] == [len(r) for r in g[1]] and all(
            equal(a, b) for pr, gr in zip(p[1], g[1]) for a, b in zip(pr, gr))
    if kinds in (("union", "union"), ("tuple", "tuple")):
        return p[1:-1] == g[1:-1] and len(p[-1]) == len(g[-1]) and all(map(equal, p[-1], g[-1]))
    if kinds == ("set", "set"):                                  # unordered, duplicates collapsed
        unique = lambda items: list({repr(x).replace(" ", ""): x for x in items}.values())
        return _match(unique(p[1]), unique(g[1]), equal)
    if "tuple" in kinds and "set" in kinds:                      # a set written as a tuple keeps its order
        return len(p[-1]) == len(g[-1]) and all(map(equal, p[-1], g[-1]))
    if kinds == ("leaf", "tuple") and (interval := _as_interval(p[1])):
        return equal(interval, g)
    if kinds == ("tuple", "leaf") and (interval := _as_interval(g[1])):
        return equal(p, interval)
    return False

_NAME = re.compile(r"(?:[a-zA-Z_{}()|:',^\s\d]|\\frac|\\text|\\overline|\\angle)*[a-zA-Z](?:[a-zA-Z_{}()|:',^\s\d]|\\frac|\\text)*")

def _rhs(s):
    """'x = 5' -> '5', 'f(x) = 2x+3' -> '2x+3', 'a = b = c' -> 'c', 'x \\approx 1.4' -> '1.4'; equations stay."""
    parts = [x.strip() for x in re.split(r"(?<![<>!\\])=", s)]
    if len(parts) > 2 or len(parts) == 2 and (_NAME.fullmatch(parts[0]) and not re.fullmatch(r"[\d\s]+", parts[0])
                                              or _number(parts[0]) and _number(parts[1])):
        s = parts[-1]
    if r"\approx" in s:
        before, after = s.split(r"\approx", 1)
        s = after if _NAME.fullmatch(before.strip()) else before
    return s.strip()

def _leaf_equal(pred, gold, symbolic):
    if ("=" in _rhs(pred)) == ("=" in _rhs(gold)):          # keep both sides when only one is an equation
        pred, gold = _rhs(pred), _rhs(gold)
    if pred.replace(" ", "") == gold.replace(" ", ""):
        return True
    if (p := _number(pred)) and (g := _number(gold)):        # a gold's % may also be dropped: 28% ~ 28
        return _numbers_equal(p, g) or gold.endswith("%") and not pred.endswith("%") and _numbers_equal(p, (g[0] * 100, -1))
    if not pred or not gold or ":" in pred + gold or re.fullmatch(r"[A-Z]", gold) or re.fullmatch(r"[A-Z]", pred):
        return False
    if re.search(r"\\(?:i*int|oint|sum|prod|lim)(?![a-z])", pred + gold):   # the size guard refuses these anyway
        return False
    return symbolic(pred, gold)

def _equivalent(pred, gold, symbolic):
    pred, gold = normalize(pred), normalize(gold)
    if pred == gold:
        return True
    if _split_top(pred, "\0") is None or _split_top(gold, "\0") is None:   # nested deeper than _MAX_DEPTH
        return False
    if re.fullmatch(r"[A-E]", gold) and (re.match(r"\(?[A-E]\)?(?:[.:)]\s|$)", pred) or _is_prose(pred)):
        letter = re.search(r"(?<![A-Za-z\\])[A-E](?![A-Za-z])", pred)    # multiple choice: first letter
        return bool(letter) and letter.group() == gold
    for a, b in ((pred, gold), (gold, pred)):
        if re.fullmatch(r"[+-]?\d+,\d+", a) and re.fullmatch(r"[+-]?\d*\.\d+", b):
            pred, gold = pred.replace(",", "."), gold.replace(",", ".")    # decimal comma: 2,74
    lhs = [x.split("=")[0].strip() if x.count("=") == 1 else None for x in (pred, gold)]
    if lhs[0] and (lhs[0] == lhs[1] or not lhs[1] and "=" not in gold):    # 'D = (0, 1)' vs 'D = ...' or '(0, 1)'
        pred = _rhs(pred)
    if lhs[1] and (lhs[0] == lhs[1] or not lhs[0] and "=" not in pred):
        gold = _rhs(gold)
    return _compare(_structure(pred), _structure(gold), lambda a, b: _leaf_equal(a, b, symbolic))

# ----------------------------------------------------------------------------- sympy stage (worker process)

_MAX_DIGITS = 100_000   # refuse any sub-expression whose value could need more digits than this
_COMPLEX = re.compile(r"(?<![a-zA-Z\\])i(?![a-zA-Z])")
# ANTLR's Python runtime fills its prediction caches lazily: the first parse of each construct costs
# 20-200 ms, later ones about 1 ms. Parsing typical answers once at start-up moves that cost out of calls.
_WARMUP = r"""\frac{\sqrt{3}}{2} + 2\sqrt{2} - \pi;3x^{2} - 4xy + 1;(t-1)(t+2)^{3};\frac{a_{1}}{b_{2}} \cdot c;4 \sin b \cos a
\sin^2 x + \cos(2\theta) - \tan^{2}(y) + \sec x + \cot x;\log_{2} 8 - \ln(e^{x}) + e^{-t};7! + \binom{6}{3};|x - 1| \leq 3
-x > -1;p \geq 2;2a + 3b - 4c = 0;y = -\frac{1}{2}x + 5;\frac{u^2}{9} + \frac{v^2}{4} = 1;[0, 1) \cup (2, \infty);\{1, 2\}
(1, -2, \frac{3}{4});\begin{pmatrix} 1 & x \\ \sqrt{2} & 4 \end{pmatrix};15\%;1.5 \times 10^{-3};3 + 4i;101_{2};m n p
\frac{2}{5y^{3/4}} + \sqrt[3]{t^2 + 1}^2;(s + 1)^{5/2} - q^{0.5};2 \cdot 3^{5} \cdot 7^2;x * 2 + (-3)*x^2
\frac{\pi r}{h + r};\frac{w_{0}}{(1 + w/w_{0})^{2}};7k^{3}(2+5k^{2});12m^5(3m^4-1);(q-2)(q+3)(2q+1);2^4 3^2 5
\cos^2(t) - 1;\cot(u)+\csc u;g(t);h(s) + 1;QRS2T;\text{yes};y^{5}+3 y^{2}-7 y+1;(2, 0.25);(a, b];-\frac{3t^2}{4(t^2+1)^{3/2}}
\frac{p_{1}}{q_{1}} \cdot \left(\frac{q_0}{p + q_0}\right)^{1/3};\sqrt[4]{y}^{3};\frac{2}{7\sqrt[3]{s}^2}""".replace("\n", ";").split(";")

class _Unsafe(Exception):
    pass

def _log10_bound(e, budget):
    """Upper bound on log10|value| of every numeric sub-tree of e, found without evaluating e."""
    import sympy
    budget[0] -= 1
    if budget[0] < 0 or isinstance(e, (sympy.Sum, sympy.Product, sympy.Integral, sympy.Limit, sympy.Derivative)):
        raise _Unsafe("too large or unbounded")
    if isinstance(e, sympy.Rational):
        return max(e.p.bit_length(), e.q.bit_length()) * 0.302 + 1
    args = list(e) if isinstance(e, sympy.MatrixBase) else [a for a in e.args if isinstance(a, sympy.Basic)]
    sizes = [_log10_bound(a, budget) for a in args] or [1.0]
    if isinstance(e, sympy.Pow):              # |exponent| <= 10^size; small constant exponents are evaluated
        small = sizes[1] < 15 and not e.args[1].free_symbols
        size = sizes[0] * max(abs(complex(sympy.N(e.args[1], 15))) if small else 10 ** min(sizes[1], 400), 1)
    elif isinstance(e, (sympy.factorial, sympy.binomial, sympy.gamma, sympy.exp)):
        n = 10 ** min(max(sizes), 400)
        size = n * max(math.log10(n), 1)
    else:
        size = sum(sizes) if isinstance(e, sympy.Mul) else max(sizes) + 0.31
    if size > _MAX_DIGITS:
        raise _Unsafe("magnitude")
    return size

def _sympy_parser():
    """latex2sympy2_extended with no path from text to sympify/parse_expr: numbers are built with int() and
    Fraction(), and sympy's text parser is replaced, in the worker, by a function that raises."""
    import sympy
    import sympy.parsing.sympy_parser
    from latex2sympy2_extended import latex2sympy2
    from latex2sympy2_extended.math_normalization import NormalizationConfig, normalize_latex

    def refuse(*args, **kwargs):
        raise _Unsafe("text reached sympy's parser")
    sympy.parsing.sympy_parser.parse_expr = refuse

    def number(text):
        text = text.replace(",", "").replace(" ", "")
        return sympy.Integer(int(text)) if text.isdigit() else sympy.Rational(Fraction(text))
    latex2sympy2.convert_number = number
    converter = type("Converter", (latex2sympy2._Latex2Sympy,), {"parse_number": lambda self, text: number(text)})
    # units=False: its unit list also strips trailing letters ("a + b + c" loses its c); normalize() does units
    config = NormalizationConfig(basic_latex=True, units=False, malformed_operators=True, nits=True, boxed="none")

    def parse(text):
        is_complex = bool(_COMPLEX.search(text))
        expr = converter(is_real=None if is_complex else True).parse(normalize_latex(text, config))
        _log10_bound(expr, [2000])
        return expr.subs({s: sympy.I for s in expr.free_symbols if s.name == "i"}) if is_complex else expr
    return parse

def _at_points(expr, symbols):
    """expr at three fixed pseudo-random points, as complex numbers."""
    import sympy
    rng = random.Random(0)
    return [complex(sympy.N(expr, 20, subs={s: rng.uniform(0.5, 2.5) for s in symbols})) for _ in range(3)]

def _expr_equal(a, b, decimals):
    import sympy
    if a == b:
        return True
    if not isinstance(a, sympy.Expr) or not isinstance(b, sympy.Expr):
        return False
    if not a.free_symbols and decimals >= 2:                 # a rounded decimal against an exact value
        va, vb = (Fraction(str(sympy.N(x, 40))) for x in (a, b))
        return _close(va, decimals, vb) or _close(vb, decimals, va)
    symbols = sorted(a.free_symbols | b.free_symbols, key=str)
    values = list(zip(_at_points(a, symbols), _at_points(b, symbols)))
    if all(cmath.isfinite(va) and cmath.isfinite(vb) for va, vb in values):
        return all(abs(va - vb) <= 1e-9 * max(1.0, abs(va), abs(vb)) for va, vb in values)
    return sympy.simplify(a - b) == 0

def _relation_equal(a, b):
    """Equations match when their lhs - rhs are proportional; inequalities when positively so."""
    import sympy
    def key(r):                                              # (expression, kind) read as: expression (>|>=|=|!=) 0
        strict = isinstance(r, (sympy.StrictLessThan, sympy.StrictGreaterThan))
        if isinstance(r, (sympy.StrictLessThan, sympy.LessThan)):
            return r.rhs - r.lhs, strict
        return r.lhs - r.rhs, strict if isinstance(r, (sympy.StrictGreaterThan, sympy.GreaterThan)) else type(r).__name__
    (ea, ka), (eb, kb) = key(a), key(b)
    symbols = sorted(ea.free_symbols, key=str)
    if ka != kb or ea.free_symbols != eb.free_symbols or not symbols:
        return False
    ratios = _at_points(ea / eb, symbols)
    same = all(abs(r - ratios[0]) <= 1e-9 * abs(ratios[0]) for r in ratios) and abs(ratios[0]) > 1e-12
    return same and (isinstance(ka, str) or ratios[0].real > 0)

def _sym_equal(a, b, decimals):
    import sympy
    if isinstance(a, sympy.Rel) and isinstance(b, sympy.Rel):
        return _relation_equal(a, b)
    if isinstance(a, (sympy.MatrixBase, sympy.Tuple)) or isinstance(b, (sympy.MatrixBase, sympy.Tuple)):
        return type(a) is type(b) and getattr(a, "shape", len(a)) == getattr(b, "shape", len(b)) and all(
            _sym_equal(x, y, decimals) for x, y in zip(a, b))
    if isinstance(a, sympy.FiniteSet) and isinstance(b, sympy.FiniteSet):
        return _match(list(a.args), list(b.args), lambda x, y: _sym_equal(x, y, decimals))
    if isinstance(a, sympy.Set) or isinstance(b, sympy.Set):
        return a == b
    return _expr_equal(a, b, decimals)

def _worker_main():
    """Answer JSON lines [pred, gold] with true/false, one at a time, until stdin closes."""
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    parse = _sympy_parser()
    for text in _WARMUP:
        parse(text)
    print("ready", flush=True)
    for line in sys.stdin:
        try:
            pred, gold = json.loads(line)
            decimals = min((len(d) for d in re.findall(r"\.(\d+)", pred + " " + gold)), default=-1)
            result = bool(_sym_equal(parse(pred), parse(gold), decimals))
        except (Exception, RecursionError, MemoryError):
            result = False
        print(json.dumps(result), flush=True)

class _SympyWorker:
    """A persistent `python verify.py --worker` process: a fresh interpreter (no fork, and not the caller's
    __main__), so it never imports torch or vLLM. A spare warms up in the background and takes over at
    once when the active one overruns its deadline and is killed."""

    def __init__(self):
        self.lock, self.proc, self.spare = threading.Lock(), None, None

    def _spawn(self):
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))
        proc.ready = False
        return proc

    def _readline(self, timeout):
        ready = timeout > 0 and select.select([self.proc.stdout], [], [], timeout)[0]
        return self.proc.stdout.readline() if ready else None

    def ask(self, pred, gold, deadline, startup_timeout=60.0):
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self.proc, self.spare = self.spare or self._spawn(), None
            if self.spare is None or self.spare.poll() is not None:
                self.spare = self._spawn()
            if not self.proc.ready:                              # start-up is not charged to the call
                self.proc.ready = self._readline(startup_timeout) == b"ready\n"
                deadline = max(deadline, time.monotonic() + 0.5)
            answer = None
            if self.proc.ready:
                self.proc.stdin.write(json.dumps([pred, gold]).encode() + b"\n")
                self.proc.stdin.flush()
                answer = self._readline(deadline - time.monotonic())
            if answer is None:                                   # overran: kill it, the spare takes over
                self.proc.kill()
                self.proc.wait()
                self.proc = None
            return answer == b"true\n"

    def close(self):
        for proc in (self.proc, self.spare):
            if proc is not None:
                proc.kill()
                proc.wait()
        self.proc = self.spare = None


_WORKER = _SympyWorker()
atexit.register(_WORKER.close)

# ----------------------------------------------------------------------------- DAPO rule (verl math_dapo)

# From verl/utils/reward_score/math_dapo.py (Apache-2.0), kept as is so scores compare with RLEP's tables.
_DAPO_SUBSTITUTIONS = [("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""), ("mbox", "text"),
                       (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}")]
_DAPO_REMOVED = ["square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
                 "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
                 "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
                 "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;",
                 r",\!", "{,}", '"', "\\dots"]

def _dapo_normalize(answer):
    answer = answer.split("=")[-1]
    for before, after in _DAPO_SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for expression in _DAPO_REMOVED:
        answer = answer.replace(expression, "")
    answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", answer)
    for command in ("text", "textbf", "overline"):
        answer = re.sub(r"(\\" + command + r"\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", answer)
    answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", answer)
    answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", answer).replace("$", "")
    return (answer.replace(",", "") if answer.replace(",", "").isdigit() else answer).strip()

def dapo_correct(response, gold):
    """math_dapo.compute_score: last 300 chars, last 'Answer:' line, Minerva normalisation, exact match."""
    matches = re.findall(r"(?i)Answer\s*:\s*([^\n]+)", response[-300:])
    return _dapo_normalize(matches[-1] if matches else "[INVALID]") == _dapo_normalize(gold)

# ----------------------------------------------------------------------------- public API

def verify(response, gold, mode="default", timeout=1.0):
    """True iff the response's final answer equals gold; never raises (bad or hostile input gives False).
    mode="dapo" applies the paper's exact-match rule instead. timeout (s) bounds the sympy stage."""
    try:
        if not isinstance(response, str) or not isinstance(gold, str):
            return False
        if mode == "dapo":
            return dapo_correct(response, gold)
        deadline = time.monotonic() + timeout
        gold_answer, pred = _gold_answer(gold), extract_answer(response)
        return bool(gold_answer and pred) and _equivalent(pred, gold_answer, lambda p, g: _WORKER.ask(p, g, deadline))
    except (Exception, RecursionError):
        return False

def verify_many(responses, golds, mode="default", timeout=1.0):
    """verify() over pairs. Most answers are decided without sympy in tens of microseconds, so a plain
    loop is the batch API; the few that need sympy go through the one worker in turn."""
    return [verify(r, g, mode=mode, timeout=timeout) for r, g in zip(responses, golds)]

if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        _worker_main()
    elif len(sys.argv) == 3:
        print("extracted:", extract_answer(sys.argv[1]))
        print("correct:", verify(sys.argv[1], sys.argv[2]))
        print("dapo rule:", verify(sys.argv[1], sys.argv[2], mode="dapo"))
    else:
        sys.exit("usage: python verify.py RESPONSE GOLD")
