"""A C block-sparse object (fi_bsr, docs/CASCADE.md) behind the block-sparse
wrappers: fi_bsr_create per Spec and block shape, fi_bsr_update /
fi_bsr_update_variable per plan(), fi_bsr_run per run().

Re-created only when the Spec or the block shape changes or a pattern
outgrows the bounds, which then grow to the next power of two. The element
mask is copied by fi_bsr_update into the bsr's own backend memory (device
memory on CUDA), so nothing of it stays with the caller.
"""

import ctypes

import numpy as np

from ._cascade import Handle
from ._lib import check, fn
from ._plan import _ptr, ordered_upload, run_args
from . import _structs as S

_FLOOR = 16


def _up(n, old):
    size = max(_FLOOR, old)
    while size < n:
        size *= 2
    return size


class Bsr(Handle):
    """One fi_bsr on one context, updated for each pattern."""

    def __init__(self, ctx):
        self.ctx = ctx  # keeps the context alive as long as the bsr
        self.handle = None
        self.spec = None
        self.key = None  # (block_rows, block_cols, element_mask, variable, granularity)
        self.bounds = None  # (max_qo_len, max_kv_len, max_nnz, max_block_rows)
        self.qo_len = 0
        self._streams = []
        self._keep = None  # the indices fi_bsr_update references
        self._destroy = fn.bsr_destroy

    def _ensure(self, spec, key, need):
        same = self.handle is not None and spec == self.spec and key == self.key
        if same and all(n <= h for n, h in zip(need, self.bounds)):
            return
        old = self.bounds if same else (0, 0, 0, 0)
        bounds = tuple(_up(n, o) for n, o in zip(need, old))
        self._release()
        config = S.BsrConfig()
        fn.bsr_config_init(ctypes.byref(config))
        config.block_rows, config.block_cols = key[0], key[1]
        config.element_mask, config.variable_blocks, config.col_granularity = key[2:]
        config.max_qo_len, config.max_kv_len, config.max_nnz, config.max_block_rows = bounds
        params = spec.params()
        handle = ctypes.c_void_p()
        status = fn.bsr_create(
            self.ctx.handle, ctypes.byref(params), ctypes.byref(config), ctypes.byref(handle)
        )
        check(status, "block-sparse plan")
        self.handle, self.spec, self.key, self.bounds = handle.value, spec, key, bounds
        self._reset_streams()

    def _update(self, call):
        self.qo_len = 0
        check(ordered_upload(self.ctx.device, self._upload_streams(), call), "block-sparse plan")

    def update(self, spec, M, N, R, C, indptr, indices, block_mask=None):
        """Fixed R x C blocks: indptr [MB+1], indices [nnz] int32; block_mask
        uint8 [nnz, R, C] or None (full blocks)."""
        nnz = int(indptr[-1])
        key = (R, C, int(block_mask is not None), 0, 1)
        self._ensure(spec, key, (M, N, max(nnz, 1), 0))
        self._keep = (indptr, indices)
        self._update(
            lambda: fn.bsr_update(
                self.handle, M, N, _ptr(indptr), _ptr(indices), _ptr(block_mask)
            )
        )
        self.qo_len = M

    def update_variable(self, spec, M, N, row_sz, col_sz, block_map, granularity):
        """Per-KV-head blocks: row_sz [H, MB], col_sz [H, NB] int32, block_map
        uint8 [H, MB, NB]; every column size a multiple of `granularity`."""
        H, MB, NB = block_map.shape
        pages = (block_map.astype(np.int64) * (col_sz[:, None, :] // granularity)).sum((1, 2))
        need = (M, N, max(int(pages.max(initial=0)), 1), max(MB, 1))
        self._ensure(spec, (0, 0, 0, 1, granularity), need)
        self._update(
            lambda: fn.bsr_update_variable(
                self.handle, M, N, MB, NB, _ptr(row_sz), _ptr(col_sz), _ptr(block_map)
            )
        )
        self.qo_len = M

    def run(self, q, k, v, o, lse=None, stream=None):
        """q, k, v, o, lse: arrays or fi_tensor views ([M, H_qo, D], [N, H_kv, D] ...)."""
        args = run_args(self.spec, q, k, v, o, lse, None, stream)
        check(fn.bsr_run(self.handle, ctypes.byref(args)), "block-sparse run")
        if stream is not None:
            self._ran_on(stream)
