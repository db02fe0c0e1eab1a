"""The base of the batch wrappers: the workspace's device, the CUDA-graph
buffers, the C plan, and the run step they share."""

import math
from dataclasses import replace

from . import _context, _fast, _host
from . import _structs as S
from ._arrays import device_str, is_torch
from ._attention import (
    apply_sinks,
    apply_v_scale,
    check_rank,
    context,
    make_spec,
    outputs,
    run_scale,
    workspace_device,
)
from ._cascade import AutoCascadePlan, detection_code
from ._plan import Bounds, Plan
from .utils import pos_encoding_code


def refuse_extras(what, args, **unsupported):
    """FlashInfer options this library does not implement: refused, not ignored."""
    if args:
        raise ValueError(
            f"{what}: extra positional arguments are for FlashInfer's custom JIT kernels, "
            "which flashinfer_c does not have"
        )
    for name, value in unsupported.items():
        if value is not None:
            raise NotImplementedError(f"{what}: {name} is not supported by flashinfer_c yet")


def refuse_unknown(what, options):
    """Keywords of newer FlashInfer releases that this signature does not name:
    accepted when they are None or False (the option off), else refused with
    NotImplementedError (never a TypeError)."""
    for name, value in options.items():
        if value is None or value is False:
            continue
        raise NotImplementedError(
            f"{what}: {name}={value!r} is not supported by flashinfer_c "
            "(docs/PYTHON_COMPAT.md lists what is)"
        )


def check_workspace_alignment(buffer, name):
    """FlashInfer's check: a workspace buffer's address is 16-byte aligned."""
    if buffer is None:
        return
    if is_torch(buffer):
        address = buffer.data_ptr()
    else:
        address = getattr(getattr(buffer, "ctypes", None), "data", 0) or 0
    if address % 16:
        raise ValueError(
            f"{name} must be 16-byte aligned (its address is {address:#x}); allocate it with "
            "torch.empty / numpy.empty rather than slicing it at an odd offset"
        )


def split_size(fixed_split_size, unit=1):
    """fixed_split_size (in pages or tokens): None, 0 or -1 = the automatic split."""
    if fixed_split_size is None or int(fixed_split_size) <= 0:
        return 0
    return int(fixed_split_size) * unit


