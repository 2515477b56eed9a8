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
from .layout import Layout


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
                denominator.append(factor.base**-factor.exp)
            else:
                numerator.append(factor)
        sign = ""
        if coefficient < 0:
            sign, coefficient = "-", -coefficient
        if coefficient != 1:
            numerator.insert(0, coefficient)
        if not numerator:
            numerator = [sympy.Integer(1)]
        pieces = [
            _number(f) if f.is_Number else self.parenthesize(f, PRECEDENCE["Mul"], strict=False) for f in numerator
        ]
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
    return "\n".join(Layout(code, width).statement(indent))[indent:]


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

    def wide(piece: str) -> bool:  # the piece's literal, quotes included, past the line
        return indent + len(json.dumps(piece, ensure_ascii=False)) > width

    words = text.split(" ")
    pieces = [""]
    for word in [word + " " for word in words[:-1]] + words[-1:]:  # each keeps its space
        if pieces[-1] and wide(pieces[-1] + word):
            pieces.append("")
        if not pieces[-1] and wide(word) and word.endswith(" "):  # its space opens the next line
            pieces[-1:] = [word[:-1], ""]
            word = " "
        pieces[-1] += word
    return ("\n" + " " * indent).join(json.dumps(piece, ensure_ascii=False) for piece in pieces)


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
                at for at, character in enumerate(word[: room + 1]) if character == "." and at > 0
            ]
            if not cuts:
                break
            words.append(word[: max(cuts)])
            word = word[max(cuts) :]
        words.append(word)
    return prose(" ".join(words), indent + 2, width, prefix="# ")


def prose(text: str, indent: int = 4, width: int = WIDTH, prefix: str = "") -> str:
    """Prose (a docstring's sentence, a comment) wrapped at spaces to ``width`` columns when it
    starts at column ``indent``; the first line without its indent. A word is never broken."""
    import textwrap

    lines = textwrap.wrap(
        text, width=max(width - indent - len(prefix), 20), break_long_words=False, break_on_hyphens=False
    ) or [""]
    pad = " " * (indent - len(prefix) if prefix else indent)
    return ("\n" + pad).join(prefix + line for line in lines) if prefix else ("\n" + pad).join(lines)


def hanging(names: list[str], head: str, tail: str, indent: int = 4, plain: str | None = None, width: int = 100) -> str:
    """``plain`` where it fits on one line at column ``indent``, else ``head``, the ``names`` as
    many to a line as fit, aligned under the first, and ``tail``: ``(x, p, conv1,`` over
    `` relu) = saved``. The first line without its indent."""
    one = plain if plain is not None else head + ", ".join(names) + tail
    if indent + len(one) <= width:
        return one
    pad = indent + len(head)
    items = [name + (tail if index == len(names) - 1 else ",") for index, name in enumerate(names)]
    lines = [head]
    if head.endswith(("(", "[", "{")) and pad + max(map(len, items), default=0) > width:
        # a long head (``return output_of_a_long_name, [``): the names from the next line, 4 columns in
        pad = indent + 4
        lines.append(" " * pad)
    for item in items:
        # a first line starts at column ``indent``, the others carry their own ``pad`` of spaces
        if (
            lines[-1] in (head, " " * pad)
            or (0 if len(lines) > 1 else indent) + len(lines[-1]) + 1 + len(item) <= width
        ):
            lines[-1] += ("" if lines[-1] in (head, " " * pad) else " ") + item
        else:
            lines.append(" " * pad + item)
    return "\n".join(lines)
