"""Math answer checker: the RL reward in rlep.py and the metric in eval.py.

verify(response, gold) extracts the final answer, normalises both sides and decides equivalence: string match,
exact rational arithmetic on plain numbers, bracket-aware tuples/sets/intervals/matrices, and only then sympy, in
a persistent worker process that parses LaTeX with latex2sympy2_extended (never eval), refuses huge magnitudes
before any arithmetic and is killed when it overruns, so every call returns in bounded time, on any thread.
mode="dapo" is the paper's own rule (math_dapo). CLI: python verify.py 'so \\boxed{\\frac12}' '0.5'
"""
import atexit, cmath, itertools, json, math, os, random, re, select, subprocess, sys, threading, time, unicodedata
from fractions import Fraction

# ----------------------------------------------------------------------------- extraction
_TAIL_CHARS = 4000      # only the end of a response can hold its final answer
_MAX_ANSWER_CHARS = 1000
_MAX_DEPTH = 40         # bracket nesting; deeper answers are refused, not parsed
_BOX = re.compile(r"\\(?:boxed|fbox)\s*")
_MARKER = re.compile(r"(?i)(?:final\s+answer|answer)\s*(?:is\b\s*:?|:)\s*(?=\S)")
_SPAN = re.compile(r"\$\$(.{1,800}?)\$\$|\\\[(.{1,800}?)\\\]|\\\((.{1,800}?)\\\)"
                   r"|(?<!\\)\$((?:[^$\n]|\\\$){1,800}?)(?<!\\)\$", re.S)
_NUMBER = re.compile(r"(?<![\w.\\])[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\s\d+/\d+|\d+/\d+|\d+(?:\.\d+)?|\.\d+)"
                     r"(?:\s?(?:\\?%|percent|pct))?(?!\d)")
_JOINER = re.compile(r"(?:[\s$,;.]|\\quad|\\qquad|\\[()\[\]]|\\text\{[^{}]{0,30}\})*"
                     r"(?:[^\n{}$]{0,12}?(?:,|\band\b|\bor\b)(?:[\s$]|\\quad|\\qquad|\\[()\[\]]|\})*)?")
_PROSE_WORD = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{3,}")
_MARKUP = re.compile(r"\\(?:text|mathrm|textbf)\{[^{}]*\}|\\[a-zA-Z]+(?:\{[a-zA-Z*]*\})?")
_HOPE = re.compile(r"(?i)\.?\s*I hope it is correct.*$", re.S)

def _group_end(s, start, opening="([{", closing=")]}"):
    """Index just past the bracket group that opens at s[start], or None if it never closes."""
    depths = itertools.accumulate((c in opening) - (c in closing) for c in s[start:])
    return next((start + i + 1 for i, depth in enumerate(depths) if depth == 0), None)

def _boxes(text):
    """(start, end, content) of each of the last 50 \\boxed{...}, \\fbox{...} and \\boxed 5, in order."""
    found = []
    for m in list(_BOX.finditer(text))[-50:]:
        if text.startswith("{", m.end()) and (end := _group_end(text, m.end(), "{", "}")):
            found.append((m.start(), end, text[m.end() + 1:end - 1]))
        elif word := re.match(r"\\boxed ([\w.]+)", text[m.start():m.start() + 40]):
            found.append((m.start(), m.start() + word.end(), word[1]))
    return found

def _join_last(items, text):
    """The last item's content, joined with the items before it that are separated only by ',', 'and', 'or'."""
    first = len(items) - 1
    while first > 0 and len(gap := text[items[first - 1][1]:items[first][0]]) <= 40 and _JOINER.fullmatch(gap):
        first -= 1
    return ", ".join(content for _, _, content in items[first:])

def _is_prose(text):
    return bool(_PROSE_WORD.search(_MARKUP.sub("", text)))

def _whole_or_number(text):
    text = text.strip().rstrip(".").strip()
    numbers = _NUMBER.findall(text) if _is_prose(text) else []
    return numbers[-1] if numbers else text

