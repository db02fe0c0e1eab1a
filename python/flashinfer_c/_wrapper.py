"""The base of the batch wrappers: the workspace's device, the CUDA-graph
buffers, the C plan, and the run step they share."""

from dataclasses import replace

from . import _context, _host
from ._arrays import device_str
from ._attention import (
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


def require_graph_buffers(*named):
    """The (name, buffer)s a use_cuda_graph=True constructor must be given."""
    for name, buf in named:
        if buf is None:
            raise ValueError(f"{name} must be given when use_cuda_graph=True")


class WrapperBase:
    _name = "wrapper"

    def __init__(self, float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args):
        from .variant import Variant

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
        self._int_workspace_buffer = None
        self.device = workspace_device(float_workspace_buffer, self._name)
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
        if _context.capturing(self.device):
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

    def _update(self, spec, *arrays):
        """Re-plan the C plan for a batch (host int32 arrays)."""
        if self._plan is None:
            ctx = context(self.device)
            if self._prefix_detection is None:
                self._plan = Plan(ctx, self._fixed, self._fixed_names)
            else:
                self._plan = AutoCascadePlan(
                    ctx, self._prefix_detection, self._fixed, self._fixed_names
                )
        self._planned = False
        self._plan.update(spec, *arrays)
        self._planned = True

    def _require_plan(self):
        if not self._planned:
            raise RuntimeError(
                f"{self._name}.run() was called before a successful plan(): call plan() "
                "with the batch's indptr/indices first"
            )
        return self._plan

    # ----------------------------------------------------------------- run

    def _check_window_left(self, window_left):
        """run()'s window_left, if given, must be plan()'s."""
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
        **spec_changes,
    ):
        """Check q/out/lse against the plan, then run: shared by every wrapper.

        The dtypes of q, k and v are checked against the plan by Plan.run.
        """
        plan = self._require_plan()
        check_rank(q, "q", 3, "[tokens, num_qo_heads, head_dim]")
        _context.check_same_device(
            self.device, [("q", q), ("out", out), ("lse", lse)] + list(arrays)
        )
        capturing = _context.check_capture(
            self.device, self._use_cuda_graph, f"{self._name}.run()"
        )
        out, lse = outputs(
            q, plan.spec.head_dim_vo, self._o_name, out, lse, return_lse, self.device
        )
        runner = plan
        if q_scale is not None or k_scale is not None or spec_changes:
            scale = run_scale(plan.spec, q_scale, k_scale)
            runner = plan.variant(replace(plan.spec, sm_scale=scale, **spec_changes))
        if capturing:
            # From now on replays read this C plan's device workspace: it must
            # never be re-created (Plan._ensure refuses a parameter change).
            runner.captured = plan.captured = True
        if plan.total_qo or capturing:
            runner.run(
                q, k, v, out, lse, custom_mask, plan.ctx.current_stream(),
                getattr(self, "_variant_values", ()),
            )
        apply_v_scale(out, v_scale)
        return (out, lse) if return_lse else out

    # ---------------------------------------------------------- inspection

    def plan_info(self):
        """What the C scheduler decided for the last plan() (for logs and tests)."""
        return self._require_plan().info()

    def plan_workspace_bytes(self):
        """Bytes the C plan holds (its own workspace, not the caller's buffer)."""
        return self._plan.workspace_size() if self._plan else 0
