"""The engine under ``printing.fit``: one printed statement's tokens (Python's tokenizer, so no
string literal is cut) laid out black-style across lines of at most ``width`` columns."""

from __future__ import annotations

import keyword

_PRIORITY = {
    "or": 1,
    "and": 2,
    "not": 3,
    "in": 4,
    "is": 4,
    "<": 4,
    ">": 4,
    "==": 4,
    ">=": 4,
    "<=": 4,
    "!=": 4,
    "|": 5,
    "^": 6,
    "&": 7,
    "<<": 8,
    ">>": 8,
    "+": 9,
    "-": 9,
    "*": 10,
    "/": 10,
    "//": 10,
    "%": 10,
    "@": 10,
}
"""Binary operators a long expression may break before, loosest first (``**`` never breaks)."""
_OPENING, _CLOSING = "([{", ")]}"
_UNSPLITTABLE = {"for", "if", "else", "lambda", "async", "await", "yield", ":="}
"""Where these appear at a level (a comprehension, a conditional), that level stays in one piece."""


class Layout:
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
        self.within: list[str] = []  # each token's innermost enclosing bracket ("" at the top)
        stack = []
        for index, (text, _, _) in enumerate(self.tokens):
            self.within.append(self.tokens[stack[-1]][0] if stack else "")
            if text in _OPENING:
                stack.append(index)
            elif text in _CLOSING:
                self.closes[stack.pop()] = index

    def text(self, start: int, stop: int) -> str:
        return self.code[self.tokens[start][1] : self.tokens[stop - 1][2]] if start < stop else ""

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
            return (
                [" " * indent + self.tokens[0][0] + " ("]
                + self.expression(1, count - 1, indent + 4)
                + [" " * indent + "):"]
            )
        elif self.tokens[0][0] == "assert" and any(self.tokens[index][0] == "," for index in top):
            return self._assert(next(index for index in top if self.tokens[index][0] == ","), indent)
        elif self.tokens[0][0] in ("return", "del", "raise", "assert"):
            head, start = [self.tokens[0][0] + " "], 1
        else:
            return self.expression(0, count, indent)
        lines = [" " * indent + line for line in head[:-1]]
        first = head[-1]
        return lines + self._value(start, count, indent, first)

    def _assert(self, comma: int, indent: int) -> list[str]:
        """``assert condition, message``: the condition laid out alone (in parentheses of its own,
        never one tuple with the message: a tuple is always true), then the message after it, or
        in parentheses below when it does not fit there."""
        pad, count = " " * indent, len(self.tokens)
        lines = self._value(1, comma, indent, "assert ")
        message = self.text(comma + 1, count)
        if self.fits(0, lines[-1], ", ", message):
            return lines[:-1] + [lines[-1] + ", " + message]
        return lines[:-1] + [lines[-1] + ", ("] + self.expression(comma + 1, count, indent + 4) + [pad + ")"]

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
            inner = (
                self.elements(start, stop, indent + 4)
                if self._commas(start, stop)
                else self.expression(start, stop, indent + 4)
            )
            return [pad + head + "("] + inner + [pad + ")"]
        return self.narrowest(
            self.trailers(start, stop, indent, head, ""), self.parenthesized(start, stop, indent, head, "")
        )

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
            if (
                text in _PRIORITY
                and position
                and previous not in _PRIORITY
                and previous not in ("=", ",")
                and not (text == "in" and previous == "not")
                and not (text == "not" and previous == "is")
            ):
                binary.append(index)
        if not binary:
            return []
        loosest = min(_PRIORITY[self.tokens[index][0]] for index in binary)
        return [index for index in binary if _PRIORITY[self.tokens[index][0]] == loosest]

    def elements(self, start: int, stop: int, indent: int) -> list[str]:
        """``start:stop`` split at its top-level commas: one element a line, each with its comma; a
        list of plain names, numbers and ``name=number`` (a signature, a tuple of saved values, a
        kernel's arguments) or of short calls fills its lines instead, as a person writes a long
        list of names."""
        commas = self._commas(start, stop)
        bounds = list(zip([start] + [comma + 1 for comma in commas], commas + [stop]))
        names = [self.text(begin, end) for begin, end in bounds if begin < end]
        if (
            len(names) > 2
            and all(self._plain(begin, end) or self._short(begin, end) for begin, end in bounds if begin < end)
            and all(indent + len(name) < self.width for name in names)
        ):
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

    def _short(self, begin: int, end: int) -> bool:
        """A short element with no operator, condition or comprehension of its own (``x.to(dtype)``,
        ``kernel_size=3``): a kernel's arguments share lines as a person writes them."""
        return (
            len(self.text(begin, end)) <= 44
            and not self._operators(begin, end)
            and not any(self.tokens[index][0] in _UNSPLITTABLE for index in range(begin, end))
        )

    def _plain(self, begin: int, end: int) -> bool:
        """A name, a number, or ``name=`` one of them: an element a list may share a line with."""

        def atom(index: int) -> bool:
            text = self.tokens[index][0]
            return text.isidentifier() or text.replace(".", "", 1).replace("e-", "", 1).isdigit()

        def atoms(first: int, last: int) -> bool:  # an atom, or a bracketed list of them ([True, True, False])
            if last - first == 1:
                return atom(first)
            return (
                self.tokens[first][0] == "["
                and self.closes.get(first) == last - 1
                and all(
                    atom(index) if (index - first) % 2 else self.tokens[index][0] == ","
                    for index in range(first + 1, last - 1)
                )
            )

        def entry(first: int, last: int) -> bool:  # a mapping's entry: p["conv1.weight"]
            return (
                last - first == 4
                and self.tokens[first][0].isidentifier()
                and self.tokens[first + 1][0] == "["
                and self.tokens[first + 2][0][:1] in "\"'"
                and self.tokens[first + 3][0] == "]"
            )

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
        if (
            len(top) > 2
            and (
                self.tokens[top[1]][0] == "="
                and self.tokens[start][0].isidentifier()
                or self.tokens[top[1]][0] == ":"
                and self.within[start] == "{"
            )
            and not any(self.tokens[index][0] in ("for", "async") for index in top)
        ):  # no comprehension
            # name=value, a dict display's "key": value (not a slice's bounds, not an annotated
            # parameter, not a lambda): the value's own layout after them
            keyword = self.text(start, top[1] + 1) + ("" if self.tokens[top[1]][0] == "=" else " ")
            if self._operators(top[1] + 1, stop) or stop - top[1] == 2:
                return self.parenthesized(top[1] + 1, stop, indent, head + keyword, tail)
            return self.narrowest(
                self.trailers(top[1] + 1, stop, indent, head + keyword, tail),
                self.parenthesized(top[1] + 1, stop, indent, head + keyword, tail),
            )
        colons = [index for index in top if self.tokens[index][0] == ":"] if self.within[start] == "[" else []
        if colons and not any(self.tokens[index][0] in _UNSPLITTABLE for index in top):
            # a slice: a line for each bound, before its colon (an empty bound adds its colon)
            lines, begin, prefix = [], start, head
            for colon in colons + [stop]:
                if begin < colon:
                    lines += self.expression(begin, colon, indent, prefix, tail if colon == stop else "")
                    prefix = ""
                elif colon == stop:
                    lines.append(pad + prefix + tail)
                prefix, begin = prefix + ":", colon + 1
            return lines
        conditional = [index for index in top if self.tokens[index][0] in ("if", "else")]
        if [self.tokens[index][0] for index in conditional] == ["if", "else"] and not any(
            self.tokens[index][0] in ("for", "async", "lambda") for index in top
        ):
            # one conditional expression: its value, its condition and its alternative a line each
            when, otherwise = conditional
            return (
                self.expression(start, when, indent, head)
                + self.expression(when + 1, otherwise, indent, "if ")
                + self.expression(otherwise + 1, stop, indent, "else ", tail)
            )
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
        return [" " * indent + head + "("] + self.expression(start, stop, indent + 4) + [" " * indent + ")" + tail]

    def narrowest(self, *layouts: list[str]) -> list[str]:
        """The first of ``layouts`` that fits the width, else the one with the narrowest widest line."""
        fitting = [lines for lines in layouts if max(map(len, lines)) <= self.width]
        return fitting[0] if fitting else min(layouts, key=lambda lines: max(map(len, lines)))

    def trailers(self, start: int, stop: int, indent: int, head: str, tail: str) -> list[str]:
        """An atom and its calls and subscripts, split inside the last bracket pair whose opening
        and closing lines both fit (the last non-empty one if none does)."""
        pad = " " * indent
        groups = [index for index in self.top(start, stop) if index in self.closes and self.closes[index] > index + 1]
        if not groups:
            return [pad + head + self.text(start, stop) + tail]
        chosen = groups[-1]
        for opening in reversed(groups):
            closing = self.closes[opening]
            if self.fits(indent, head, self.text(start, opening + 1)) and self.fits(
                indent, self.text(closing, stop), tail
            ):
                chosen = opening
                break
        closing = self.closes[chosen]
        body = self.text(chosen + 1, closing)
        if self.fits(indent + 4, body):  # black's first choice: the arguments together on their own line
            inner = [" " * (indent + 4) + body]
        else:
            inner = (
                self.elements(chosen + 1, closing, indent + 4)
                if self._commas(chosen + 1, closing)
                else self.expression(chosen + 1, closing, indent + 4)
            )
        closed = self.text(closing, stop) + tail
        if self._hugs(chosen) and self.fits(0, inner[-1].removesuffix(","), closed):
            # a call's closing parenthesis on its last argument's line, as a person writes it
            return [pad + head + self.text(start, chosen + 1)] + inner[:-1] + [inner[-1].removesuffix(",") + closed]
        return [pad + head + self.text(start, chosen + 1)] + inner + [pad + closed]

    def _hugs(self, opening: int) -> bool:
        """Whether the bracket at ``opening`` is a call's (after a name or a bracket, in a statement
        that opens no block: a ``def``'s parameters keep black's own line for ``):``), whose closing
        parenthesis then hugs its last argument (its trailing comma dropped: a call's, never a tuple's)."""
        before = self.tokens[opening - 1][0] if opening else ""
        return (
            self.tokens[opening][0] == "("
            and (before.isidentifier() and not keyword.iskeyword(before) or before in (")", "]"))
            and self.tokens[0][0] not in ("def", "class", "if", "elif", "while", "for", "with", "async")
        )