def _last_answer(text, after_marker):
    """The last boxes; else the last $...$ spans, or what follows them: 'is X' after an answer marker, a number
    in prose; else the whole text when it reads as math, else its last number."""
    if boxes := _boxes(text):
        return _join_last(boxes, text)
    spans = [(m.start(), m.end(), next(g for g in m.groups() if g is not None)) for m in _SPAN.finditer(text)]
    after = text[spans[-1][1]:] if spans else text
    if after_marker and " is " in after:
        return _whole_or_number(after.rsplit(" is ", 1)[1])
    numbers = _NUMBER.findall(after) if spans and _is_prose(after) else []
    return numbers[-1] if numbers else _join_last(spans, text) if spans else _whole_or_number(text)

def extract_answer(response):
    """Final answer of a response: the later of the last \\boxed{} and the last 'Answer:' / 'the answer is'
    line, else the last $...$ span (or a number in prose after it), else the whole text when it reads as
    math, else its last number. Reads only the text after </think>, and only its last 4000 characters."""
    if not isinstance(response, str):
        return None
    text = response.rsplit("</think>", 1)[-1][-_TAIL_CHARS:]
    boxes, markers = _boxes(text), list(_MARKER.finditer(text))
    after_marker = bool(markers) and (not boxes or markers[-1].end() > boxes[-1][1])
    if after_marker:                                             # an 'Answer:' line after the last box
        text = _HOPE.sub("", text[markers[-1].end():].split("\n", 1)[0])
    answer = _last_answer(text, after_marker).strip()
    return answer if answer and len(answer) <= _MAX_ANSWER_CHARS else None

# ----------------------------------------------------------------------------- normalisation
_SYMBOLS = {"−": "-", "–": "-", "·": r"\cdot ", "⋅": r"\cdot ", "×": r"\times ", "÷": "/", "⁄": "/", "π": r"\pi ",
            "√": r"\sqrt", "∞": r"\infty ", "≤": r"\le ", "≥": r"\ge ", "≠": r"\ne ", "°": r"^\circ", "∪": r"\cup "}
_REWRITES = [(re.compile(p), r) for p, r in [
    (r"[\u200b-\u200f\u202a-\u202e\u2060\ufeff]", ""), (r"(?<!\.)\.\s*$", ""),      # zero-width and bidi marks
    (r"\\\\(?=[a-zA-Z])(?!.*(?:matrix|array|cases))", r"\\"),                           # doubled backslashes
    (r"\\(?:left|right)\.|\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)\s*(?=[\\()\[\]|])", ""),
    (r"\\(?:mbox|textnormal|textbf|textrm|textit|mathrm|mathbf)\{", r"\\text{"), (r"\\[dtc]frac", r"\\frac"),
    (r"(\d)\\,(\d{3})", r"\1\2"), (r",\\!\s*", ","), (r"\{,\}", ","), (r"(?<!\\)\\[,;: ]|\\q?quad|~", " "),
    (r"\^\s*\{?\\circ\}?|\\circ|\\degree", ""), (r"\\\$|\$", ""),
    (r"\s*(?:\\%|%|\\text\{\s*(?:percent|percentage|pct)\s*\}|\bpercent(?:age)?\b|\bpct\b)", "%"),
    (r"(?<=[\d}])\s*\\text\{\s*[a-zA-Z .]*\}(?:\^\{?\d\}?)?\s*$", ""),          # \text{ cm}^2 after a value
    (r"^([-+]?[\d.,/ ]*\d)\s*(?!(?:pi|and|or|mod)\b)[a-zA-Z]{2,}(?:\s+[a-zA-Z]{2,})*(?:\^\{?\d\}?)?$", r"\1"),
    (r"\s*,?\s*\\text\{\s*(?:and|or)\s*\}\s*|\s*,?\s*(?<![a-zA-Z])(?:and|or)(?![a-zA-Z])\s*", ", "), (r"\*\*", ""),
    (r"\\text\{([^{}]*)\}", r"\1"), (r"\\([lg]e|ne)(?:qslant|q)?\b", r"\\\1q"), (r"^[a-zA-Z]\s*\\in\s*", ""),
    (r"(?<!\.)\.\s*$|[,;]\s*$|\\$", ""), (r"[^\S\n]+", " ")]]

