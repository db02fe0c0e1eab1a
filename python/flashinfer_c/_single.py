"""Plans for the single-request functions (single_decode / single_prefill).

FlashInfer's single-request calls have no plan step; here each call needs
a C plan, so plans are cached per (device, Spec) and re-planned only when
the request's lengths change. A lock serialises the calls that share a
cached plan, since a plan's partial-state buffers serve one run at a time.
"""

import threading
from collections import OrderedDict

import numpy as np

from ._attention import context
from ._plan import Plan

_MAX_PLANS = 16
_plans = OrderedDict()
_lock = threading.Lock()


def run(device, spec, qo_len, kv_len, q, k, v, out, lse, custom_mask=None, stream=None):
    """Attention of one request: q [qo_len, H, D], ragged k/v, into out (and lse)."""
    key = (device, spec)
    with _lock:
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
