"""Printers: sympy expressions to PyTorch source, to LaTeX and to plain text.

Two notations, never mixed: Python (``to_code``, also in terminals, docstrings and tables, never a
pseudo-Python look-alike such as ``max(0, h)``) and LaTeX (``to_latex``). They know
sympy's core (sums, products, powers, numbers, elementwise functions, the Heaviside mask)
and nothing about particular ops: a :class:`~symgrad.algebra.TensorOp` prints itself through its
primitive.
"""

from __future__ import annotations

import re

import sympy
from sympy.printing.latex import LatexPrinter
from sympy.printing.precedence import PRECEDENCE, precedence
from sympy.printing.pytorch import TorchPrinter

from .algebra import Size, TensorOp


def _number(value: sympy.Expr) -> str:
    """Numbers as Python literals: integers exactly, others as the nearest double (1/5 as 0.2). An
    integer beyond int64 (a float argument of 1e30 is the exact integer 10**30) is a double too:
    PyTorch cannot take a Python int that large."""
    if value.is_Integer and -(1 << 63) <= int(value) < (1 << 63):
        return str(int(value))
    return repr(float(value))  # a rational prints as its correctly rounded double, as Python would compute it


class CodePrinter(TorchPrinter):
    """PyTorch source, with the spacing a person would use."""

    def __init__(self):
        super().__init__({"fully_qualified_modules": True})

    def _print(self, expr, **kwargs):
        # sqrt(2), pi, ...: a float literal (torch.sqrt(2) is not valid), exact ints and rationals as above
        if isinstance(expr, sympy.Basic) and expr.is_number and not expr.is_Rational and expr.is_real:
            return repr(float(expr))
        return super()._print(expr, **kwargs)

    def _print_Symbol(self, expr):
        return expr.name

    def _print_Size(self, expr: Size):
        return expr._sympystr(self)

    def _print_TensorOp(self, expr: TensorOp):
        operands = [self._print(o) if _binds_tightly(o) else f"({self._print(o)})" for o in expr.operands]
        return expr.primitive.code(expr.primitive.printed(operands, expr.operands), expr.params, self._print)

    def _print_Integer(self, expr):
        return _number(expr)

    _print_Rational = _print_Integer
    _print_Half = _print_Integer
    _print_Float = _print_Integer
    _print_One = _print_Integer
    _print_NegativeOne = _print_Integer
    _print_Zero = _print_Integer

    def _print_Heaviside(self, expr):
        """Inside arithmetic, a mask takes its tensor's dtype: ``0.99 * (x > 0)`` would be float32."""
        argument = _step_argument(expr)
        tensors = sorted((s for s in argument.free_symbols if isinstance(s, sympy.Symbol)), key=str)
        typed = f".to({tensors[0].name}.dtype)" if tensors else ""
        return f"({self._print(argument)} > 0){typed}"

    def mask(self, expr) -> str:
        """A statement that is only a mask stays boolean: a quarter of the memory (an eighth in float64)."""
        return f"({self._print(_step_argument(expr))} > 0)"

    def _print_Derivative(self, expr):
        raise ValueError(f"refusing to emit an unevaluated derivative ({expr}): explicit code never calls autograd")

    def _print_Max(self, expr):
        return self._clamp(expr, "min", "torch.maximum")

    def _print_Min(self, expr):
        return self._clamp(expr, "max", "torch.minimum")

    def _clamp(self, expr, bound: str, pairwise: str) -> str:
        """Max(c, x) as torch.clamp(x, min=c); between tensors, torch.maximum (nested)."""
        numbers = [a for a in expr.args if a.is_number]
        tensors = [a for a in expr.args if not a.is_number]
        text = self._print(tensors[0])
        for other in tensors[1:]:
            text = f"{pairwise}({text}, {self._print(other)})"
        if numbers:
            text = f"torch.clamp({text}, {bound}={self._print(numbers[0])})"
        return text

    def _print_floor(self, expr):
        """``floor(n / k)`` of a size as Python's ``n // k``: a size stays an int."""
        numerator, denominator = sympy.fraction(sympy.together(expr.args[0]))
        if not denominator.is_Integer:
            return super()._print_floor(expr)
        return f"({self._grouped(numerator)} // {self._print(denominator)})"

    def _print_ceiling(self, expr):
        """``ceiling(n / k)`` of a size as ``-(-n // k)``."""
        numerator, denominator = sympy.fraction(sympy.together(expr.args[0]))
        if not denominator.is_Integer:
            return super()._print_ceiling(expr)
        return f"(-(-{self._grouped(numerator)} // {self._print(denominator)}))"

    def _grouped(self, expr) -> str:
        """``expr`` printed to stand before ``//``: in parentheses unless a size or a number."""
        text = self._print(expr)
        return text if isinstance(expr, Size) or expr.is_Atom else f"({text})"

    def _print_Mod(self, expr):
        dividend, divisor = expr.args
        return f"({self._print(dividend)}) % {self.parenthesize(divisor, PRECEDENCE['Mul'])}"

    def _print_Add(self, expr):
        terms = self._as_ordered_terms(expr, order=None)
        # `x - k`, not `-k + x`: positive terms first, otherwise sympy's order (stable)
        terms = sorted(terms, key=lambda term: bool(term.as_coeff_Mul()[0].is_number and term.as_coeff_Mul()[0] < 0))
        text = ""
        for index, term in enumerate(terms):
            coefficient, rest = term.as_coeff_Mul()
            negative = coefficient.is_number and coefficient < 0
            shown = self.parenthesize(-term if negative else term, PRECEDENCE["Add"], strict=False)
            if index == 0:
                text = ("-" + shown) if negative else shown
            else:
                text += (" - " if negative else " + ") + shown
        return text

    def _print_Mul(self, expr):
        coefficient, factors = expr.as_coeff_mul()
        numerator, denominator = [], []
        for factor in factors:
            if factor.is_Pow and factor.exp.is_number and factor.exp < 0:
                denominator.append(factor.base ** -factor.exp)
            else:
                numerator.append(factor)
        sign = ""
        if coefficient < 0:
            sign, coefficient = "-", -coefficient
        if coefficient != 1:
            numerator.insert(0, coefficient)
        if not numerator:
            numerator = [sympy.Integer(1)]
        pieces = [_number(f) if f.is_Number else self.parenthesize(f, PRECEDENCE["Mul"], strict=False)
                  for f in numerator]
        # a division by a plain number (a count: `x.numel()`) goes right after the coefficient, or after a
        # leading name: `2 / n * grad_loss * residual` scales a number, then multiplies the tensor once,
        # where `2 * grad_loss * residual / n` makes two passes over it (Python evaluates left to right)
        counts = [factor for factor in denominator if _is_count(factor)]
        if counts and len(numerator) > 1 and (numerator[0].is_Number or isinstance(numerator[0], sympy.Symbol)):
            denominator = [factor for factor in denominator if not _is_count(factor)]
            pieces[0] += "".join(" / " + self.parenthesize(factor, PRECEDENCE["Mul"], strict=True) for factor in counts)
        text = " * ".join(pieces)
        for factor in denominator:
            text += " / " + self.parenthesize(factor, PRECEDENCE["Mul"], strict=True)
        return sign + text

    def _print_Pow(self, expr):
        base, exponent = expr.args
        if exponent == sympy.S.Half:
            return f"torch.sqrt({self._print(base)})"
        if exponent == -1:
            return f"1 / {self.parenthesize(base, PRECEDENCE['Mul'], strict=True)}"
        return f"{self.parenthesize(base, PRECEDENCE['Pow'], strict=True)} ** {self.parenthesize(exponent, PRECEDENCE['Pow'])}"


