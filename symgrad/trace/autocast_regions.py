"""A traced model's own autocast regions and its questions whether autocast is on: the recorder puts
:func:`autocast_region` in place of ``torch.autocast.__enter__`` and :func:`autocast_read` in place of
``torch.is_autocast_enabled`` while the traced code runs.
"""

from __future__ import annotations

import os
import sys

import torch

from .errors import Refusal
from .frames import TORCH_DIR, is_users, user_line

AUTOCAST = torch.amp.autocast_mode.autocast
"""``torch.autocast``, whose ``__enter__`` ``torch.cpu.amp.autocast``'s and ``torch.cuda.amp.autocast``'s call, as its
use as a decorator does: the recorder puts :func:`autocast_region` in its place while the code runs."""
AUTOCAST_ENTER = AUTOCAST.__enter__
IS_AUTOCAST_ENABLED = torch.is_autocast_enabled
AUTOCAST_FILES = tuple(
    os.path.join(TORCH_DIR, *parts) for parts in (("amp", "autocast_mode.py"), ("cpu", "amp"), ("cuda", "amp"))
)


def autocast_region(region, regions: dict[str, str]):
    """The traced code's own autocast region (``with torch.autocast("cpu", enabled=False):`` in a forward, as
    LLaMA's rotary embedding opens): the spec holds its ops as plain ops, which is what the model runs where the
    region changes nothing. So a region that turns autocast off while none is on for its device is entered and
    noted in ``regions`` (``file:line`` -> device: the guards' ``autocast``, :func:`symgrad.guards.guards_text`),
    and a bound step refuses to run under the caller's autocast, where the explicit step would run the region's
    ops in autocast's dtype and the model in its own. A region that turns autocast on (it casts with no
    caller's autocast too), or off while the trace runs under autocast, is refused here in one line.
    torch's own regions (checkpoint's recomputation) are its business."""
    frame = sys._getframe(2)  # the recorder's `enter` called this
    while frame is not None and os.path.realpath(frame.f_code.co_filename).startswith(AUTOCAST_FILES):
        frame = frame.f_back  # torch.cpu.amp.autocast's __enter__, the decorator's wrapper
    if frame is None or not is_users(frame.f_code.co_filename):
        return AUTOCAST_ENTER(region)
    where = user_line(frame)
    if not region._enabled and not IS_AUTOCAST_ENABLED(region.device):
        regions.setdefault(where, region.device)
        return AUTOCAST_ENTER(region)
    called = f'(torch.autocast("{region.device}", enabled={region._enabled}))'
    if not region._enabled:
        raise Refusal(
            f"{where}: error: the traced code turns autocast off for its own region {called} while the trace "
            "runs under autocast, so the trace would record that region's ops in another precision than the "
            "rest (fix: trace outside torch.autocast; a bound step then refuses to run under autocast, naming "
            "this region)"
        )
    raise Refusal(
        f"{where}: error: the traced code turns autocast on in {str(region.fast_dtype).removeprefix('torch.')} "
        f"for its own region {called}, which the spec cannot hold: the explicit step would run that region's ops "
        "in another precision than the model does (fix: remove the autocast region from the traced code and "
        "choose the precision around the whole training step, which the explicit step then follows op for op "
        "as autograd does)"
    )


def autocast_read(reads: dict[str, str], *arguments, **keywords) -> bool:
    """``torch.is_autocast_enabled(...)`` while the traced code runs: where the user's code asks (not torch's
    own), noted in ``reads`` (``file:line`` -> device) for the guards' ``autocast_read``: the trace follows
    the branch taken without autocast, which a bound step under the caller's autocast would not."""
    frame = sys._getframe(2)  # the recorder's stand-in called this
    if frame is not None and is_users(frame.f_code.co_filename):
        device = arguments[0] if arguments else keywords.get("device_type", "cuda")  # no device: CUDA's, as torch
        reads.setdefault(user_line(frame), str(getattr(device, "type", device)))
    return IS_AUTOCAST_ENABLED(*arguments, **keywords)
