"""A branch the traced code took on the input's size, checked at run time: the input passes through unchanged
where the comparison comes out as it did when traced, and the call stops with a one-line error where not.

timm's MobileViT block interpolates its map up to a multiple of the patch size only where ``math.ceil(H /
patch_h) * patch_h != H`` (mobilevit.py:248); a spec traced where the map was a multiple holds no
interpolation, and run where it is not, it would compute something else. The tracer records each comparison of
sizes the code read (``symgrad/trace/sizes.py``) whose operands follow the input's size, as this layer on the
node whose sizes it reads: ``left`` and ``right`` are sizes (``{like: NODE, size: 'ceil(shape[2] / 2) * 2'}``)
or numbers, ``relation`` one of eq, ne, lt, le, gt, ge, ``holds`` what it gave when traced, ``line`` where.
A size the spec holds as traced without a branch there (``static_sizes=True``; dim 1 of an input a number
follows) is the same check with ``why`` saying so. The gradient passes through: ``grad_input = grad``.
"""

from __future__ import annotations

from ..algebra import LINEAR, primitive
from ..spec_values import Like
from .base import Checker, Forward, Operand, Param, ParamContext, Rule, Sample, Spelling, ints

RELATIONS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}

SIZE_CHECK = '''def _size_check(value, holds, line, text, why=""):
    """``value`` where the sizes the traced code read come out as traced; else a one-line error."""
    if not holds:
        what = f"{text} as traced ({why})" if why else f"the traced code branches on {text}"
        raise ValueError(f"{line}: {what}, which comes out otherwise at these sizes (fix: call "
                         "it at sizes where it comes out as traced, or trace it at these sizes too "
                         "and generate that spec)")
    return value
'''
"""Emitted once into each module that checks a branch (``Primitive.helper``)."""


def _code(operands, params, show):
    relation = RELATIONS[params["relation"]]
    test = f"({show(params['left'])}) {relation} ({show(params['right'])})"
    holds = test if params["holds"] else f"not {test}"
    if params["why"]:  # a size the spec holds as traced (static_sizes=True, a number that follows it)
        return f"_size_check({operands[0]}, {holds}, {params['line']!r}, {params['text']!r}, {params['why']!r})"
    text = f"{params['text']} ({params['holds']} when traced)"
    return f"_size_check({operands[0]}, {holds}, {params['line']!r}, {text!r})"


primitive("size_check", code=_code, helper=SIZE_CHECK, tangent=LINEAR, latex=lambda operands, params, show: operands[0])


def _size(value, context: ParamContext):
    """A size read at run time (``{like: x, size: 'ceil(shape[2] / 2) * 2'}``) or an int."""
    if isinstance(value, Like):
        if value.dims is None and value.size is None:
            raise context.fail(
                f"is {value}, which names no dim", f"write `{context.name}: {{like: {value.node}, dims: [2]}}`"
            )
        return value.size_at(0)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return ints(value, context)[0]


def _choice(value, context: ParamContext):
    if value not in RELATIONS:
        raise context.fail(f"is {value!r}", f"write one of {', '.join(RELATIONS)}")
    return value


def _flag(value, context: ParamContext):
    if not isinstance(value, bool):
        raise context.fail(f"is {value!r}, not true or false", "write holds: true or holds: false")
    return value


def _text(value, context: ParamContext):
    if not isinstance(value, str):
        raise context.fail(f"is {value!r}, not a string", "write e.g. line: 'model.py:12'")
    return value


class SizeCheck(Rule):
    op = "size_check"
    traced_elsewhere = (
        "a comparison of sizes the code read (new_h != H, H > 7): the tracer's size handling "
        "(symgrad/trace/sizes.py, size_checks.py) writes it on the node whose sizes it reads"
    )
    operands = (Operand("input", from_in=True),)
    keeps_input_name = True
    params = {
        "left": Param(None, _size),
        "right": Param(None, _size),
        "relation": Param("eq", _choice),
        "holds": Param(True, _flag),
        "line": Param("", _text),
        "text": Param("", _text),
        "why": Param("", _text),
    }
    summary = "the input unchanged, where a comparison of sizes comes out as it did when traced; else an error"

    def reference(self, arguments, params):
        return arguments["input"]

    def reference_params(self, params):
        return {}

    def infer_shape(self, shapes, params, check: Checker):
        check.require(
            params["left"] is not None and params["right"] is not None,
            "needs left and right",
            "write e.g. `left: {like: x, size: 'ceil(shape[2] / 2) * 2'}, right: {like: x, dims: [2]}`",
        )
        left, right = params["left"], params["right"]
        if isinstance(left, int) and isinstance(right, int):  # numbers: the comparison at these sizes
            comes = {
                "eq": left == right,
                "ne": left != right,
                "lt": left < right,
                "le": left <= right,
                "gt": left > right,
                "ge": left >= right,
            }[params["relation"]]
            check.require(
                comes == params["holds"],
                f"{params['text']} is {comes} at these sizes, {params['holds']} when traced ({params['line']})",
                "use sizes where the traced branch holds",
            )
        elif params["relation"] == "eq" if params["holds"] else params["relation"] == "ne":
            check.equal(
                left,
                right,
                f"{params['text']} does not hold ({params['line']})",
                "use sizes where the traced branch holds",
            )
        return tuple(shapes["input"])

    def forward(self, node):
        from ..algebra import op

        return Forward(op("size_check", node.operands["input"], **node.params))

    def pullback(self, node, grad, wanted):
        return {"input": grad}

    def table_row(self):
        return (
            self.op,
            "out = input, where left <relation> right comes out as when traced (else an error)",
            "grad_input = grad",
        )


RULES = [SizeCheck()]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "size_check": [
        Sample(
            "size_check-even-width",
            {"x": [2, 4], "y": [2, 4]},
            [
                {
                    "op": "size_check",
                    "in": "x",
                    "left": {"like": "x", "size": "2 * ceil(shape[1] / 2)"},
                    "right": {"like": "x", "dims": [1]},
                    "relation": "ne",
                    "holds": False,
                    "line": "m.py:3",
                    "text": "2*ceil(x.shape[1]/2) != x.shape[1]",
                    "out": "checked",
                },
                {"op": "mul", "in": "checked", "other": 2},
            ],
            ["x"],
        ),
        Sample(  # a size held as traced, not a branch (a number follows dim 1: symgrad/trace/size_checks.py)
            "size_check-held-length",
            {"x": [2, 3], "y": [2, 3]},
            [
                {
                    "op": "size_check",
                    "in": "x",
                    "left": {"like": "x", "dims": [1]},
                    "right": 3,
                    "line": "m.py:5",
                    "text": "x.shape[1] == 3",
                    "why": "the argument other of mul there follows it",
                    "out": "checked",
                },
                {"op": "mul", "in": "checked", "other": 3},
            ],
            ["x"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "size_check": [
        # a branch on the input's size (timm's MobileViT: math.ceil(H / p) * p != H), checked at
        # run time
        Spelling("x * 2 if x.shape[2] > 3 else x"),
    ],
}