def _is_count(expr) -> bool:
    """A number, or a tensor's element count: a Python number in the emitted code."""
    return expr.is_Number or (isinstance(expr, TensorOp) and expr.primitive.name in ("numel", "count_counted"))


def _step_argument(expr) -> sympy.Expr:
    argument, at_zero = expr.args if len(expr.args) == 2 else (expr.args[0], sympy.S.Half)
    if at_zero != 0:
        raise ValueError("only the Heaviside step with H(0) = 0 (PyTorch's kink convention) can be emitted")
    return argument


def _binds_tightly(expr: sympy.Expr) -> bool:
    """Whether ``expr`` can take a method call (``.sum()``) without parentheses."""
    return isinstance(expr, (sympy.Symbol, TensorOp, Size)) or (expr.is_Number and expr >= 0)


def _latex_name(name: str) -> str:
    """``x`` -> x, ``w1`` -> w_{1}, ``conv1`` -> \\mathrm{conv1}, ``grad_z`` -> \\overline{z}."""
    if name.startswith("grad_"):
        return rf"\overline{{{_latex_name(name[5:])}}}"
    if "_" in name:  # fc_w -> fc with subscript w; local_padded2_dim3 -> local with subscript padded2_dim3
        head, tail = name.split("_", 1)
        subscript = _latex_name(tail) if "_" not in tail else rf"\mathrm{{{tail.replace('_', chr(92) + '_')}}}"
        shown = _latex_name(head)
        if "_" in shown:  # m0_weight: m_{0} cannot take a second subscript
            shown = rf"\mathrm{{{head}}}"
        return rf"{shown}_{{{subscript}}}"
    match = re.fullmatch(r"([A-Za-z])(\d*)", name)
    if match:
        letter, digits = match.groups()
        return letter + (f"_{{{digits}}}" if digits else "")
    return rf"\mathrm{{{name}}}"


