"""Math answer checker: the RL reward in rlep.py and the metric in eval.py.

verify(response, gold) extracts the final answer, normalises both sides and decides equivalence:
string match, exact rational arithmetic on plain numbers, bracket-aware tuples, sets, intervals and
matrices, then sympy, in a persistent worker that parses LaTeX with latex2sympy2_extended (never
eval), refuses huge magnitudes before any arithmetic and is killed at its deadline (any thread).
mode="dapo" is the paper's rule (math_dapo). CLI: python verify.py '\\boxed{\\frac12}' '0.5'"""
import atexit
import cmath
import functools
import gc
import itertools
import json
import math
import os
import random
import re
import select
import subprocess
import sys
import threading
import time
import unicodedata
from collections import namedtuple
from fractions import Fraction

# -------------------------------------------------------------------------------- extraction
_TAIL_CHARS = 4000      # only the end of a response can hold its final answer
_MAX_ANSWER_CHARS = 1000
_MAX_DEPTH = 40         # bracket nesting; deeper answers are refused, not parsed
_MAX_GAP = 40           # characters between two spans of one answer, or before a '\boxed 5' word
_BOX = re.compile(r"\\(?:boxed|fbox)\s*")              # '\boxed{7}', '\fbox {7}'
_BOXED_WORD = re.compile(r"\\boxed ([\w.]+)")          # '\boxed 5', no braces
_MARKER = re.compile(r"(?i)(?:final\s+answer|answer)\s*(?:is\b\s*:?|:)\s*(?=\S)")  # 'Answer: 7'
_SPAN = re.compile(r"\$\$(.{1,800}?)\$\$|\\\[(.{1,800}?)\\\]|\\\((.{1,800}?)\\\)"
                   r"|(?<!\\)\$((?:[^$\n]|\\\$){1,800}?)(?<!\\)\$", re.S)  # '$x$', '\[x\]'
_NUMBER = re.compile(r"(?<![\w.\\])[-+]?"
                     r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\s\d+/\d+|\d+/\d+|\d+(?:\.\d+)?|\.\d+)"
                     r"(?:\s?(?:\\?%|percent|pct))?(?!\d)")    # '-7', '1,000', '4 4/9', '28%'
_JOINER = re.compile(r"(?:[\s$,;.]|\\quad|\\qquad|\\[()\[\]]|\\text\{[^{}]{0,30}\})*"
                     r"(?:[^\n{}$]{0,12}?(?:,|\band\b|\bor\b)"
                     r"(?:[\s$]|\\quad|\\qquad|\\[()\[\]]|\})*)?")  # ', ', '$ and $', '\quad or '
_PROSE_WORD = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{3,}")   # 'the', 'area'; not '\frac'
# markup, not prose: '\text{cm}', '\mathrm{kg}', '\frac', '\begin{pmatrix}'
_MARKUP = re.compile(r"\\(?:text|mathrm|textbf)\{[^{}]*\}|\\[a-zA-Z]+(?:\{[a-zA-Z*]*\})?")
_HOPE = re.compile(r"(?i)\.?\s*I hope it is correct.*$", re.S)   # MATH's '5. I hope it is correct.'
_Span = namedtuple("_Span", "start end content")    # where a \boxed{} or $...$ is, what it holds

def _group_end(s, start, opening="([{", closing=")]}"):
    """Index just past the bracket group that opens at s[start], or None if it never closes."""
    depths = itertools.accumulate((c in opening) - (c in closing) for c in s[start:])
    return next((start + i + 1 for i, depth in enumerate(depths) if depth == 0), None)

def _boxes(text):
    """Spans of the last 50 \\boxed{...}, \\fbox{...} and \\boxed 5, in order."""
    found = []
    for m in list(_BOX.finditer(text))[-50:]:
        end = _group_end(text, m.end(), "{", "}") if text.startswith("{", m.end()) else None
        word = None if end else _BOXED_WORD.match(text[m.start():m.start() + _MAX_GAP])
        if end:
            found.append(_Span(m.start(), end, text[m.end() + 1:end - 1]))
        elif word:
            found.append(_Span(m.start(), m.start() + word.end(), word[1]))
    return found

def _join_last(spans, text):
    """The last span's content, with the spans before it that only ',', 'and' or 'or' separate."""
    gaps = [text[a.end:b.start] for a, b in zip(spans, spans[1:])]
    first = len(spans) - 1
    while first > 0 and len(gaps[first - 1]) <= _MAX_GAP and _JOINER.fullmatch(gaps[first - 1]):
        first -= 1
    return ", ".join(span.content for span in spans[first:])