def normalize(answer):
    """String-level normalisation shared by both sides; the result is still LaTeX."""
    s = re.sub(r"[⁰¹²³⁴⁵⁶⁷⁸⁹]", lambda m: "^" + str(unicodedata.digit(m.group())), answer)
    s = "".join(_SYMBOLS.get(c, c) for c in unicodedata.normalize("NFKC", s))
    for pattern, replacement in _REWRITES:
        s = pattern.sub(replacement, s)
    return s.strip()

# ----------------------------------------------------------------------------- numbers and structure
_THOUSANDS = re.compile(r"[+-]?\d{1,3}([, ]\d{3})+(\.\d+)?")          # 1,000 or 1 000
_PLAIN = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)")
_MIXED = re.compile(r"([+-]?)(\d+)(?: (\d+)/(\d+)|\s*\\frac\{(\d+)\}\{(\d+)\})")
_FRAC = re.compile(r"([+-]?)(?:\\frac\{([^{}]+)\}\{([^{}]+)\}|([^/\s]+)/([^/\s]+))")

def _number(s):
    """(value, decimals after the point, -1 if exact) of 1,000 / 1 000 / 4 4/9 / \\frac{a}{b} / 5%, or None."""
    if s.endswith("%"):
        parsed = _number(s[:-1].strip())
        return parsed and (parsed[0] / 100, parsed[1] + 2 if parsed[1] >= 0 else -1)
    s = re.sub(r"^([+-]) +", r"\1", s)
    s = re.sub("[, ]", "", s) if _THOUSANDS.fullmatch(s) and not s.lstrip("+-").startswith("0,") else s
    if _PLAIN.fullmatch(s):
        return Fraction(s), (len(s.split(".")[1]) if "." in s else -1)
    sign = -1 if s.startswith("-") else 1
    if (m := _MIXED.fullmatch(s)) and 0 <= int(m[3] or m[5]) < int(m[4] or m[6]):
        return sign * (int(m[2]) + Fraction(int(m[3] or m[5]), int(m[4] or m[6]))), -1
    if (m := _FRAC.fullmatch(s)) and (top := _number(m[2] or m[4])) and (bottom := _number(m[3] or m[5])):
        return (sign * top[0] / bottom[0], -1) if bottom[0] and top[1] < 0 and bottom[1] < 0 else None
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
    depths = [0, *itertools.accumulate((c in "([{") - (c in ")]}") for c in s)]
    if max(depths) > _MAX_DEPTH:
        return None
    cuts = [m.start() for m in re.finditer(re.escape(sep), s) if depths[m.start()] == 0]
    return [s[a:b] for a, b in zip([0] + [cut + len(sep) for cut in cuts], cuts + [len(s)])]

def _structure(s):
    """('leaf', s), ('set', items), or (kind, brackets, items) for an ordered 'tuple', 'union', 'matrix', 'row'."""
    s = s.strip()
    if env := re.fullmatch(r"[(\[]?\\begin\{([pbvB]?matrix|array)\}(?:\{[lcr|]*\})?(.*)\\end\{\1\}[)\]]?", s, re.S):
        rows = [r for r in (_split_top(env[2], r"\\") or []) if r.strip()]
        return ("matrix", "", [("row", "", [_structure(c) for c in _split_top(r, "&")]) for r in rows])
    if (unions := _split_top(s, r"\cup")) and len(unions) > 1:
        return ("union", "", [_structure(u) for u in unions])
    if s.startswith(r"\{") and s.endswith(r"\}"):
        return ("set", [_structure(x) for x in _split_top(s[2:-2], ",") or []])
    if len(s) > 1 and s[0] in "([{" and s[-1] in ")]}" and _group_end(s, 0) == len(s):
        items = [_structure(x) for x in _split_top(s[1:-1], "," if "," in s else ";") or []]
        if len(items) > 1:
            return ("set", items) if s[0] == "{" else ("tuple", s[0] + s[-1], items)
    items = [s] if _THOUSANDS.fullmatch(s) else _split_top(s, ";" if ";" in s and "," not in s else ",") or [s]
    if len(items) > 1:
        return ("set", [_structure(x) for x in items if x.strip()])
    if s.count(r"\pm") == 1:
        return ("set", [("leaf", s.replace(r"\pm", sign)) for sign in "+-"])
    return ("leaf", s)

