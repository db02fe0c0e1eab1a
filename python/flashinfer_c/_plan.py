"""A C plan (fi_plan) that the wrappers reuse from one plan() call to the next.

fi_plan_create fixes the model-level parameters (a `Spec`) and sizes one
workspace from upper bounds (batch size, query tokens, KV pages or tokens).
A wrapper's plan() only rewrites the plan's contents (fi_plan_update); the
C plan is created again only when the Spec changes or a batch exceeds the
bounds, which then grow to the next power of two so that a growing batch
recreates it a logarithmic number of times. With fixed bounds (CUDA-graph
wrappers) a batch over them is an error that names the buffer to enlarge.

On CUDA, fi_plan_update uploads the batch with one asynchronous copy on the
stream the C plan last ran on. The caller's contract (FlashInfer's) is that
plan() is ordered on the caller's current stream, like its own copies; so
update() makes that upload stream wait for the current stream (runs and
graph replays queued there may still read the old batch), and the current
stream wait for the upload (a graph replayed there must read the new one).
Both are event waits queued on the GPU; the host does not block on them.
"""

import ctypes
import struct
from dataclasses import dataclass
from typing import NamedTuple, Optional

from . import _structs as S
from . import _context
from ._arrays import FI_NAME, DTypeError, c_int32, fill_view, numpy_data, pack_view
from ._arrays import numpy_data_or_0 as _ptr0
from ._lib import check, fn, plan_run_addr, plan_run_raw, plan_update_addr

# Byte offsets of fi_run_args' fields (for pack_view).
_OFF = {name: getattr(S.RunArgs, name).offset for name, _ in S.RunArgs._fields_}
_OFF_Q, _OFF_O = _OFF["q"], _OFF["o"]
# k and v are adjacent: one byte range holds both views (Plan.set_kv_bytes).
KV_BYTES = slice(_OFF["k"], _OFF["v"] + ctypes.sizeof(S.Tensor))
assert KV_BYTES.stop == _OFF["o"]


class InfoTable(dict):
    """A plan's (or cascade's) decisions: a plain dict of the C info
    struct's fields, shown as a two-column table (name, value)."""

    def table(self):
        width = max((len(k) for k in self), default=0)
        cell = lambda v: f"{v:.6g}" if isinstance(v, float) else str(v)  # noqa: E731
        return "\n".join(f"{k:<{width}}  {cell(v):>12}" for k, v in self.items())

    def __repr__(self):
        return "plan info\n" + "\n".join("  " + row for row in self.table().splitlines())


@dataclass(frozen=True)
class Spec:
    """What fi_plan_create fixes: fi_attention_params and the scheduling options."""

    num_qo_heads: int
    num_kv_heads: int
    head_dim_qk: int
    head_dim_vo: int
    kv_format: int
    page_size: int
    kv_layout: int
    q_dtype: int
    kv_dtype: int
    o_dtype: int
    mask_mode: int = S.MASK_NONE
    window_left: int = -1
    logits_soft_cap: float = 0.0
    sm_scale: float = 0.0
    pos_encoding: int = S.POS_NONE
    rope_scale: float = 1.0
    rope_theta: float = 1e4
    disable_split_kv: bool = False
    fixed_split_size: int = 0  # keys; 0 = automatic split
    variant: object = None  # a flashinfer_c.Variant (compared by identity)

    def params(self):
        p = S.AttentionParams()
        fn.attention_params_init(ctypes.byref(p))
        for name in (
            "num_qo_heads",
            "num_kv_heads",
            "head_dim_qk",
            "head_dim_vo",
            "kv_format",
            "page_size",
            "kv_layout",
            "q_dtype",
            "kv_dtype",
            "o_dtype",
            "mask_mode",
            "window_left",
            "logits_soft_cap",
            "sm_scale",
            "rope_scale",
            "rope_theta",
        ):
            setattr(p, name, getattr(self, name))
        p.pos_encoding = self.pos_encoding
        p.variant = self.variant.handle if self.variant is not None else None
        return p


class Bounds(NamedTuple):
    batch: int  # requests
    qo: int  # query tokens over the batch
    kv: int  # KV pages (paged) or tokens (ragged) over the batch

    def covers(self, need):
        return need.batch <= self.batch and need.qo <= self.qo and need.kv <= self.kv