def _is_prose(text):
    return bool(_PROSE_WORD.search(_MARKUP.sub("", text)))

def _whole_or_number(text):
    text = text.strip().rstrip(".").strip()
    numbers = _NUMBER.findall(text) if _is_prose(text) else []
    return numbers[-1] if numbers else text

def _last_answer(text, after_marker):
    """The last boxes; else the last $...$ spans or what follows them; else the whole text."""
    boxes = _boxes(text)
    if boxes:
        return _join_last(boxes, text)
    spans = [_Span(m.start(), m.end(), m[m.lastindex]) for m in _SPAN.finditer(text)]
    after = text[spans[-1].end:] if spans else text
    if after_marker and " is " in after:
        return _whole_or_number(after.rsplit(" is ", 1)[1])
    if not spans:
        return _whole_or_number(text)
    numbers = _NUMBER.findall(after) if _is_prose(after) else []
    return numbers[-1] if numbers else _join_last(spans, text)

def extract_answer(response):
    """The later of the last \\boxed{} and 'Answer:' line, else the last $...$ span (or a number in
    prose after it), else the text, or its last number if prose; reads the end after </think>."""
    if not isinstance(response, str):
        return None
    text = response.rsplit("</think>", 1)[-1][-_TAIL_CHARS:]
    boxes, markers = _boxes(text), list(_MARKER.finditer(text))
    after_marker = bool(markers) and (not boxes or markers[-1].end() > boxes[-1].end)
    if after_marker:        # an 'Answer:' line after the last box is read instead of the boxes
        text = _HOPE.sub("", text[markers[-1].end():].split("\n", 1)[0])
    answer = _last_answer(text, after_marker).strip()
    return answer if answer and len(answer) <= _MAX_ANSWER_CHARS else None

# -------------------------------------------------------------------------------- normalisation
_SYMBOLS = {"−": "-", "–": "-", "·": r"\cdot ", "⋅": r"\cdot ", "×": r"\times ", "÷": "/",
            "⁄": "/", "π": r"\pi ", "√": r"\sqrt", "∞": r"\infty ", "≤": r"\le ",
            "≥": r"\ge ", "≠": r"\ne ", "°": r"^\circ", "∪": r"\cup "}
_SUPERSCRIPT = re.compile(r"[⁰¹²³⁴⁵⁶⁷⁸⁹]")     # a superscript digit: x² -> x^2
# Applied in order, each to the output of those above: \mbox{ becomes \text{ before units in
# \text{} are dropped; \text{...} is unwrapped only after units, percent and 'and' are read from it.
_REWRITES = [(re.compile(pattern), replacement) for pattern, replacement in [
    (r"[\u200b-\u200f\u202a-\u202e\u2060\ufeff]", ""),  # zero-width and bidi marks
    (r"(?<!\.)\.\s*$", ""),                           # a final full stop: 5. -> 5
    (r"\\\\(?=[a-zA-Z])(?!.*(?:matrix|array|cases))", r"\\"),  # \\frac -> \frac, not in matrices
    # sizing: \left( -> (, \bigl[ -> [, \right. -> nothing
    (r"\\(?:left|right)\.|\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)\s*(?=[\\()\[\]|])", ""),
    # fonts: \mathrm{cm}, \mbox{cm} -> \text{cm}
    (r"\\(?:mbox|textnormal|textbf|textrm|textit|mathrm|mathbf)\{", r"\\text{"),
    (r"\\[dtc]frac", r"\\frac"),                      # \dfrac, \tfrac, \cfrac -> \frac
    (r"(\d)\\,(\d{3})", r"\1\2"),                     # 1\,000 -> 1000
    (r",\\!\s*", ","),                                # 1,\!000 -> 1,000
    (r"\{,\}", ","),                                  # 14{,}916 -> 14,916
    (r"(?<!\\)\\[,;: ]|\\q?quad|~", " "),             # \, \; \: \quad ~ -> a space
    (r"\^\s*\{?\\circ\}?|\\circ|\\degree", ""),       # 90^\circ -> 90
    (r"\\\$|\$", ""),                                 # \$16 -> 16
    # percent: 28\%, 28 percent, 28\text{ pct} -> 28%
    (r"\s*(?:\\%|%|\\text\{\s*(?:percent|percentage|pct)\s*\}|\bpercent(?:age)?\b|\bpct\b)", "%"),
    (r"(?<=[\d}])\s*\\text\{\s*[a-zA-Z .]*\}(?:\^\{?\d\}?)?\s*$", ""),  # 10\text{ cm}^2 -> 10
    # units in words after a number (not pi, and, or, mod): 10 square units -> 10
    (r"^([-+]?[\d.,/ ]*\d)\s*(?!(?:pi|and|or|mod)\b)"
     r"[a-zA-Z]{2,}(?:\s+[a-zA-Z]{2,})*(?:\^\{?\d\}?)?$", r"\1"),
    # 'and' / 'or' between items: 1 \text{ and } 2 -> 1, 2
    (r"\s*,?\s*\\text\{\s*(?:and|or)\s*\}\s*|\s*,?\s*(?<![a-zA-Z])(?:and|or)(?![a-zA-Z])\s*", ", "),
    (r"\*\*", ""),                                    # Markdown bold: **5** -> 5
    (r"\\text\{([^{}]*)\}", r"\1"),                   # \text{Evelyn} -> Evelyn
    (r"\\([lg]e|ne)(?:qslant|q)?\b", r"\\\1q"),       # \le, \leqslant -> \leq; \ne -> \neq
    (r"^[a-zA-Z]\s*\\in\s*", ""),                     # x \in [0, 1] -> [0, 1]
    (r"(?<!\.)\.\s*$|[,;]\s*$|\\$", ""),              # a final . , ; or \: 1, 2; -> 1, 2
    (r"[^\S\n]+", " "),                               # runs of spaces and tabs -> one space
]]