_INEQUALITY = re.compile(r"(?:(.+?)\s*(<|\\leq|>|\\geq)\s*)?([a-zA-Z](?:\([a-z]\))?)\s*(<|\\leq|>|\\geq)\s*(.+)")

def _as_interval(leaf):
    """'a < x \\leq b' or 'x > a' as an interval structure, or None."""
    if not (m := _INEQUALITY.fullmatch(leaf.replace("<=", r"\leq").replace(">=", r"\geq"))):
        return None
    lo, op1, _, op2, hi = m.groups()
    flip = {">": "<", r"\geq": r"\leq"}
    if op2 in flip:                                          # 'b > x > a' is 'a < x < b', 'x > a' is 'a < x'
        lo, op1, op2, hi = hi, flip[op2], flip.get(op1, "<"), lo or r"\infty"
    if lo is None:
        lo, op1 = r"-\infty", "<"
    brackets = ("[" if op1 == r"\leq" else "(") + ("]" if op2 == r"\leq" else ")")
    return ("tuple", brackets, [("leaf", lo.strip()), ("leaf", hi.strip())])

def _compare(p, g, leaf_equal):
    kinds, equal = {p[0], g[0]}, (lambda a, b: _compare(a, b, leaf_equal))
    if kinds == {"leaf"}:
        return leaf_equal(p[1], g[1])
    if kinds == {"set"}:                                         # unordered: each side covers the other
        return all(any(equal(x, y) for y in g[1]) for x in p[1]) and all(
            any(equal(x, y) for x in p[1]) for y in g[1])
    if kinds == {"tuple", "set"} or p[:2] == g[:2]:             # a set written as a tuple keeps its order
        return len(p[-1]) == len(g[-1]) and all(map(equal, p[-1], g[-1]))
    if kinds == {"leaf", "tuple"}:                               # an inequality against an interval
        p, g = (_as_interval(p[1]) or p, g) if p[0] == "leaf" else (p, _as_interval(g[1]) or g)
        return p[0] == g[0] and equal(p, g)
    return False

_UNBOUNDED = re.compile(r"\\(?:i*int|oint|sum|prod|lim)(?![a-z])")     # the size guard refuses these: skip sympy
_NAME_PART = r"[a-zA-Z_{}()|:',^\s\d]|\\frac|\\text"
_NAME = re.compile(rf"(?:{_NAME_PART}|\\overline|\\angle)*[a-zA-Z](?:{_NAME_PART})*")     # a name on the left of =

def _rhs(s):
    """'x = 5' -> '5', 'f(x) = 2x+3' -> '2x+3', 'a = b = c' -> 'c'; other equations stay."""
    parts = [x.strip() for x in re.split(r"(?<![<>!\\])=", s)]
    if len(parts) > 2 or len(parts) == 2 and (_NAME.fullmatch(parts[0]) and not re.fullmatch(r"[\d\s]+", parts[0])
                                              or _number(parts[0]) and _number(parts[1])):
        return parts[-1]
    return s.strip()

def _leaf_equal(pred, gold, symbolic):
    if ("=" in _rhs(pred)) == ("=" in _rhs(gold)):          # keep both sides when only one is an equation
        pred, gold = _rhs(pred), _rhs(gold)
    if pred.replace(" ", "") == gold.replace(" ", ""):
        return True
    if (p := _number(pred)) and (g := _number(gold)):        # a gold's % may also be dropped: 28% ~ 28
        dropped = gold.endswith("%") and not pred.endswith("%") and _numbers_equal(p, (g[0] * 100, -1))
        return _numbers_equal(p, g) or dropped
    if not pred or not gold or ":" in pred + gold or re.fullmatch(r"[A-Z]", gold) or re.fullmatch(r"[A-Z]", pred):
        return False
    return not _UNBOUNDED.search(pred + gold) and symbolic(pred, gold)