class MathPrinter(LatexPrinter):
    """LaTeX in which a product of tensors is the elementwise product ``\\odot``."""

    def __init__(self):
        super().__init__({"mul_symbol": "dot"})  # names are words: `2 \cdot loss \cdot residual`, never `2lossresidual`

    def _print_Symbol(self, expr, style="plain"):
        return _latex_name(expr.name)

    def _print_Size(self, expr: Size):
        return expr._latex(self)

    def _print_TensorOp(self, expr: TensorOp):
        operands = [self.parenthesize(o, PRECEDENCE["Mul"], strict=True) for o in expr.operands]
        return expr.primitive.latex(operands, expr.params, self._print)

    def _print_Heaviside(self, expr):
        return rf"\mathbb{{1}}\left[{self._print(expr.args[0])} > 0\right]"

    def _print_Mul(self, expr):
        coefficient, factors = expr.as_coeff_mul()
        if any(f.is_Pow and f.exp.is_number and f.exp < 0 for f in factors) or not factors:
            return super()._print_Mul(expr)
        body = r" \odot ".join(self.parenthesize(f, PRECEDENCE["Mul"], strict=False) for f in factors)
        if coefficient == 1:
            return body
        if coefficient == -1:
            return "-" + body
        return self._print(coefficient) + " " + body


code_printer = CodePrinter()
math_printer = MathPrinter()


def to_code(expr: sympy.Expr, boolean: bool = False) -> str:
    """Python source for ``expr``; ``boolean`` keeps a bare mask as a bool tensor (saved masks)."""
    if boolean and isinstance(expr, sympy.Heaviside):
        return code_printer.mask(expr)
    return code_printer.doprint(expr)


def to_latex(expr: sympy.Expr) -> str:
    return math_printer.doprint(expr)


__all__ = ["to_code", "to_latex", "precedence"]


# --- Layout: one printed statement across lines of at most WIDTH columns -------------------------

WIDTH = 100
"""The widest line a generated Python file has (comments, docstrings and code alike)."""

