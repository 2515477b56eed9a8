"""BoundModel.forward's fast path (a call by position alone) names its arguments as inspect.Signature.bind does."""

from __future__ import annotations

import inspect

import pytest

from symgrad.bound_model import _positional


def forward_plain(self, x): ...
def forward_two(self, x, noise): ...
def forward_default(self, x, scale=2.0): ...
def forward_star(self, x, *rest): ...
def forward_positional_only(self, x, /, y): ...
def forward_keyword_default(self, x, *, scale=1.0): ...
def forward_keyword_required(self, x, *, scale): ...


@pytest.mark.parametrize(
    "function",
    [
        forward_plain,
        forward_two,
        forward_default,
        forward_star,
        forward_positional_only,
        forward_keyword_default,
        forward_keyword_required,
    ],
)
@pytest.mark.parametrize("count", [0, 1, 2, 3])
def test_a_call_by_position_takes_the_fast_path_only_where_bind_names_the_same_arguments(function, count):
    signature = inspect.signature(function.__get__(object()))
    names = _positional(signature)
    args = tuple(range(count))
    try:
        bound = signature.bind(*args)
    except TypeError:
        bound = None
    if names is None or len(args) != len(names):
        return  # BoundModel.forward calls bind itself
    assert bound is not None, f"{function.__name__}{args}: the fast path accepts a call bind refuses"
    assert dict(zip(names, args)) == dict(bound.arguments)