def _equivalent(pred, gold, symbolic):
    pred, gold = normalize(pred), normalize(gold)
    if pred == gold:
        return True
    if _split_top(pred, "\0") is None or _split_top(gold, "\0") is None:   # nested deeper than _MAX_DEPTH
        return False
    if re.fullmatch(r"[A-E]", gold) and (re.match(r"\(?[A-E]\)?(?:[.:)]\s|$)", pred) or _is_prose(pred)):
        return re.findall(r"(?<![A-Za-z\\])[A-E](?![A-Za-z])", pred)[:1] == [gold]    # multiple choice: first letter
    for a, b in ((pred, gold), (gold, pred)):
        if re.fullmatch(r"[+-]?\d+,\d+", a) and re.fullmatch(r"[+-]?\d*\.\d+", b):
            pred, gold = pred.replace(",", "."), gold.replace(",", ".")    # decimal comma: 2,74
    if max(pred.count("="), gold.count("=")) <= 1 and ("=" in _rhs(pred)) == ("=" in _rhs(gold)):
        pred, gold = _rhs(pred), _rhs(gold)                       # '(p, q) = (3, 2)' before it is a tuple
    return _compare(_structure(pred), _structure(gold), lambda a, b: _leaf_equal(a, b, symbolic))

# ----------------------------------------------------------------------------- sympy stage (worker process)
_MAX_DIGITS = 100_000   # refuse any sub-expression whose value could need more digits than this
_COMPLEX = re.compile(r"(?<![a-zA-Z\\])i(?![a-zA-Z])")
# ANTLR's Python runtime fills its prediction caches lazily: the first parse of each construct costs
# 20-200 ms, later ones about 1 ms. Parsing typical answers once at start-up moves that cost out of calls.
_WARMUP = r"""\frac{p_{1}}{q_{1}} \cdot \left(\frac{q_0}{p + q_0}\right)^{1/3};\frac{2}{5y^{3/4}} + \sqrt[3]{t^2 + 1}^2
\sin^2 x + \cos(2\theta) - \tan^{2}(y) + \sec x + \cot x;\begin{pmatrix} 1 & x \\ \sqrt{2} & 4 \end{pmatrix};\text{yes}
\frac{\sqrt{3}}{2} + 2\sqrt{2} - \pi;\frac{u^2}{9} + \frac{v^2}{4} = 1;\log_{2} 8 - \ln(e^{x}) + e^{-t};3x^{2} - 4xy + 1
\frac{w_{0}}{(1 + w/w_{0})^{2}};-\frac{3t^2}{4(t^2+1)^{3/2}};\frac{a_{1}}{b_{2}} \cdot c;\frac{2}{7\sqrt[3]{s}^2};3 + 4i
[0, 1) \cup (2, \infty);(s + 1)^{5/2} - q^{0.5};2 \cdot 3^{5} \cdot 7^2;y = -\frac{1}{2}x + 5;(1, -2, \frac{3}{4});m n p
\frac{\pi r}{h + r};y^{5}+3 y^{2}-7 y+1;1.5 \times 10^{-3};7! + \binom{6}{3};2a + 3b - 4c = 0;x * 2 + (-3)*x^2;2^4 3^2 5
7k^{3}(2+5k^{2});4 \sin b \cos a;\sqrt[4]{y}^{3};(t-1)(t+2)^{3};|x - 1| \leq 3;\cot(u)+\csc u;12m^5(3m^4-1);(2, 0.25)
\cos^2(t) - 1;p \geq 2;\{1, 2\};h(s) + 1;-x > -1;101_{2};(a, b];QRS2T;15\%;g(t)""".replace("\n", ";").split(";")

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
    """latex2sympy2_extended with no path from text to sympify/parse_expr: numbers are built with Fraction() and
    sympy's text parser is replaced, in the worker, by a function that raises."""
    import sympy.parsing.sympy_parser
    from latex2sympy2_extended import latex2sympy2
    from latex2sympy2_extended.math_normalization import NormalizationConfig, normalize_latex

    def refuse(*args, **kwargs):
        raise _Unsafe("text reached sympy's parser")
    sympy.parsing.sympy_parser.parse_expr = refuse
    def number(text):
        return sympy.Rational(Fraction(text.replace(",", "").replace(" ", "")))
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
    import sympy
    rng = random.Random(0)
    return [complex(sympy.N(expr, 20, subs={s: rng.uniform(0.5, 2.5) for s in symbols})) for _ in range(3)]