_PRIORITY = {"or": 1, "and": 2, "not": 3, "in": 4, "is": 4, "<": 4, ">": 4, "==": 4, ">=": 4, "<=": 4, "!=": 4,
             "|": 5, "^": 6, "&": 7, "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "//": 10, "%": 10, "@": 10}
"""Binary operators a long expression may break before, loosest first (``**`` never breaks)."""
_OPENING, _CLOSING = "([{", ")]}"
_UNSPLITTABLE = {"for", "if", "else", "lambda", "async", "await", "yield", ":="}
"""Where these appear at a level (a comprehension, a conditional), that level stays in one piece."""


def fit(code: str, indent: int = 4, comment: str = "", width: int = WIDTH) -> str:
    """``code``, one statement or expression as printed on one line, laid out black-style for a
    line that starts at column ``indent``: unchanged when it fits; otherwise split inside its
    brackets, the arguments together on the next line when they fit there, else one element per
    line with a trailing comma, and the closing bracket on its own line,
    and a long expression broken before its loosest operators inside parentheses. Python's own
    tokenizer finds the brackets, so a string literal is never cut. The first line is returned
    without its indent (the template writes it), the others with theirs. ``comment`` goes after
    the code when both fit on one line, else on the lines above it."""
    if comment:
        if indent + len(code) + 4 + len(comment) <= width:
            return f"{code}  # {comment}"
        return comment_lines(comment, indent, width) + "\n" + " " * indent + fit(code, indent, "", width)
    if indent + len(code) <= width:
        return code
    return "\n".join(_Layout(code, width).statement(indent))[indent:]


def entry(key: str, value: str, indent: int = 8, width: int = WIDTH) -> str:
    """``"key": value,``, a mapping's entry at column ``indent``; when too long, its value in
    parentheses on the next line, as black writes it. The first line without its indent."""
    line = f'"{key}": {value},'
    if indent + len(line) <= width:
        return line
    pad = " " * indent
    if value.startswith("(") and _closing(value) == len(value) - 1:  # a tuple: its own parentheses
        value = value[1:-1]
    return f'"{key}": (\n{pad}    {fit(value, indent + 4, width=width)}\n{pad}),'


def literal_lines(text: str, indent: int = 8, width: int = WIDTH) -> str:
    """``text`` as adjacent string literals (Python joins them), cut after spaces so that each line
    at column ``indent`` fits where its words allow: a long message in a generated table. The first
    line without its indent."""
    import json

    pieces, room = [""], width - indent - 2
    for word in text.split(" "):
        if pieces[-1] and len(json.dumps(pieces[-1] + word)) - 2 > room:
            pieces.append("")
        pieces[-1] += word + " "
    return ("\n" + " " * indent).join(json.dumps(piece) for piece in [*pieces[:-1], pieces[-1][:-1]])


def _closing(text: str) -> int:
    """The index of the bracket that closes ``text``'s first one (-1: none)."""
    depth = 0
    for index, character in enumerate(text):
        depth += character in "([{"
        depth -= character in ")]}"
        if depth == 0:
            return index
    return -1


def comment_lines(comment: str, indent: int = 4, width: int = WIDTH) -> str:
    """``# comment``, wrapped at word boundaries to ``width``; the first line without its indent. A word
    wider than the line (``table_of_a_long_module_path[index_of_a_long_module_path]:``) is cut after an
    opening bracket or a comma, or before a dot, where it fits: a comment never runs past ``width``."""
    room = max(width - indent - 2, 20)
    words = []
    for word in comment.split(" "):
        while len(word) > room:
            cuts = [at + 1 for at, character in enumerate(word[:room]) if character in "[(,"] + [
                at for at, character in enumerate(word[:room + 1]) if character == "." and at > 0]
            if not cuts:
                break
            words.append(word[:max(cuts)])
            word = word[max(cuts):]
        words.append(word)
    return prose(" ".join(words), indent + 2, width, prefix="# ")


def prose(text: str, indent: int = 4, width: int = WIDTH, prefix: str = "") -> str:
    """Prose (a docstring's sentence, a comment) wrapped at spaces to ``width`` columns when it
    starts at column ``indent``; the first line without its indent. A word is never broken."""
    import textwrap

    lines = textwrap.wrap(text, width=max(width - indent - len(prefix), 20), break_long_words=False,
                          break_on_hyphens=False) or [""]
    pad = " " * (indent - len(prefix) if prefix else indent)
    return ("\n" + pad).join(prefix + line for line in lines) if prefix else ("\n" + pad).join(lines)


class _Layout:
    """The tokens of one line and the bracket each opening bracket closes with."""

    def __init__(self, code: str, width: int):
        import io
        import tokenize

        self.code, self.width = code, width
        self.tokens: list[tuple[str, int, int]] = []  # (text, start column, end column)
        fstring_start = getattr(tokenize, "FSTRING_START", None)  # Python 3.12+: an f-string is many tokens
        depth = 0
        for token in tokenize.generate_tokens(io.StringIO(code).readline):
            if token.start[0] != 1 or token.type in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER):
                continue
            if depth:  # inside an f-string: one piece with its start
                text, start, _ = self.tokens[-1]
                self.tokens[-1] = (text, start, token.end[1])
                depth += (token.type == fstring_start) - (token.type == getattr(tokenize, "FSTRING_END", None))
                continue
            if token.type == tokenize.COMMENT:
                raise ValueError(f"fit() lays out code without comments (pass comment=): {code!r}")
            self.tokens.append((token.string, token.start[1], token.end[1]))
            depth = int(token.type == fstring_start)
        self.closes: dict[int, int] = {}
        stack = []
        for index, (text, _, _) in enumerate(self.tokens):
            if text in _OPENING:
                stack.append(index)
            elif text in _CLOSING:
                self.closes[stack.pop()] = index

    def text(self, start: int, stop: int) -> str:
        return self.code[self.tokens[start][1]:self.tokens[stop - 1][2]] if start < stop else ""

    def top(self, start: int, stop: int) -> list[int]:
        """The token indices of ``start:stop`` outside any bracket inside it."""
        found, index = [], start
        while index < stop:
            found.append(index)
            index = self.closes.get(index, index) + 1
        return found

    def fits(self, indent: int, *parts: str) -> bool:
        return indent + sum(map(len, parts)) <= self.width

    def statement(self, indent: int) -> list[str]:
        """The whole line: an assignment, ``return``/``del``/``raise`` and what follows, or a bare
        expression (a ``def`` line included)."""
        count = len(self.tokens)
        top = self.top(0, count)
        equals = next((index for index in top if self.tokens[index][0] == "="), None)
        if equals is not None:
            head, start = self._target(0, equals, indent, count), equals + 1
        elif self.tokens[0][0] in ("if", "elif", "while") and self.tokens[-1][0] == ":":  # black's
            return ([" " * indent + self.tokens[0][0] + " ("] + self.expression(1, count - 1, indent + 4)
                    + [" " * indent + "):"])
        elif self.tokens[0][0] in ("return", "del", "raise", "assert"):
            head, start = [self.tokens[0][0] + " "], 1
        else:
            return self.expression(0, count, indent)
        lines = [" " * indent + line for line in head[:-1]]
        first = head[-1]
        return lines + self._value(start, count, indent, first)

    def _target(self, start: int, equals: int, indent: int, stop: int) -> list[str]:
        """``a = `` or, for a target tuple too long for one line with the start of its value (up to
        the value's first bracket), ``(``, the names, ``) = ``."""
        target = self.text(start, equals)
        opening = next((index for index in self.top(equals + 1, stop) if index in self.closes), stop - 1)
        if self.fits(indent, target, " = ", self.text(equals + 1, opening + 1)) or not self._commas(start, equals):
            return [target + " = "]
        inner = self.elements(start, equals, indent + 4)
        return ["("] + [line[indent:] for line in inner] + [") = "]

    def _value(self, start: int, stop: int, indent: int, head: str) -> list[str]:
        """The right-hand side after ``head``: a tuple or an operator expression in parentheses,
        anything else split at its own brackets."""
        pad = " " * indent
        if self.fits(indent, head, self.text(start, stop)):
            return [pad + head + self.text(start, stop)]
        if self._commas(start, stop) or self._operators(start, stop):
            inner = (self.elements(start, stop, indent + 4) if self._commas(start, stop)
                     else self.expression(start, stop, indent + 4))
            return [pad + head + "("] + inner + [pad + ")"]
        return self.narrowest(self.trailers(start, stop, indent, head, ""),
                              self.parenthesized(start, stop, indent, head, ""))

    def _commas(self, start: int, stop: int) -> list[int]:
        top = self.top(start, stop)
        if any(self.tokens[index][0] in _UNSPLITTABLE for index in top):
            return []
        return [index for index in top if self.tokens[index][0] == ","]

    def _operators(self, start: int, stop: int) -> list[int]:
        """Top-level binary operators of the loosest priority present (a unary sign is none)."""
        top = self.top(start, stop)
        if any(self.tokens[index][0] in _UNSPLITTABLE for index in top):
            return []
        binary = []
        for position, index in enumerate(top):
            text = self.tokens[index][0]
            previous = self.tokens[top[position - 1]][0] if position else None
            if (text in _PRIORITY and position and previous not in _PRIORITY and previous not in ("=", ",")
                    and not (text == "in" and previous == "not") and not (text == "not" and previous == "is")):
                binary.append(index)
        if not binary:
            return []
        loosest = min(_PRIORITY[self.tokens[index][0]] for index in binary)
        return [index for index in binary if _PRIORITY[self.tokens[index][0]] == loosest]

    def elements(self, start: int, stop: int, indent: int) -> list[str]:
        """``start:stop`` split at its top-level commas: one element a line, each with its comma; a
        list of plain names, numbers and ``name=number`` (a signature, a tuple of saved values, a
        kernel's arguments) fills its lines instead, as a person writes a long list of names."""
        commas = self._commas(start, stop)
        bounds = list(zip([start] + [comma + 1 for comma in commas], commas + [stop]))
        names = [self.text(begin, end) for begin, end in bounds if begin < end]
        if (len(names) > 2 and all(self._plain(begin, end) for begin, end in bounds if begin < end)
                and all(indent + len(name) < self.width for name in names)):
            lines = [" " * indent]
            for name in names:
                if len(lines[-1]) > indent and len(lines[-1]) + 1 + len(name) + 1 > self.width:
                    lines.append(" " * indent)
                lines[-1] += ("" if len(lines[-1]) == indent else " ") + name + ","
            return lines
        lines, begin = [], start
        for comma in self._commas(start, stop) + [stop]:
            if begin < comma:
                lines += self.expression(begin, comma, indent, tail=",")
            begin = comma + 1
        return lines

    def _plain(self, begin: int, end: int) -> bool:
        """A name, a number, or ``name=`` one of them: an element a list may share a line with."""
        def atom(index: int) -> bool:
            text = self.tokens[index][0]
            return text.isidentifier() or text.replace(".", "", 1).replace("e-", "", 1).isdigit()

        def atoms(first: int, last: int) -> bool:  # an atom, or a bracketed list of them ([True, True, False])
            if last - first == 1:
                return atom(first)
            return (self.tokens[first][0] == "[" and self.closes.get(first) == last - 1
                    and all(atom(index) if (index - first) % 2 else self.tokens[index][0] == ","
                            for index in range(first + 1, last - 1)))

        def entry(first: int, last: int) -> bool:  # a mapping's entry: p["conv1.weight"]
            return (last - first == 4 and self.tokens[first][0].isidentifier() and self.tokens[first + 1][0] == "["
                    and self.tokens[first + 2][0][:1] in "\"'" and self.tokens[first + 3][0] == "]")

        if end - begin >= 3 and self.tokens[begin + 1][0] == "=":
            return self.tokens[begin][0].isidentifier() and (atoms(begin + 2, end) or entry(begin + 2, end))
        return atoms(begin, end) or entry(begin, end)

    def expression(self, start: int, stop: int, indent: int, head: str = "", tail: str = "") -> list[str]:
        """An expression inside brackets (so it may break anywhere): whole if it fits, else before
        its loosest operators, else at its own brackets."""
        pad = " " * indent
        if self.fits(indent, head, self.text(start, stop), tail):
            return [pad + head + self.text(start, stop) + tail]
        top = self.top(start, stop)
        if len(top) > 2 and self.tokens[top[1]][0] in ("=", ":") and (
                self.tokens[start][0].isidentifier() or self.tokens[top[1]][0] == ":") and not any(
                self.tokens[index][0] in ("for", "async") for index in top):  # no comprehension
            # name=value, a mapping's "key": value: the value's own layout after them
            keyword = self.text(start, top[1] + 1) + ("" if self.tokens[top[1]][0] == "=" else " ")
            if self._operators(top[1] + 1, stop) or stop - top[1] == 2:
                return self.parenthesized(top[1] + 1, stop, indent, head + keyword, tail)
            return self.narrowest(self.trailers(top[1] + 1, stop, indent, head + keyword, tail),
                                  self.parenthesized(top[1] + 1, stop, indent, head + keyword, tail))
        operators = self._operators(start, stop)
        if operators:
            lines, begin, prefix = [], start, head
            for operator in operators + [stop]:
                lines += self.expression(begin, operator, indent, prefix, tail if operator == stop else "")
                if operator < stop:
                    prefix, begin = self.tokens[operator][0] + " ", operator + 1
            return lines
        return self.trailers(start, stop, indent, head, tail)

    def parenthesized(self, start: int, stop: int, indent: int, head: str, tail: str) -> list[str]:
        """``head(``, the expression on the lines below, ``)tail``: where a name too long to share
        its line with the start of its value (a 60-character key or keyword) needs the value below."""
        if self.fits(indent, head, self.text(start, stop), tail):
            return [" " * indent + head + self.text(start, stop) + tail]
        return ([" " * indent + head + "("] + self.expression(start, stop, indent + 4)
                + [" " * indent + ")" + tail])

    def narrowest(self, *layouts: list[str]) -> list[str]:
        """The first of ``layouts`` that fits the width, else the one with the narrowest widest line."""
        fitting = [lines for lines in layouts if max(map(len, lines)) <= self.width]
        return fitting[0] if fitting else min(layouts, key=lambda lines: max(map(len, lines)))

    def trailers(self, start: int, stop: int, indent: int, head: str, tail: str) -> list[str]:
        """An atom and its calls and subscripts, split inside the last bracket pair whose opening
        and closing lines both fit (the last non-empty one if none does)."""
        pad = " " * indent
        groups = [index for index in self.top(start, stop)
                  if index in self.closes and self.closes[index] > index + 1]
        if not groups:
            return [pad + head + self.text(start, stop) + tail]
        chosen = groups[-1]
        for opening in reversed(groups):
            closing = self.closes[opening]
            if (self.fits(indent, head, self.text(start, opening + 1))
                    and self.fits(indent, self.text(closing, stop), tail)):
                chosen = opening
                break
        closing = self.closes[chosen]
        body = self.text(chosen + 1, closing)
        if self.fits(indent + 4, body):  # black's first choice: the arguments together on their own line
            inner = [" " * (indent + 4) + body]
        else:
            inner = (self.elements(chosen + 1, closing, indent + 4) if self._commas(chosen + 1, closing)
                     else self.expression(chosen + 1, closing, indent + 4))
        return ([pad + head + self.text(start, chosen + 1)] + inner
                + [pad + self.text(closing, stop) + tail])


def hanging(names: list[str], head: str, tail: str, indent: int = 4, plain: str | None = None,
            width: int = 100) -> str:
    """``plain`` where it fits on one line at column ``indent``, else ``head``, the ``names`` as
    many to a line as fit, aligned under the first, and ``tail``: ``(x, p, conv1,`` over
    `` relu) = saved``. The first line without its indent."""
    one = plain if plain is not None else head + ", ".join(names) + tail
    if indent + len(one) <= width:
        return one
    pad = indent + len(head)
    lines = [head]
    for index, name in enumerate(names):
        item = name + (tail if index == len(names) - 1 else ",")
        if lines[-1] == head or (pad if len(lines) > 1 else indent) + len(lines[-1]) + 1 + len(item) <= width:
            lines[-1] += ("" if lines[-1] == head else " ") + item
        else:
            lines.append(" " * pad + item)
    return "\n".join(lines)