class RunOption:
    """One of the attributes FlashInfer's wrappers read at run() (_causal,
    _sm_scale, ...), which plan(), forward() and engines' fast plans set:
    setting one marks the wrapper's run parameters for re-derivation at the
    next run(), so run() itself only checks a flag."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        return obj.__dict__.get(self.name)

    def __set__(self, obj, value):
        d = obj.__dict__
        old = d.get(self.name, _UNSET)
        d[self.name] = value
        # Setting the value it has (forward() at every layer) changes nothing.
        if old is not value and (type(old) is not type(value) or old != value):
            d["_options_stale"] = True
            d["_options_touched"] = True  # since the last plan() (_reset_options)
            plan = d.get("_plan")
            if plan is not None:
                plan.memo = None  # the fast run knows the old options only


_UNSET = object()


def unit_scale(x):
    """Whether a run-time scale (q_scale, k_scale, v_scale) changes nothing:
    None, or the float 1.0 (vLLM passes k_scale=v_scale=1.0 to every run)."""
    return x is None or (type(x) is float and x == 1.0)


def unit_scales(*scales):
    """Whether none of the scales changes anything (unit_scale)."""
    for x in scales:
        if not (x is None or (type(x) is float and x == 1.0)):
            return False
    return True


_raw_stream = _context.raw_current_stream


def require_graph_buffers(*named):
    """The (name, buffer)s a use_cuda_graph=True constructor must be given."""
    for name, buf in named:
        if buf is None:
            raise ValueError(f"{name} must be given when use_cuda_graph=True")


class WrapperBase:
    _name = "wrapper"

    # FlashInfer's run-time attributes (see RunOption).
    _causal = RunOption()
    _window_left = RunOption()
    _logits_soft_cap = RunOption()
    _sm_scale = RunOption()
    _pos_encoding_mode = RunOption()
    _rope_scale = RunOption()
    _rope_theta = RunOption()

    def __init__(self, float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args):
        from .variant import Variant

        check_workspace_alignment(float_workspace_buffer, "float_workspace_buffer")

        if isinstance(jit_args, (list, tuple)) and len(jit_args) == 1:
            jit_args = jit_args[0]
        if jit_args is not None and not isinstance(jit_args, Variant):
            raise NotImplementedError(
                f"{self._name}: jit_args must be a flashinfer_c.Variant (FlashInfer's CUDA C++ "
                "variant declarations cannot run here; see docs/VARIANTS.md for the "
                "equivalent)"
            )
        self._variant = jit_args  # run() takes its values as extra positional arguments
        self._variant_values = ()
        self._float_workspace_buffer = float_workspace_buffer
        # FlashInfer's int and pinned workspaces: the C plan has its own; engines
        # that reach into the wrapper (fast plans) only pass these around.
        self._int_workspace_buffer = None
        self._pin_memory_int_workspace_buffer = None
        self.device = workspace_device(float_workspace_buffer, self._name)
        self._options_stale = False
        self._options_touched = True
        self._option_changes = {}
        self._spec_memo = None  # (plan() options, their Spec, the run-time attributes)
        self._stream_memo = (None, None)  # (raw handle, torch stream) of the last run
        self._cached_module = _CachedModule(self)
        self._kv_layout = kv_layout
        self._use_cuda_graph = bool(use_cuda_graph)
        self._backend = backend  # accepted for compatibility; there is one backend
        self._plan = None
        self._planned = False
        self._fixed = None  # Bounds from the CUDA-graph buffers
        self._fixed_names = ("", "", "")
        self._prefix_detection = None  # fi_prefix_detection: plan through a C cascade

    def _set_prefix_detection(self, mode):
        """The paged wrappers' prefix_detection option (an extension): plan each
        batch with fi_cascade_create_auto, which splits shared leading pages
        into cascade levels when its cost model says so."""
        self._prefix_detection = detection_code(mode)
        if self._prefix_detection is not None and self._variant is not None:
            raise NotImplementedError(
                f"{self._name}: prefix_detection with a Variant (jit_args): the C cascade "
                "merges levels before a variant's output transform; use one or the other"
            )

    @property
    def prefix_detection(self):
        """None (a plain C plan), or the fi_prefix_detection of the C cascade used."""
        return self._prefix_detection

    @property
    def is_cuda_graph_enabled(self):
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None):
        """Kept for compatibility: the C plan owns its workspace, so only the
        buffers' device matters, and it must not change."""
        check_workspace_alignment(float_workspace_buffer, "float_workspace_buffer")
        check_workspace_alignment(int_workspace_buffer, "int_workspace_buffer")
        device = workspace_device(float_workspace_buffer, self._name)
        if device != self.device:
            raise ValueError(
                f"{self._name}: the new workspace is on {device_str(device)}, the wrapper "
                f"runs on {device_str(self.device)}"
            )
        self._float_workspace_buffer = float_workspace_buffer
        self._int_workspace_buffer = int_workspace_buffer

    def end_forward(self):
        """Deprecated in FlashInfer; does nothing."""

    # ------------------------------------------------------------ planning

    def _refuse_capture(self):
        """plan() reads the batch on the host and copies it: not in a CUDA graph."""
        if self.device[0] == "cuda" and _context.capturing(self.device):
            raise RuntimeError(
                f"{self._name}.plan() was called while the current CUDA stream is being "
                "captured into a graph: plan outside the captured region (before the "
                "capture and before each replay); replays read the latest plan"
            )

    def _make_spec(
        self, kv_format, page_size, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, **options
    ):
        """A Spec of this wrapper's KV layout and planned dtypes (self._q_name ...)."""
        return make_spec(
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim_qk=head_dim_qk,
            head_dim_vo=head_dim_vo,
            kv_format=kv_format,
            page_size=page_size,
            kv_layout=self._kv_layout,
            q_dtype=self._q_name,
            kv_dtype=self._kv_name,
            o_dtype=self._o_name,
            variant=getattr(self, "_variant", None),
            **options,
        )

    def _variant_args(self, args):
        """run()'s extra positional arguments: a variant's values (kept for
        _run), else returned for refuse_extras to refuse."""
        if getattr(self, "_variant", None) is None:
            return args
        self._variant_values = tuple(args)
        return ()

    def _copy_page_table(self, kv_indptr, kv_indices, last, suffix):
        """As FlashInfer, plan() writes the page table into the caller's CUDA-graph
        buffers, named paged_kv_*_<suffix> after the constructor's arguments."""
        _host.copy_into(self._paged_kv_indptr_buf, kv_indptr, f"paged_kv_indptr_{suffix}")
        _host.copy_into(self._paged_kv_last_page_len_buf, last, f"paged_kv_last_page_len_{suffix}")
        indices = kv_indices[: kv_indptr[-1]]
        _host.copy_into(self._paged_kv_indices_buf, indices, f"paged_kv_indices_{suffix}")

    def _fix_bounds(self, batch, qo, kv, names):
        self._fixed = Bounds(batch, qo, kv)
        self._fixed_names = names

    def _update(self, spec, *arrays, capture_checked=False):
        """Re-plan the C plan for a batch (host int32 arrays). capture_checked:
        this plan() has refused a capture (_refuse_capture) before its work."""
        if self._plan is None:
            ctx = context(self.device)
            if self._prefix_detection is None:
                self._plan = Plan(ctx, self._fixed, self._fixed_names)
            else:
                self._plan = AutoCascadePlan(
                    ctx, self._prefix_detection, self._fixed, self._fixed_names
                )
        self._planned = False
        self._plan.update(spec, *arrays, capture_checked=capture_checked)
        self._planned = True

    def _set_options(
        self,
        spec,
        causal=False,
        window_left=-1,
        logits_soft_cap=None,
        sm_scale=None,
        pos_encoding_mode="NONE",
        rope_scale=None,
        rope_theta=None,
    ):
        """After a plan(): the run-time attributes as FlashInfer's plan() sets them."""
        self._causal = bool(causal)
        self._window_left = -1 if window_left is None else int(window_left)
        self._logits_soft_cap = float(logits_soft_cap or 0.0)
        self._sm_scale = sm_scale
        self._pos_encoding_mode = pos_encoding_mode
        self._rope_scale = rope_scale
        self._rope_theta = rope_theta
        self._options_stale = self._options_touched = False
        self._option_changes = {}

    _OPTION_NAMES = ("_causal", "_window_left", "_logits_soft_cap", "_sm_scale",
                     "_pos_encoding_mode", "_rope_scale", "_rope_theta")

    def _options_snapshot(self):
        return tuple(self.__dict__.get(n) for n in self._OPTION_NAMES)

    def _reset_options(self, snapshot):
        """The run-time attributes as a plan() with these options sets them
        (nothing to do when none was set since the plan() that left them so)."""
        d = self.__dict__
        if not d.get("_options_touched", True) and not d["_options_stale"]:
            return
        for name, value in zip(self._OPTION_NAMES, snapshot):
            d[name] = value
        d["_options_stale"] = d["_options_touched"] = False
        d["_option_changes"] = {}

    def _current_stream(self, ctx):
        """ctx.current_stream(), with the torch Stream object reused while the
        raw handle stays the same (torch makes a new object at each call)."""
        if ctx.device[0] == "cpu":
            return None
        raw = _raw_stream(ctx.device[1])
        last_raw, stream = self._stream_memo
        if raw is None or raw != last_raw:
            stream = ctx.current_stream()
            self._stream_memo = (stream.cuda_stream, stream)
        return stream

    def _derive_options(self, spec):
        """The Spec fields run() must change: the run-time attributes set since
        plan() (forward(), an engine's fast plan) against the planned Spec."""
        wanted = {
            "window_left": -1 if self._window_left is None else int(self._window_left),
            "logits_soft_cap": float(self._logits_soft_cap or 0.0),
            "sm_scale": float(
                self._sm_scale
                if self._sm_scale is not None
                else 1.0 / math.sqrt(spec.head_dim_qk)
            ),
            "pos_encoding": pos_encoding_code(self._pos_encoding_mode or "NONE"),
            "rope_scale": float(1.0 if self._rope_scale is None else self._rope_scale),
            "rope_theta": float(1e4 if self._rope_theta is None else self._rope_theta),
        }
        if spec.mask_mode != S.MASK_CUSTOM and self._causal is not None:
            wanted["mask_mode"] = S.MASK_CAUSAL if self._causal else S.MASK_NONE
        self._option_changes = {k: v for k, v in wanted.items() if getattr(spec, k) != v}
        self._options_stale = False
        return self._option_changes

    def _forward_options(self, causal, pos_encoding_mode, window_left, logits_soft_cap,
                         sm_scale, rope_scale, rope_theta):
        """FlashInfer's deprecated forward(): set the run-time attributes, then run."""
        if causal is not None:
            self._causal = causal
        self._pos_encoding_mode = pos_encoding_mode
        self._window_left = window_left
        self._logits_soft_cap = logits_soft_cap
        self._sm_scale = sm_scale
        self._rope_scale = rope_scale
        self._rope_theta = rope_theta

    def _require_plan(self):
        if not self._planned:
            raise RuntimeError(
                f"{self._name}.run() was called before a successful plan(): call plan() "
                "with the batch's indptr/indices first"
            )
        return self._plan

    # ----------------------------------------------------------------- run

    def _check_window_left(self, window_left):
        """run()'s window_left, if given, must be the wrapper's (plan()'s, or the
        last forward()'s)."""
        if window_left is not None and window_left != self._window_left:
            raise ValueError(
                f"window_left={window_left} differs from plan()'s {self._window_left}; "
                "pass it to plan() instead"
            )

    def _run(
        self,
        q,
        k,
        v,
        arrays,
        q_scale,
        k_scale,
        v_scale,
        out,
        lse,
        return_lse,
        custom_mask=None,
        sinks=None,
        kv_entry=None,
        **spec_changes,
    ):
        """Check q/out/lse against the plan, then run: shared by every wrapper
        (the full path; the plan's FastRun takes the calls it has seen before).

        The dtypes of q, k and v are checked against the plan by Plan.run.
        sinks: attention-sink logits [num_qo_heads] (see apply_sinks).
        kv_entry: the KVViews k and v come from, if any (then a plain run is
        remembered for the fast run, _fast.FastRun).
        """
        plan = self._plan if self._planned else self._require_plan()
        if self._options_stale:
            self._derive_options(plan.spec)
        if self._option_changes:
            spec_changes = {**self._option_changes, **spec_changes}
        if not hasattr(q, "shape") or len(q.shape) != 3:
            check_rank(q, "q", 3, "[tokens, num_qo_heads, head_dim]")
        device = self.device
        _context.check_same_device(device, (("q", q), ("out", out), ("lse", lse)))
        if device not in getattr(arrays, "verified_on", ()):
            _context.check_same_device(device, arrays)
            if hasattr(arrays, "verified_on"):
                arrays.verified_on.add(device)
        capturing = device[0] == "cuda" and _context.check_capture(
            device, self._use_cuda_graph, f"{self._name}.run()"
        )
        want_lse = return_lse or sinks is not None
        given_out, given_lse = out, lse if return_lse else None
        out, lse = outputs(
            q, plan.spec.head_dim_vo, self._o_name, out, given_lse, want_lse, self.device,
        )
        runner = plan
        # A scale of 1.0 changes nothing (and costs nothing): as if not given.
        q_scale = None if unit_scale(q_scale) else q_scale
        k_scale = None if unit_scale(k_scale) else k_scale
        if q_scale is not None or k_scale is not None or spec_changes:
            spec = replace(plan.spec, **spec_changes) if spec_changes else plan.spec
            scale = run_scale(spec, q_scale, k_scale)
            runner = plan.variant(replace(spec, sm_scale=scale))
        if capturing:
            # From now on replays read this C plan's device workspace: it must
            # never be re-created (Plan._ensure refuses a parameter change).
            runner.captured = plan.captured = True
        if plan.total_qo or capturing:
            runner.run(
                q, k, v, out, lse, custom_mask, self._current_stream(plan.ctx),
                self._variant_values,
            )
            if (
                kv_entry is not None
                and runner is plan
                and not capturing
                and custom_mask is None
                and sinks is None
                and plan.spec.variant is None
            ):
                _fast.remember(
                    plan, device, self._kv_layout, q, out, lse, given_out is None,
                    given_lse is None, kv_entry,
                )
        if sinks is not None:
            apply_sinks(out, lse, sinks, plan.spec.num_qo_heads, self.device)
        if not unit_scale(v_scale):
            apply_v_scale(out, v_scale)
        return (out, lse) if return_lse else out

    # ---------------------------------------------------------- inspection

    def plan_info(self):
        """What the C scheduler decided for the last plan() (for logs and tests)."""
        return self._require_plan().info()

    def plan_workspace_bytes(self):
        """Bytes the C plan holds (its own workspace, not the caller's buffer)."""
        return self._plan.workspace_size() if self._plan else 0

    def _fast_replan(self, *args):
        """What an engine's fast plan hands _cached_module.plan() (see _CachedModule)."""
        raise NotImplementedError(
            f"{self._name}._cached_module.plan(): FlashInfer's internal plan entry is "
            "emulated for BatchDecodeWithPagedKVCacheWrapper only; call plan() instead"
        )


class _CachedModule:
    """Stands for FlashInfer's compiled module (wrapper._cached_module), which
    engines' fast decode plans call directly (vLLM's fast_plan_decode):
    .plan(float_ws, int_ws, pinned_ws, ...) re-plans the wrapper's C plan
    from the host arrays it is given. Nothing else of the module exists."""

    def __init__(self, wrapper):
        self._wrapper = wrapper

    def plan(self, *args):
        return self._wrapper._fast_replan(*args)

    def __getattr__(self, name):
        raise AttributeError(
            f"flashinfer_c emulates only _cached_module.plan() of FlashInfer's module, "
            f"not .{name}; use the wrapper's plan()/run()"
        )
