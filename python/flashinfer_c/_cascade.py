"""C cascades (fi_cascade, docs/CASCADE.md) behind the Python wrappers.

Cascade: explicit levels (MultiLevelCascadeAttentionWrapper): one
fi_cascade_create per Spec and bounds, fi_cascade_update per plan(),
fi_cascade_run per run(); the levels are computed and merged in C.

AutoCascadePlan: a plain paged batch planned by fi_cascade_create_auto
(the paged wrappers' prefix_detection option): a Plan whose C object is an
automatic cascade, which finds shared leading pages and splits them off
when its cost model says so.

Both are re-created only when the Spec changes or a batch outgrows their
bounds (powers of two, as Plan); with fixed bounds (CUDA-graph wrappers)
never, so a captured run keeps valid addresses (the cascade's workspace is
allocated once, at creation). On CUDA each level's C plan uploads its batch
on the stream it last ran on (the default stream before its first run):
updates are ordered against every such stream (ordered_upload).
"""

import ctypes

from . import _structs as S
from ._arrays import c_int32
from ._lib import cascade_run_raw, check, fn
from ._plan import (
    Bounds,
    InfoTable,
    Plan,
    batch_of,
    check_fixed,
    grown,
    _deferred,
    flush_deferred,
    ordered_upload,
    release,
    run_args,
    serves,
)

_DETECTION = {
    "auto": S.PREFIX_DETECTION_AUTO,
    "off": S.PREFIX_DETECTION_OFF,
    "always": S.PREFIX_DETECTION_ALWAYS,
}


def detection_code(mode):
    """fi_prefix_detection of the wrappers' prefix_detection option (None: no cascade)."""
    if mode is None or mode is False:
        return None
    if mode is True:
        mode = "auto"
    code = _DETECTION.get(str(mode).lower())
    if code is None:
        raise ValueError(f"prefix_detection={mode!r}: expected None, 'auto', 'always' or 'off'")
    return code


def _options(detection=S.PREFIX_DETECTION_AUTO):
    options = S.CascadeOptions()
    fn.cascade_options_init(ctypes.byref(options))
    options.prefix_detection = detection
    return options


def _info(handle):
    info = S.CascadeInfo()
    fn.cascade_info_init(ctypes.byref(info))
    check(fn.cascade_get_info(handle, ctypes.byref(info)), "cascade info")
    return InfoTable({name: getattr(info, name) for name, _ in S.CascadeInfo._fields_[1:]})


def _workspace_bytes(cascade, num_levels, bounds):
    """fi_cascade_workspace_size of a cascade's partial states (0 before one exists)."""
    if not cascade.handle:
        return 0
    params = cascade.spec.params()
    return fn.cascade_workspace_size(ctypes.byref(params), num_levels, bounds.qo)


def _config(bounds, spec):
    for value, name in zip(bounds, ("requests", "query tokens", "KV pages")):
        c_int32(value, f"the cascade bound on {name}", 1)
    config = S.PlanConfig()
    fn.plan_config_init(ctypes.byref(config))
    config.max_batch_size, config.max_total_qo, config.max_total_kv = bounds
    config.disable_split_kv = int(spec.disable_split_kv)
    config.fixed_split_size = spec.fixed_split_size
    return config


class UploadStreams:
    """The streams a composite's C plans upload on: every stream it ran on,
    and the default stream (where a C plan that has not run uploads)."""

    def _upload_streams(self):
        return [None] + self._streams

    def _ran_on(self, stream):
        if stream not in self._streams:
            self._streams.append(stream)

    def _reset_streams(self):
        self._streams = []


class Handle(UploadStreams):
    """A C object destroyed with self._destroy when released or collected."""

    def _release(self):
        if self.handle:
            release(self._destroy, self.handle, self.ctx.device)
            self.handle = None

    def __del__(self):
        self._release()


