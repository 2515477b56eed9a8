"""A model traced while the user profiles (cProfile, or a profiler written in Python) traces as without one,
and the profiler is running again afterwards (the trace's own sys.setprofile hooks put it back)."""

from __future__ import annotations

import cProfile
import sys

import torch

from symgrad.trace import LossChoice, trace


def _model():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).double()


def test_a_trace_under_cprofile_is_the_trace_without_it_and_cprofile_runs_on():
    expected = trace(_model(), {"input": (2, 3, 8, 8)}, name="s", loss=LossChoice("mse_loss"))
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        text = trace(_model(), {"input": (2, 3, 8, 8)}, name="s", loss=LossChoice("mse_loss"))
        assert sys.getprofile() is profiler  # enabled again, not left off
    finally:
        profiler.disable()
    assert text == expected


def test_a_python_profiler_keeps_seeing_calls_through_the_trace():
    seen = []

    def profile(frame, event, argument):
        seen.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        trace(_model(), {"input": (2, 3, 8, 8)}, name="s", loss=LossChoice("mse_loss"))
        assert sys.getprofile() is profile
    finally:
        sys.setprofile(None)
    assert "forward" in seen