def normalize(answer):
    """String-level normalisation shared by both sides; the result is still LaTeX."""
    s = _SUPERSCRIPT.sub(lambda m: "^" + str(unicodedata.digit(m[0])), answer)
    s = "".join(_SYMBOLS.get(c, c) for c in unicodedata.normalize("NFKC", s))
    for pattern, replacement in _REWRITES:
        s = pattern.sub(replacement, s)
    return s.strip()

# ------------------------------------------------------------------------- numbers and structure
_THOUSANDS = re.compile(r"[+-]?\d{1,3}([, ]\d{3})+(\.\d+)?")          # 1,000 or 1 000
_PLAIN = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)")   # '-12', '3.', '0.25', '.5'
_MIXED = re.compile(r"([+-]?)(\d+)(?: (\d+)/(\d+)|\s*\\frac\{(\d+)\}\{(\d+)\})")   # '4 4/9'
_FRAC = re.compile(r"([+-]?)(?:\\frac\{([^{}]+)\}\{([^{}]+)\}|([^/\s]+)/([^/\s]+))")   # '-3/4'
_Number = namedtuple("_Number", "value decimals")  # decimals: digits after the point, -1 if exact
_MATRIX = re.compile(r"[(\[]?\\begin\{([pbvB]?matrix|array)\}(?:\{[lcr|]*\})?(.*)\\end\{\1\}[)\]]?",
                     re.S)      # '\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}'
_INEQUALITY = re.compile(r"(?:(.+?)\s*(<|\\leq|>|\\geq)\s*)?"     # 'x > 3', '-1 \leq x < 2'
                         r"([a-zA-Z](?:\([a-z]\))?)\s*(<|\\leq|>|\\geq)\s*(.+)")
# kinds: 'leaf' (text), 'set' (unordered), 'tuple' (brackets '(]', ...), 'union', 'matrix', 'row'
_Structure = namedtuple("_Structure", "kind items brackets text", defaults=((), "", ""))
_UNBOUNDED = re.compile(r"\\(?:i*int|oint|sum|prod|lim)(?![a-z])")   # '\int', '\sum': refused
# a name on the left of '=': 'x', 'f(x)', '\overline{AB}', 'a_{1}', '\angle ABC'
_NAME_PART = r"[a-zA-Z_{}()|:',^\s\d]|\\frac|\\text"
_NAME = re.compile(rf"(?:{_NAME_PART}|\\overline|\\angle)*[a-zA-Z](?:{_NAME_PART})*")
_CHOICE = re.compile(r"\(?[A-E]\)?(?:[.:)]\s|$)")     # a multiple-choice answer: '(B)', 'C. 5'