class AutoCascadePlan(UploadStreams, Plan):
    """A plain paged batch through fi_cascade_create_auto / _update_batch / _run."""

    _what = "plan (prefix detection)"

    def __init__(self, ctx, detection, fixed=None, fixed_names=("", "", "")):
        super().__init__(ctx, fixed, fixed_names)
        self.detection = detection
        self._streams = []
        self._destroy = fn.cascade_destroy

    def _c_create(self, params, config, handle):
        options = _options(self.detection)
        return fn.cascade_create_auto(
            self.ctx.handle,
            ctypes.byref(params),
            ctypes.byref(config),
            ctypes.byref(options),
            ctypes.byref(handle),
        )

    def _c_update(self, batch):
        return fn.cascade_update_batch(self.handle, ctypes.byref(batch))

    def _c_run(self, args):
        return fn.cascade_run(self.handle, ctypes.byref(args))

    def _c_run_ref(self):
        return fn.cascade_run(self.handle, self._args_ref)

    def _c_run_call(self):
        return cascade_run_raw, ctypes.c_void_p(self.handle), self._args_ref

    def _sibling(self):
        return AutoCascadePlan(self.ctx, self.detection, self.fixed, self.fixed_names)

    def info(self):
        """The cascade's decision (num_levels, split, num_groups, saved_page_reads,
        cost_single, cost_cascade)."""
        return _info(self.handle)

    def workspace_size(self):
        """Bytes of the cascade's partial-state workspace (its plans' own come on top)."""
        return _workspace_bytes(self, S.CASCADE_AUTO_MAX_LEVELS, self.bounds)


class Cascade(Handle):
    """One fi_cascade of explicit levels, re-planned for each batch of levels."""

    def __init__(self, ctx, num_levels, fixed=None, fixed_names=None):
        self.ctx = ctx  # keeps the context alive as long as the cascade
        self.num_levels = num_levels
        self.fixed = fixed  # [Bounds] per level (CUDA-graph wrappers)
        self.fixed_names = fixed_names
        self.handle = None
        self.spec = None
        self.bounds = None
        self.total_qo = 0
        self.captured = False  # a CUDA graph holds a run of this cascade
        self._streams = []
        self._levels = None  # the page tables the level plans reference
        self._destroy = fn.cascade_destroy

    def update(self, spec, levels):
        """levels: [(qo_indptr, kv_indptr, kv_indices, last_page_len)], host int32 arrays."""
        if _deferred:
            flush_deferred()
        total = max(int(qo[-1]) for qo, *_ in levels)
        need = [
            Bounds(max(qo.shape[0] - 1, 1), max(total, 1), max(int(kv[-1]), 1))
            for qo, kv, *_ in levels
        ]
        self._ensure(spec, need)
        batches = (S.Batch * self.num_levels)(*(batch_of(*level) for level in levels))
        self._levels = levels
        self.total_qo = 0
        status = ordered_upload(
            self.ctx.device,
            self._upload_streams(),
            lambda: fn.cascade_update(self.handle, batches),
        )
        check(status, "cascade plan")
        self.total_qo = total

    def _ensure(self, spec, need):
        if self.fixed is not None:
            for have, want, names in zip(self.fixed, need, self.fixed_names):
                check_fixed(have, want, names)
            bounds = self.fixed
            if serves(self, spec):
                return
        else:
            same = self.handle is not None and spec == self.spec
            if same and all(b.covers(n) for b, n in zip(self.bounds, need)):
                return
            old = self.bounds if same else [None] * self.num_levels
            bounds = [grown(n, o) for n, o in zip(need, old)]
            qo = max(b.qo for b in bounds)  # every level covers the same query tokens
            bounds = [b._replace(qo=qo) for b in bounds]
        self._release()
        configs = (S.PlanConfig * self.num_levels)(*(_config(b, spec) for b in bounds))
        params = spec.params()
        options = _options()
        handle = ctypes.c_void_p()
        status = fn.cascade_create(
            self.ctx.handle,
            ctypes.byref(params),
            self.num_levels,
            configs,
            ctypes.byref(options),
            ctypes.byref(handle),
        )
        check(status, "cascade")
        self.handle, self.spec, self.bounds = handle.value, spec, bounds
        self._reset_streams()

    def run(self, q, k, v, o, lse=None, stream=None):
        """Every level and their merge into o (and lse). k, v: fi_tensor views."""
        args = run_args(self.spec, q, k, v, o, lse, None, stream)
        check(fn.cascade_run(self.handle, ctypes.byref(args)), "cascade run")
        if stream is not None:
            self._ran_on(stream)

    def info(self):
        return _info(self.handle)

    def workspace_size(self):
        return _workspace_bytes(self, self.num_levels, self.bounds and self.bounds[0])