# Smallest bounds a plan is made with, so tiny first batches do not cause a
# string of re-creations as the batch warms up.
_FLOOR = Bounds(8, 64, 256)


def grown(need, have):
    def up(n, floor, old):
        size = max(floor, old)
        while size < n:
            size *= 2
        return size

    return Bounds(
        up(need.batch, _FLOOR.batch, have.batch if have else 0),
        up(need.qo, _FLOOR.qo, have.qo if have else 0),
        up(need.kv, _FLOOR.kv, have.kv if have else 0),
    )


# C objects whose last reference went away while a CUDA graph was being
# captured on their device: destroying them then (device frees, event
# destroys) would invalidate the capture, so they wait here until the next
# plan or creation outside a capture. Cyclic garbage (an engine's
# `w.begin_forward = partial(fast_decode_plan, w)`) is collected at any
# time, captures included.
_deferred = []


def release(destroy, handle, device):
    """destroy(handle) now, or after the capture running on `device`."""
    if device[0] == "cuda":
        try:
            capturing = _context.capturing(device)
        except Exception:  # interpreter shutdown: torch may be gone
            capturing = False
        if capturing:
            _deferred.append((destroy, handle))
            return
    destroy(handle)


def flush_deferred():
    """Destroy what release() deferred (called where no capture can be running)."""
    while _deferred:
        destroy, handle = _deferred.pop()
        destroy(handle)


def _expect(view, code, name, option):
    """A run-time tensor has the dtype the plan was made for (checked by code)."""
    if view.dtype != code:
        got, want = FI_NAME.get(view.dtype, "?"), FI_NAME.get(code, "?")
        raise DTypeError(
            f"{name}.dtype is {got}, but {option}={want} was planned: pass {option}={got} "
            f"to plan() or convert {name}"
        )


def _ptr(a):
    return None if a is None else numpy_data(a)



# fi_batch as bytes: batch_size, then five pointers (Plan.update packs one in
# a single call into the plan's own struct).
_BATCH = struct.Struct("@i5P")
assert _BATCH.size == ctypes.sizeof(S.Batch) and S.Batch.qo_indptr.offset == _BATCH.size - 40


def batch_of(qo_indptr, kv_indptr, kv_indices=None, last_page_len=None, mask_indptr=None):
    """fi_batch over host int32 numpy arrays (kept alive by the caller)."""
    return S.Batch(
        qo_indptr.shape[0] - 1,
        _ptr(qo_indptr),
        _ptr(kv_indptr),
        _ptr(kv_indices),
        _ptr(last_page_len),
        _ptr(mask_indptr),
    )


def check_fixed(fixed, need, names):
    """A batch within a CUDA-graph wrapper's fixed bounds (ValueError naming the buffer)."""
    for have, want, name in zip(fixed, need, names):
        if want > have:
            raise ValueError(
                f"the batch needs {want} entries in {name}, which holds {have}: "
                "a CUDA-graph wrapper's buffers fix its bounds; make them larger"
            )


def refuse_recreate(old, new):
    """A C object a CUDA graph has captured must never be re-created."""
    raise ValueError(
        "plan() changes the attention parameters of a CUDA-graph wrapper whose "
        "run() a CUDA graph has captured; the graph would keep running the old "
        "C plan. Plan with the captured parameters, or use a new wrapper (and a "
        f"new graph) for new ones. Captured: {old}; asked: {new}"
    )


def serves(obj, spec):
    """With fixed bounds: whether obj's C object (a plan, a cascade) serves
    `spec` as it is; one a CUDA graph has captured must never be re-created."""
    if obj.handle is not None and spec == obj.spec:
        return True
    if obj.captured:
        refuse_recreate(obj.spec, spec)
    return False


def ordered_upload(device, upload_streams, call):
    """call() (a C update that uploads on `upload_streams`; None = the default
    stream) ordered after the work queued on the caller's current stream, and
    the current stream made to wait for the upload. Returns call()'s status."""
    if device[0] != "cuda":
        return call()
    current_raw = _context.raw_current_stream(device[1])
    if current_raw is not None and all(
        _context.raw_stream(s, device[1]) == current_raw for s in upload_streams
    ):
        return call()  # uploads on the current stream: ordered already (the common case)
    import torch

    current = torch.cuda.current_stream(device[1])
    others = []
    for stream in upload_streams:
        stream = torch.cuda.default_stream(device[1]) if stream is None else stream
        if stream != current and stream not in others:
            others.append(stream)
    for stream in others:
        stream.wait_stream(current)
    status = call()
    for stream in others:
        current.wait_stream(stream)
    return status