def _number(s):
    """The _Number of 1,000 / 1 000 / 4 4/9 / \\frac{a}{b} / 5%, or None."""
    if s.endswith("%"):
        n = _number(s[:-1].strip())
        return n and _Number(n.value / 100, n.decimals + 2 if n.decimals >= 0 else -1)
    s = re.sub(r"^([+-]) +", r"\1", s)     # '- 5' -> '-5'
    if _THOUSANDS.fullmatch(s) and not s.lstrip("+-").startswith("0,"):
        s = re.sub("[, ]", "", s)
    if _PLAIN.fullmatch(s):
        return _Number(Fraction(s), len(s.split(".")[1]) if "." in s else -1)
    sign = -1 if s.startswith("-") else 1
    mixed = _MIXED.fullmatch(s)
    if mixed:
        numerator, denominator = int(mixed[3] or mixed[5]), int(mixed[4] or mixed[6])
        if numerator < denominator:     # a proper fraction; '2 5/3' is read as a/b below
            return _Number(sign * (int(mixed[2]) + Fraction(numerator, denominator)), -1)
    fraction = _FRAC.fullmatch(s)
    top = _number(fraction[2] or fraction[4]) if fraction else None
    bottom = _number(fraction[3] or fraction[5]) if top else None
    # exact parts and a non-zero denominator only: 1.5/2 is not read as a number
    if not bottom or not bottom.value or top.decimals >= 0 or bottom.decimals >= 0:
        return None
    return _Number(sign * top.value / bottom.value, -1)

def _close(approx, decimals, exact):
    """A decimal with >= 2 written digits matches what it rounds, unless that ends within them."""
    if approx == exact or decimals < 2 or (exact * 10 ** decimals).denominator == 1:
        return approx == exact
    return abs(approx - exact) <= Fraction(1, 2 * 10 ** decimals) * (1 + Fraction(1, 10 ** 9))

def _numbers_equal(pred, gold):
    (p, p_decimals), (g, g_decimals) = pred, gold
    if g_decimals < 0 and g.denominator == 1:       # an integer gold (AIME): no tolerance
        return p == g
    if p_decimals >= 0 and g_decimals < 0:
        return _close(p, p_decimals, g)
    if g_decimals >= 0 and (p_decimals < 0 or p_decimals > g_decimals):
        return _close(g, g_decimals, p)
    return p == g

def _split_top(s, sep):
    """Split s on sep outside brackets; None when brackets nest deeper than _MAX_DEPTH."""
    depths = [0, *itertools.accumulate((c in "([{") - (c in ")]}") for c in s)]
    if max(depths) > _MAX_DEPTH:
        return None
    cuts = [m.start() for m in re.finditer(re.escape(sep), s) if depths[m.start()] == 0]
    return [s[a:b] for a, b in zip([0] + [cut + len(sep) for cut in cuts], cuts + [len(s)])]

def _structure(s):
    """s as a _Structure, split at top-level matrix rows and cells, \\cup, commas or semicolons."""
    s = s.strip()
    matrix = _MATRIX.fullmatch(s)
    if matrix:
        rows = [r for r in (_split_top(matrix[2], r"\\") or []) if r.strip()]
        cells = [[_structure(c) for c in _split_top(r, "&")] for r in rows]
        return _Structure("matrix", [_Structure("row", row) for row in cells])
    unions = _split_top(s, r"\cup") or []
    if len(unions) > 1:
        return _Structure("union", [_structure(u) for u in unions])
    if s.startswith(r"\{") and s.endswith(r"\}"):
        return _Structure("set", [_structure(x) for x in _split_top(s[2:-2], ",") or []])
    if len(s) > 1 and s[0] in "([{" and s[-1] in ")]}" and _group_end(s, 0) == len(s):
        items = [_structure(x) for x in _split_top(s[1:-1], "," if "," in s else ";") or []]
        if len(items) > 1:
            kind = "set" if s[0] == "{" else "tuple"
            return _Structure(kind, items, "" if kind == "set" else s[0] + s[-1])
    # a bare list '1, 2' (or '1; 2') is a set, but '1,000' is one number
    separator = ";" if ";" in s and "," not in s else ","
    parts = [s] if _THOUSANDS.fullmatch(s) else _split_top(s, separator) or [s]
    if len(parts) > 1:
        return _Structure("set", [_structure(x) for x in parts if x.strip()])
    if s.count(r"\pm") == 1:
        return _Structure("set", [_Structure("leaf", text=s.replace(r"\pm", c)) for c in "+-"])
    return _Structure("leaf", text=s)

def _as_interval(leaf):
    """'a < x \\leq b' or 'x > a' as an interval structure, or None."""
    m = _INEQUALITY.fullmatch(leaf.replace("<=", r"\leq").replace(">=", r"\geq"))
    if not m:
        return None
    lo, op1, _, op2, hi = m.groups()
    flip = {">": "<", r"\geq": r"\leq"}
    if op2 in flip:     # 'b > x > a' is 'a < x < b', 'x > a' is 'a < x'
        lo, op1, op2, hi = hi, flip[op2], flip.get(op1, "<"), lo or r"\infty"
    if lo is None:
        lo, op1 = r"-\infty", "<"
    brackets = ("[" if op1 == r"\leq" else "(") + ("]" if op2 == r"\leq" else ")")
    return _Structure("tuple", [_Structure("leaf", text=end.strip()) for end in (lo, hi)], brackets)

