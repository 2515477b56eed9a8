"""Elementwise math functions sympy lacks, each with a numerically stable derivative.

``sympy.diff`` of ``1 / (1 + exp(-x))`` is written with ``exp(-x)``, which overflows to inf/inf for
large negative x; as functions of their own, ``Sigmoid`` differentiates to ``Sigmoid * (1 - Sigmoid)``
and ``Softplus`` to ``Sigmoid``, and print as PyTorch's own stable kernels.
"""

from __future__ import annotations

import sympy


class Sigmoid(sympy.Function):
    """1 / (1 + exp(-x))."""

    def fdiff(self, argindex=1):
        return Sigmoid(self.args[0]) * (1 - Sigmoid(self.args[0]))

    def _torchcode(self, printer):
        return f"torch.sigmoid({printer._print(self.args[0])})"

    def _latex(self, printer):
        return rf"\sigma\left({printer._print(self.args[0])}\right)"

    def _eval_rewrite_as_exp(self, x, **kwargs):
        return 1 / (1 + sympy.exp(-x))


class Softplus(sympy.Function):
    """log(1 + exp(x))."""

    def fdiff(self, argindex=1):
        return Sigmoid(self.args[0])

    def _torchcode(self, printer):
        return f"F.softplus({printer._print(self.args[0])})"

    def _latex(self, printer):
        return rf"\operatorname{{softplus}}\left({printer._print(self.args[0])}\right)"

    def _eval_rewrite_as_exp(self, x, **kwargs):
        return sympy.log(1 + sympy.exp(x))