def run_args(spec, q, k, v, o, lse=None, custom_mask=None, stream=None):
    """fi_run_args of one run, the dtypes of q/k/v checked against `spec`.
    k, v: arrays, or fi_tensor views; q, o, lse likewise."""
    args = S.RunArgs()
    for field, x, name in (("q", q, "q"), ("k", k, "k"), ("v", v, "v"), ("o", o, "out")):
        if isinstance(x, S.Tensor):
            setattr(args, field, x)
        else:
            fill_view(getattr(args, field), x, name)
    _expect(args.q, spec.q_dtype, "q", "q_data_type")
    _expect(args.k, spec.kv_dtype, "k", "kv_data_type")
    _expect(args.v, spec.kv_dtype, "v", "kv_data_type")
    if isinstance(lse, S.Tensor):
        args.lse = lse
    elif lse is not None:
        fill_view(args.lse, lse, "lse")
    if custom_mask is not None:
        fill_view(args.custom_mask, custom_mask, "custom_mask")
    if stream is not None:
        args.stream = stream.cuda_stream
    return args


class Plan:
    """One fi_plan on one context, re-planned for each batch."""

    def __init__(self, ctx, fixed: Optional[Bounds] = None, fixed_names=("", "", "")):
        self.ctx = ctx  # keeps the context alive as long as the plan
        self.fixed = fixed
        self.fixed_names = fixed_names
        self.handle = None
        self.spec = None
        self.bounds = None
        self.total_qo = 0
        self.batch_size = 0
        self.captured = False  # a CUDA graph holds a run of this C plan
        self._stream = None  # the torch stream the C plan last ran on (CUDA)
        self._upload_raw = None  # its raw handle (None: not known; see update())
        self._batch = None  # the last batch's host arrays (for scaled siblings)
        self._version = 0
        self._siblings = {}
        self._synced = -1  # for a sibling: the parent's _version it was planned for
        self._destroy = fn.plan_destroy
        self._batch_struct = S.Batch()  # fi_plan_update's argument, rewritten per plan()
        self._batch_addr = ctypes.addressof(self._batch_struct)
        # The argument block of fi_plan_run, made once and rewritten in place
        # by each run() (pack_view): run() builds no ctypes objects.
        self._args = S.RunArgs()
        self._args_ref = ctypes.byref(self._args)
        self._last_k = self._last_v = None  # the K/V views args holds now
        self._lse_set = self._mask_set = False
        self._stream_handle = None
        # For the wrappers' fast run (_fast.FastRun): the argument block's
        # address and bytes, and its data pointers as ctypes objects that
        # alias the fields.
        self._args_addr = ctypes.addressof(self._args)
        self._args_bytes = memoryview(self._args).cast("B")
        self._q_data = ctypes.c_void_p.from_buffer(self._args, _OFF_Q)
        self._o_data = ctypes.c_void_p.from_buffer(self._args, _OFF_O)
        self._lse_data = ctypes.c_void_p.from_buffer(self._args, _OFF["lse"])
        # The fast run of the last full run() (a _fast.FastRun; None: none
        # valid). Dropped by a full run(), and by update() unless the batch
        # keeps the Spec object and the C plan (its handle).
        self.memo = None

    # ------------------------------------------------------------ planning

    def update(
        self, spec, qo_indptr, kv_indptr, kv_indices=None, last_page_len=None, mask_indptr=None,
        capture_checked=False,
    ):
        """Schedule a batch (host int32 numpy arrays) under `spec`.
        capture_checked: the caller has just refused a capture in progress."""
        device = self.ctx.device
        if not capture_checked and device[0] == "cuda" and _context.capturing(device):
            raise RuntimeError(
                "plan() was called while the current CUDA stream is being captured into a "
                "graph: plan outside the captured region; replays read the latest plan"
            )
        # The fast run stays through a new batch of the same Spec on the same C
        # plan (an engine's next step); it is put back below when this succeeds.
        memo, self.memo = self.memo, None
        if _deferred:
            flush_deferred()
        n = qo_indptr.shape[0] - 1
        total_qo, total_kv = qo_indptr.item(-1), kv_indptr.item(-1)
        have = self.bounds
        if not (  # the C plan as it is serves the batch (the common case, checked cheaply)
            self.handle is not None
            and self.fixed is None
            and (spec is self.spec or spec == self.spec)
            and n <= have.batch
            and total_qo <= have.qo
            and total_kv <= have.kv
        ):
            self._ensure(spec, Bounds(max(n, 1), max(total_qo, 1), max(total_kv, 1)))
        batch = self._batch_struct
        _BATCH.pack_into(
            batch, 0, n, _ptr0(qo_indptr), _ptr0(kv_indptr), _ptr0(kv_indices),
            _ptr0(last_page_len), _ptr0(mask_indptr),
        )
        self._batch = (qo_indptr, kv_indptr, kv_indices, last_page_len, mask_indptr)
        self._version += 1
        self.total_qo = 0
        if device[0] == "cpu":
            status = self._c_update(batch)
        elif self._upload_raw is not None and self._upload_raw == _context.raw_current_stream(
            device[1]
        ):
            status = self._c_update(batch)  # uploads on the current stream: ordered already
        else:
            status = ordered_upload(device, self._upload_streams(), lambda: self._c_update(batch))
        if status:
            check(status, self._what)
        self.total_qo = total_qo
        self.batch_size = n
        if memo is not None and total_qo and memo.spec is self.spec and memo.handle == self.handle:
            self.memo = memo  # the same Spec and C plan: what the fast run was made for
        if self.fixed is not None:
            # A graph may have captured a sibling's run: it must see this batch too.
            for sib in self._siblings.values():
                sib.update(sib.spec, *self._batch)
                sib._synced = self._version

    def _ensure(self, spec, need):
        if self.fixed is not None:
            check_fixed(self.fixed, need, self.fixed_names)
            bounds = self.fixed
            if serves(self, spec):
                return
        else:
            if self.handle is not None and spec == self.spec and self.bounds.covers(need):
                return
            bounds = grown(need, self.bounds if spec == self.spec else None)
        self._release()
        config = S.PlanConfig()
        fn.plan_config_init(ctypes.byref(config))
        for value, name in zip(bounds, ("requests", "query tokens", "KV pages/tokens")):
            c_int32(value, f"the plan bound on {name}", 1)
        config.max_batch_size, config.max_total_qo, config.max_total_kv = bounds
        config.disable_split_kv = int(spec.disable_split_kv)
        config.fixed_split_size = spec.fixed_split_size
        params = spec.params()
        handle = ctypes.c_void_p()
        check(self._c_create(params, config, handle), self._what)
        self.handle, self.spec, self.bounds = handle.value, spec, bounds
        self._reset_streams()

    def variant(self, spec):
        """This plan's batch under another Spec (another softmax scale or soft-cap).

        FlashInfer lets run() change a few numbers that here are fixed at plan
        creation (q_scale/k_scale fold into the softmax scale); such a run gets
        a sibling plan, re-planned only when this plan's batch has changed
        (in CUDA-graph mode, at every plan(), since a graph may replay it).
        """
        if spec == self.spec:
            return self
        sib = self._siblings.get(spec)
        if (sib is None or sib._synced != self._version) and _context.capturing(self.ctx.device):
            raise RuntimeError(
                "run() is being captured with a q_scale/k_scale/logits_soft_cap other than "
                "plan()'s, which runs on a second C plan that is not ready: call run() once "
                "with the same values before capturing (the usual warm-up)"
            )
        if sib is None:
            if len(self._siblings) >= 8 and self.fixed is None:
                self._siblings.clear()
            sib = self._siblings[spec] = self._sibling()
        if sib._synced != self._version:
            sib.update(spec, *self._batch)
            sib._synced = self._version
        return sib

    # ----------------------------------------------------------------- run

    def run(self, q, k, v, o, lse=None, custom_mask=None, stream=None, variant_values=()):
        """Attention for the planned batch. k, v: arrays, or fi_tensor views.
        stream: the torch stream to queue it on (CUDA); None on the CPU.
        variant_values: the spec's variant's per-run values, in its order.

        The hot path: the plan's own fi_run_args is rewritten in place (one
        struct.pack_into per array, a struct copy per prebuilt K/V view) and
        handed to the C entry point, whose ctypes prototype is bound once."""
        spec = self.spec
        args = self._args
        self.memo = None  # args is rewritten below
        if pack_view(args, _OFF_Q, q, "q") != spec.q_dtype:
            _expect(args.q, spec.q_dtype, "q", "q_data_type")
        if k is not self._last_k or v is not self._last_v:
            # a new cache (another layer's, or arrays): its views and their dtypes
            if isinstance(k, S.Tensor):
                args.k = k
                args.v = v
            else:
                pack_view(args, _OFF["k"], k, "k")
                pack_view(args, _OFF["v"], v, "v")
            if args.k.dtype != spec.kv_dtype or args.v.dtype != spec.kv_dtype:
                self._last_k = self._last_v = None
                _expect(args.k, spec.kv_dtype, "k", "kv_data_type")
                _expect(args.v, spec.kv_dtype, "v", "kv_data_type")
            if isinstance(k, S.Tensor):  # prebuilt views are immutable: remember them
                self._last_k, self._last_v = k, v
            else:
                self._last_k = self._last_v = None
        pack_view(args, _OFF_O, o, "out")
        if lse is not None:
            if isinstance(lse, S.Tensor):
                args.lse = lse
            else:
                pack_view(args, _OFF["lse"], lse, "lse")
            self._lse_set = True
        elif self._lse_set:
            args.lse.data = None
            self._lse_set = False
        if custom_mask is not None:
            pack_view(args, _OFF["custom_mask"], custom_mask, "custom_mask")
            self._mask_set = True
        elif self._mask_set:
            args.custom_mask.data = None
            self._mask_set = False
        handle = None if stream is None else stream.cuda_stream
        if handle != self._stream_handle:
            args.stream = handle
            self._stream_handle = handle
        keep = None
        if spec.variant is not None:
            vargs, keep = spec.variant.pack(variant_values, self.ctx.device)
            args.variant_args = ctypes.addressof(vargs)
        status = self._c_run_ref()
        del keep
        if status:
            check(status, "run")
        if stream is not None:
            self._ran_on(stream)

    def _c_run_ref(self):
        """fi_plan_run on the prebuilt argument block (subclasses: their C run)."""
        return plan_run_addr(self.handle, self._args_addr)

    def _c_run_call(self):
        """(function, a, b): the fast run's call of _c_run_ref, function(a, b),
        its arguments prebuilt ctypes objects (valid until the next update())."""
        return plan_run_raw, ctypes.c_void_p(self.handle), self._args_ref

    # ------------------------------------------- what a subclass replaces

    _what = "plan"

    def _c_create(self, params, config, handle):
        return fn.plan_create(
            self.ctx.handle, ctypes.byref(params), ctypes.byref(config), ctypes.byref(handle)
        )

    def _c_update(self, batch):
        if batch is self._batch_struct:
            return plan_update_addr(self.handle, self._batch_addr)
        return fn.plan_update(self.handle, ctypes.byref(batch))

    def _c_run(self, args):
        return fn.plan_run(self.handle, ctypes.byref(args))

    def _upload_streams(self):
        """The torch streams the C plan uploads its next batch on (None: the
        default stream, where a C plan that has not run uploads)."""
        return [self._stream]

    def _ran_on(self, stream):
        self._stream = stream  # where the C plan uploads its next batch
        self._upload_raw = stream.cuda_stream

    def _reset_streams(self):
        self._stream = None  # a new C plan uploads on the default stream until it runs
        self._upload_raw = None

    def _sibling(self):
        return Plan(self.ctx, self.fixed, self.fixed_names)

    # ---------------------------------------------------------- inspection

    def workspace_size(self):
        return fn.plan_workspace_size(self.handle) if self.handle else 0

    def info(self):
        info = S.PlanInfo()
        info.struct_size = ctypes.sizeof(S.PlanInfo)
        check(fn.plan_get_info(self.handle, ctypes.byref(info)), "plan info")
        return InfoTable({name: getattr(info, name) for name, _ in S.PlanInfo._fields_[1:]})

    def _release(self):
        self.memo = None
        self._siblings.clear()
        if self.handle:
            release(self._destroy, self.handle, self.ctx.device)
            self.handle = None

    def __del__(self):
        self._release()