def _compare(p, g, leaf_equal):
    """Whether structures p and g are equal, with leaf_equal(pred, gold) deciding leaves."""
    kinds = {p.kind, g.kind}
    equal = functools.partial(_compare, leaf_equal=leaf_equal)
    if kinds == {"leaf"}:
        return leaf_equal(p.text, g.text)
    if kinds == {"set"}:            # unordered: each side covers the other
        covered = all(any(equal(x, y) for y in g.items) for x in p.items)
        return covered and all(any(equal(x, y) for x in p.items) for y in g.items)
    if kinds == {"tuple", "set"} or p.kind == g.kind and p.brackets == g.brackets:  # in order
        return len(p.items) == len(g.items) and all(map(equal, p.items, g.items))
    if kinds == {"leaf", "tuple"}:  # an inequality against an interval
        p = (_as_interval(p.text) or p) if p.kind == "leaf" else p
        g = (_as_interval(g.text) or g) if g.kind == "leaf" else g
        return p.kind == g.kind and equal(p, g)
    return False

def _rhs(s):
    """'x = 5' -> '5', 'f(x) = 2x+3' -> '2x+3', 'a = b = c' -> 'c'; other equations stay."""
    parts = [x.strip() for x in re.split(r"(?<![<>!\\])=", s)]    # '=', not '<=', '!=', '\='
    lhs, rhs = parts[0], parts[-1]
    named = len(parts) == 2 and _NAME.fullmatch(lhs) and not re.fullmatch(r"[\d\s]+", lhs)
    if len(parts) > 2 or named or len(parts) == 2 and _number(lhs) and _number(rhs):
        return rhs
    return s.strip()

def _leaf_equal(pred, gold, symbolic):
    if ("=" in _rhs(pred)) == ("=" in _rhs(gold)):     # right-hand sides, unless one is no equation
        pred, gold = _rhs(pred), _rhs(gold)
    if pred.replace(" ", "") == gold.replace(" ", ""):
        return True
    p = _number(pred)
    g = _number(gold) if p else None
    if p and g:
        dropped = gold.endswith("%") and not pred.endswith("%")     # 28 may match a gold 28%
        return _numbers_equal(p, g) or dropped and _numbers_equal(p, _Number(100 * g.value, -1))
    if not pred or not gold or ":" in pred + gold:
        return False
    letter = re.fullmatch(r"[A-Z]", gold) or re.fullmatch(r"[A-Z]", pred)     # 'B': a choice
    return not letter and not _UNBOUNDED.search(pred + gold) and symbolic(pred, gold)

def _equivalent(pred, gold, symbolic):
    pred, gold = normalize(pred), normalize(gold)
    if pred == gold:
        return True
    if _split_top(pred, "\0") is None or _split_top(gold, "\0") is None:   # nested too deep
        return False
    if re.fullmatch(r"[A-E]", gold) and (_CHOICE.match(pred) or _is_prose(pred)):  # first letter
        return re.findall(r"(?<![A-Za-z\\])[A-E](?![A-Za-z])", pred)[:1] == [gold]
    for a, b in ((pred, gold), (gold, pred)):   # a decimal comma, '2,74' against '2.74'
        if re.fullmatch(r"[+-]?\d+,\d+", a) and re.fullmatch(r"[+-]?\d*\.\d+", b):
            pred, gold = pred.replace(",", "."), gold.replace(",", ".")
    # '(p, q) = (3, 2)': keep the right-hand side, before it is read as a tuple
    if max(pred.count("="), gold.count("=")) <= 1 and ("=" in _rhs(pred)) == ("=" in _rhs(gold)):
        pred, gold = _rhs(pred), _rhs(gold)
    return _compare(_structure(pred), _structure(gold), lambda a, b: _leaf_equal(a, b, symbolic))

