"""Plans for the single-request functions (single_decode / single_prefill).

FlashInfer's single-request calls have no plan step; here each call needs
a C plan, so plans are cached per (device, Spec) and re-planned only when
the request's lengths change. A lock serialises the calls that share a
cached plan, since a plan's partial-state buffers serve one run at a time.

CUDA graphs: a call captured into a graph is replayed with the plan it was
captured with, so that plan must never be re-planned. A capture therefore
takes the cached plan of the same lengths (made by an eager call before the
capture, the usual warm-up) out of the cache and keeps it for the rest of
the process; later calls make a new one, and later captured calls of the
same lengths (every layer of a model) share it. Without a warm-up call of
the same lengths the capture is refused: a capture cannot plan.
"""

import threading
from collections import OrderedDict

import numpy as np

from . import _context
from ._attention import context
from ._plan import Plan

_MAX_PLANS = 16
_plans = OrderedDict()
_captured = {}  # (device, Spec, lengths) -> a plan graphs replay: never re-planned
_lock = threading.Lock()


def _captured_plan(key, lengths):
    plan = _captured.get(key + lengths)
    if plan is not None:
        return plan
    entry = _plans.get(key)
    if entry is None or entry[1] != lengths:
        raise RuntimeError(
            "a single_* attention call is being captured into a CUDA graph without an "
            "eager call of the same shapes and options before the capture: make that call "
            "first (the usual warm-up), then capture"
        )
    del _plans[key]
    plan = _captured[key + lengths] = entry[0]
    plan.captured = True
    return plan


def run(device, spec, qo_len, kv_len, q, k, v, out, lse, custom_mask=None, stream=None):
    """Attention of one request: q [qo_len, H, D], ragged k/v, into out (and lse).
    stream: the torch stream to queue it on (CUDA); None on the CPU."""
    key = (device, spec)
    with _lock:
        if _context.capturing(device):
            plan = _captured_plan(key, (qo_len, kv_len))
            plan.run(q, k, v, out, lse, custom_mask, stream)
            return
        entry = _plans.get(key)
        if entry is None:
            entry = _plans[key] = [Plan(context(device)), None]
            if len(_plans) > _MAX_PLANS:
                _plans.popitem(last=False)
        else:
            _plans.move_to_end(key)
        plan, lengths = entry
        if lengths != (qo_len, kv_len):
            entry[1] = None  # a failed update leaves nothing planned
            plan.update(
                spec,
                np.array([0, qo_len], dtype=np.int32),
                np.array([0, kv_len], dtype=np.int32),
            )
            entry[1] = (qo_len, kv_len)
        if qo_len:
            plan.run(q, k, v, out, lse, custom_mask, stream)