def _relation_equal(a, b):
    """Equations match when their lhs - rhs are proportional; inequalities when positively so."""
    def key(r):                                              # (expression, op) read as: expression op 0
        flip = r.rel_op in ("<", "<=")
        return (r.rhs - r.lhs if flip else r.lhs - r.rhs), r.rel_op.replace("<", ">")
    (ea, ka), (eb, kb) = key(a), key(b)
    symbols = sorted(ea.free_symbols, key=str)
    if ka != kb or ea.free_symbols != eb.free_symbols or not symbols:
        return False
    ratios = _at_points(ea / eb, symbols)
    same = all(abs(r - ratios[0]) <= 1e-9 * abs(ratios[0]) for r in ratios) and abs(ratios[0]) > 1e-12
    return same and (ka in ("==", "!=") or ratios[0].real > 0)

def _sym_equal(a, b):
    import sympy
    if a == b:
        return True
    if isinstance(a, sympy.Rel) and isinstance(b, sympy.Rel):
        return _relation_equal(a, b)
    if not isinstance(a, sympy.Expr) or not isinstance(b, sympy.Expr):
        return False
    symbols = sorted(a.free_symbols | b.free_symbols, key=str)
    values = zip(_at_points(a, symbols), _at_points(b, symbols))
    return all(cmath.isfinite(va) and abs(va - vb) <= 1e-9 * max(1.0, abs(va), abs(vb)) for va, vb in values)

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
            result = bool(_sym_equal(parse(pred), parse(gold)))
        except (Exception, RecursionError, MemoryError):
            result = False
        print(json.dumps(result), flush=True)

def _readline(proc, timeout):
    ready = timeout > 0 and select.select([proc.stdout], [], [], timeout)[0]
    return proc.stdout.readline() if ready else None

_workers, _workers_lock, _warmed_up = [], threading.Lock(), []  # [answering, spare]; non-empty once one started

def _ask_worker(pred, gold, deadline, startup_timeout=30.0):
    """Sympy's verdict from a persistent `python verify.py --worker` (no fork, no torch); a warm spare takes over
    when it overruns and is killed. Only a process's first start-up is not charged to the call's deadline."""
    if not _workers_lock.acquire(timeout=max(0.0, deadline - time.monotonic()) if _warmed_up else startup_timeout):
        return False
    try:
        return _ask_locked(pred, gold, deadline, startup_timeout)
    finally:
        _workers_lock.release()

def _ask_locked(pred, gold, deadline, startup_timeout):
    if _warmed_up and time.monotonic() >= deadline:             # out of time: no more sympy in this call
        return False                                            # (waits for a warming spare count too)
    _workers[:] = [proc for proc in _workers if proc.poll() is None]
    while len(_workers) < 2:
        _workers.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         env=dict(os.environ, OMP_NUM_THREADS="1")))
    proc = _workers[0]
    if not getattr(proc, "ready", False):
        wait = deadline - time.monotonic() if _warmed_up else startup_timeout
        proc.ready = _readline(proc, wait) == b"ready\n"
        if not proc.ready:                                      # still warming up: it stays for the next call
            return False
        if not _warmed_up:
            _warmed_up.append(True)
            deadline = max(deadline, time.monotonic() + 0.5)
    proc.stdin.write(json.dumps([pred, gold]).encode() + b"\n")
    proc.stdin.flush()
    answer = _readline(proc, deadline - time.monotonic())
    if answer is None:                                          # overran: kill it, the spare takes over
        proc.kill()
        proc.wait()
    return answer == b"true\n"

@atexit.register
def _close_workers():
    for proc in _workers:
        proc.kill()

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
    for before, after in _DAPO_SUBSTITUTIONS + [(removed, "") for removed in _DAPO_REMOVED]:
        answer = answer.replace(before, after)
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
        if mode == "dapo":
            return dapo_correct(response, gold)
        deadline = time.monotonic() + timeout
        if "\\boxed" in gold or "\\fbox" in gold or len(gold) > 200:    # a whole solution (MATH) as the gold
            gold = extract_answer(gold)
        pred = extract_answer(response)
        return bool(gold and pred) and _equivalent(pred, gold, lambda p, g: _ask_worker(p, g, deadline))
    except (Exception, RecursionError):
        return False

def verify_many(responses, golds, mode="default", timeout=1.0):
    """verify() over pairs: a plain loop, as most answers are decided without sympy in tens of microseconds."""
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