# -------------------------------------------------------------------------------- sympy worker
_MAX_DIGITS = 100_000   # refuse any sub-expression whose value could need more digits than this
_MAX_NODES = 2000       # sub-trees the size guard visits before it refuses an expression
_LOG10_2 = 0.302        # log10(2), rounded up: digits per bit, and what one sum adds
_MAX_EXP = 400          # caps x in 10 ** x (a float); such sizes are refused anyway
_TOL = 1e-9             # relative: how close two values at a random point must be
_workers = []                       # the worker processes: [answering, spare]
_workers_lock = threading.Lock()    # one call at a time talks to them
_first_worker_ready = False         # before the first "ready", waits use startup_timeout
_COMPLEX = re.compile(r"(?<![a-zA-Z\\])i(?![a-zA-Z])")     # the i of '3 + 4i', not of '\pi', 'sin'
# ANTLR fills its caches lazily: a construct's first parse takes 20-200 ms, later ones about 1 ms
_WARMUP = r"""\frac{p_{1}}{q_{1}} \cdot \left(\frac{q_0}{p + q_0}\right)^{1/3}
\frac{2}{5y^{3/4}} + \sqrt[3]{t^2 + 1}^2;\sin^2 x + \cos(2\theta) - \tan^{2}(y) + \sec x + \cot x
\begin{pmatrix} 1 & x \\ \sqrt{2} & 4 \end{pmatrix};\text{yes};\frac{\sqrt{3}}{2} + 2\sqrt{2} - \pi
\frac{u^2}{9} + \frac{v^2}{4} = 1;\log_{2} 8 - \ln(e^{x}) + e^{-t};3x^{2} - 4xy + 1
\frac{w_{0}}{(1 + w/w_{0})^{2}};-\frac{3t^2}{4(t^2+1)^{3/2}};\frac{a_{1}}{b_{2}} \cdot c
\frac{2}{7\sqrt[3]{s}^2};3 + 4i;[0, 1) \cup (2, \infty);(s + 1)^{5/2} - q^{0.5}
2 \cdot 3^{5} \cdot 7^2;y = -\frac{1}{2}x + 5;(1, -2, \frac{3}{4});m n p;\frac{\pi r}{h + r}
y^{5}+3 y^{2}-7 y+1;1.5 \times 10^{-3};7! + \binom{6}{3};2a + 3b - 4c = 0;x * 2 + (-3)*x^2;2^4 3^2 5
7k^{3}(2+5k^{2});4 \sin b \cos a;\sqrt[4]{y}^{3};(t-1)(t+2)^{3};|x - 1| \leq 3;\cot(u)+\csc u
12m^5(3m^4-1);(2, 0.25);\cos^2(t) - 1;p \geq 2;\{1, 2\};h(s) + 1;-x > -1;101_{2};(a, b];QRS2T;15\%
g(t)""".replace("\n", ";").split(";")

class _Unsafe(Exception):
    pass

def _log10_bound(e, budget):
    """Upper bound on log10|value| of every numeric sub-tree of e, found without evaluating e."""
    import sympy
    budget[0] -= 1
    unbounded = (sympy.Sum, sympy.Product, sympy.Integral, sympy.Limit, sympy.Derivative)
    if budget[0] < 0 or isinstance(e, unbounded):
        raise _Unsafe("too large or unbounded")
    if isinstance(e, sympy.Rational):
        return max(e.p.bit_length(), e.q.bit_length()) * _LOG10_2 + 1
    is_matrix = isinstance(e, sympy.MatrixBase)
    args = list(e) if is_matrix else [a for a in e.args if isinstance(a, sympy.Basic)]
    sizes = [_log10_bound(a, budget) for a in args] or [1.0]
    if isinstance(e, sympy.Pow):    # |exponent| <= 10^size; small constant ones are evaluated
        small = sizes[1] < 15 and not e.args[1].free_symbols
        exponent = abs(complex(sympy.N(e.args[1], 15))) if small else 10 ** min(sizes[1], _MAX_EXP)
        size = sizes[0] * max(exponent, 1)
    elif isinstance(e, (sympy.factorial, sympy.binomial, sympy.gamma, sympy.exp)):
        n = 10 ** min(max(sizes), _MAX_EXP)
        size = n * max(math.log10(n), 1)
    else:   # a product's digits add up; a sum's are its largest term's, plus a little
        size = sum(sizes) if isinstance(e, sympy.Mul) else max(sizes) + _LOG10_2
    if size > _MAX_DIGITS:
        raise _Unsafe("magnitude")
    return size

def _sympy_parser():
    """latex2sympy2_extended with no path from text to sympify/parse_expr: numbers are built with
    Fraction() and sympy's text parser is replaced, in the worker, by a function that raises."""
    import sympy.parsing.sympy_parser
    from antlr4.atn.PredictionMode import PredictionMode
    from latex2sympy2_extended import latex2sympy2
    from latex2sympy2_extended.math_normalization import NormalizationConfig, normalize_latex
    def refuse(*args, **kwargs):
        raise _Unsafe("text reached sympy's parser")
    sympy.parsing.sympy_parser.parse_expr = refuse
    def number(text):
        return sympy.Rational(Fraction(text.replace(",", "").replace(" ", "")))
    latex2sympy2.convert_number = number
    converter = type("Converter", (latex2sympy2._Latex2Sympy,),
                     {"parse_number": lambda self, text: number(text)})
    def sll_parser(self, text):     # ANTLR's SLL prediction: what it parses is LL's parse tree
        parser = converter.create_parser(self, text)
        parser._interp.predictionMode = PredictionMode.SLL
        return parser
    fast = type("FastConverter", (converter,), {"create_parser": sll_parser})
    # units=False: its unit list strips letters ("a + b + c" loses its c); normalize() does units
    config = NormalizationConfig(basic_latex=True, units=False, malformed_operators=True,
                                 nits=True, boxed="none")
    def parse(text):
        is_complex = bool(_COMPLEX.search(text))
        latex, is_real = normalize_latex(text, config), None if is_complex else True
        try:    # LL's full-context prediction costs 20-100 ms a parenthesis, each time
            expr = fast(is_real=is_real).parse(latex)
        except Exception:   # a syntax error for SLL, maybe not for LL: the full parse decides
            expr = converter(is_real=is_real).parse(latex)
        _log10_bound(expr, [_MAX_NODES])
        if is_complex:
            expr = expr.subs({s: sympy.I for s in expr.free_symbols if s.name == "i"})
        return expr
    return parse

def _at_points(expr, symbols):
    import sympy
    rng = random.Random(0)
    points = [{s: rng.uniform(0.5, 2.5) for s in symbols} for _ in range(3)]
    return [complex(sympy.N(expr, 20, subs=point)) for point in points]

def _relation_equal(a, b):
    """Equations match when their lhs - rhs are proportional; inequalities when positively so."""
    def key(r):     # (expression, op), read as: expression op 0
        flip = r.rel_op in ("<", "<=")
        return (r.rhs - r.lhs if flip else r.lhs - r.rhs), r.rel_op.replace("<", ">")
    (ea, ka), (eb, kb) = key(a), key(b)
    symbols = sorted(ea.free_symbols, key=str)
    if ka != kb or ea.free_symbols != eb.free_symbols or not symbols:
        return False
    ratios = _at_points(ea / eb, symbols)
    constant = all(abs(r - ratios[0]) <= _TOL * abs(ratios[0]) for r in ratios)
    return constant and abs(ratios[0]) > 1e-12 and (ka in ("==", "!=") or ratios[0].real > 0)

def _sym_equal(a, b):
    import sympy
    if a == b:
        return True
    if isinstance(a, sympy.Rel) and isinstance(b, sympy.Rel):
        return _relation_equal(a, b)
    if not isinstance(a, sympy.Expr) or not isinstance(b, sympy.Expr):
        return False
    symbols = sorted(a.free_symbols | b.free_symbols, key=str)
    pairs = zip(_at_points(a, symbols), _at_points(b, symbols))
    return all(cmath.isfinite(x) and abs(x - y) <= _TOL * max(1, abs(x), abs(y)) for x, y in pairs)

def _worker_main():
    """Answer JSON lines [pred, gold] with true/false, one at a time, until stdin closes."""
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))     # 3 GiB
    parse = _sympy_parser()
    for text in _WARMUP:
        parse(text)
    # a full collection over the warmed-up parser's millions of objects stalls a call 70-150 ms
    gc.collect()
    gc.freeze()
    print("ready", flush=True)
    for line in sys.stdin:
        try:
            pred, gold = json.loads(line)
            result = bool(_sym_equal(parse(pred), parse(gold)))
        except (Exception, RecursionError, MemoryError):
            result = False
        print(json.dumps(result), flush=True)

def _readline(proc, timeout):
    ready = timeout > 0 and select.select([proc.stdout], [], [], timeout)[0]
    return proc.stdout.readline() if ready else None

def _ask_worker(pred, gold, deadline, startup_timeout=30.0):
    """Sympy's verdict from a persistent `python verify.py --worker` (no fork, no torch); a warm
    spare takes over when it overruns and is killed. Only the first start-up is not on the clock."""
    wait = max(0.0, deadline - time.monotonic()) if _first_worker_ready else startup_timeout
    if not _workers_lock.acquire(timeout=wait):
        return False
    try:
        return _ask_locked(pred, gold, deadline, startup_timeout)
    finally:
        _workers_lock.release()

def _ask_locked(pred, gold, deadline, startup_timeout):
    global _first_worker_ready
    # out of time: no more sympy in this call (waits for a warming spare count too)
    if _first_worker_ready and time.monotonic() >= deadline:
        return False
    _workers[:] = [proc for proc in _workers if proc.poll() is None]
    while len(_workers) < 2:
        command = [sys.executable, os.path.abspath(__file__), "--worker"]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        _workers.append(subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, env=env))
    proc = _workers[0]
    if not getattr(proc, "ready", False):
        wait = deadline - time.monotonic() if _first_worker_ready else startup_timeout
        proc.ready = _readline(proc, wait) == b"ready\n"
        if not proc.ready:      # still warming up: it stays for the next call
            return False
        if not _first_worker_ready:
            _first_worker_ready = True
            deadline = max(deadline, time.monotonic() + 0.5)   # its call gets 0.5 s
    proc.stdin.write(json.dumps([pred, gold]).encode() + b"\n")
    proc.stdin.flush()
    answer = _readline(proc, deadline - time.monotonic())
    if answer is None:          # overran: kill it, the spare takes over
        proc.kill()
        proc.wait()
    return answer == b"true\n"

@atexit.register
def _close_workers():
    for proc in _workers:
        proc.kill()

# -------------------------------------------------------------------------------- DAPO rule
# verl/utils/reward_score/math_dapo.py (Apache-2.0), kept as is so scores compare with RLEP's tables
_DAPO_SUBSTITUTIONS = [("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""),
                       ("mbox", "text"), (",\\text{and}", ","), ("\\text{and}", ","),
                       ("\\text{m}", "\\text{}")]
_DAPO_REMOVED = ["square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units",
                 "\\ldots", "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm",
                 "gm", "pounds", "meters", "meals", "edges", "students", "childrentickets",
                 "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3",
                 "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!",
                 "{,}", '"', "\\dots"]

def _dapo_normalize(answer):
    answer = answer.split("=")[-1]
    for before, after in _DAPO_SUBSTITUTIONS + [(removed, "") for removed in _DAPO_REMOVED]:
        answer = answer.replace(before, after)
    answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", answer)     # 'is $5$ m' -> '$5$'
    for command in ("text", "textbf", "overline"):
        answer = re.sub(r"(\\" + command + r"\{)(.*?)(\})", "\\2", answer)   # '\text{5}' -> '5'
    answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", answer)          # '\boxed{5}' -> '5'
    answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", answer)   # '\frac12' -> '\frac{1}{2}'
    answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", answer).replace("$", "")  # '\sqrt2' -> '\sqrt{2}'
    return (answer.replace(",", "") if answer.replace(",", "").isdigit() else answer).strip()

def dapo_correct(response, gold):
    """math_dapo.compute_score: last 'Answer:' line of the last 300 characters, Minerva, exact."""
    matches = re.findall(r"(?i)Answer\s*:\s*([^\n]+)", response[-300:])    # 'Answer: 7' -> '7'
    return _dapo_normalize(matches[-1] if matches else "[INVALID]") == _dapo_normalize(gold)

# -------------------------------------------------------------------------------- public API
def verify(response, gold, mode="equivalence", timeout=1.0):
    """True iff the response's final answer equals gold; never raises on its input (bad or hostile
    input gives False). mode "equivalence" is our checker ("default", its old name, in older
    configs), "dapo" the paper's exact-match rule. timeout (s) bounds the sympy stage."""
    if mode not in ("equivalence", "default", "dapo"):
        raise ValueError(f"verify mode {mode!r}: use 'equivalence' or 'dapo'")
    try:
        if mode == "dapo":
            return dapo_correct(response, gold)
        symbolic = functools.partial(_ask_worker, deadline=time.monotonic() + timeout)
        if "\\boxed" in gold or "\\fbox" in gold or len(gold) > 200:    # a whole solution (MATH)
            gold = extract_answer(gold)
        pred = extract_answer(response)
        return bool(gold and pred) and _equivalent(pred, gold, symbolic)
    except (Exception, RecursionError):
        return False

if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        _worker_main()
    elif len(sys.argv) == 3:
        print("extracted:", extract_answer(sys.argv[1]))
        print("correct:", verify(sys.argv[1], sys.argv[2]))
        print("dapo rule:", verify(sys.argv[1], sys.argv[2], mode="dapo"))
    else:
        sys.exit("usage: python verify.py RESPONSE GOLD")
