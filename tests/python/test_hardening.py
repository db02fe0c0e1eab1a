"""Issue 35's Python items: every integer argument checked against its C type's
range (no silent int32 truncation), and `out=` / `lse=` (and the arrays the
in-place ops write) checked for writability, shape, dtype and device before
the C call. numpy only."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import flashinfer_c as fi
import npref

ROOT = Path(__file__).resolve().parents[2]


def planned_decode(g, page_size=16, hq=4, hk=2, d=64):
    indptr, indices, last = npref.page_table([5, 20], page_size, g)
    kv = npref.randn(g, int(indices.max()) + 1, 2, page_size, hk, d)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(np.empty(1 << 16, np.uint8))
    w.plan(indptr, indices, last, hq, hk, d, page_size, q_data_type="float32")
    return w, npref.randn(g, 2, hq, d), kv, (indptr, indices, last)


# ----------------------------------------------------------- integer ranges


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_qo_heads", 2**32 + 4),
        ("num_kv_heads", 2**32 + 2),
        ("head_dim", 2**32 + 64),
        ("page_size", 2**32 + 16),
        ("window_left", 2**31),
        ("window_left", -(2**31) - 1),
        ("fixed_split_size", 2**27),  # x page_size 16 = 2^31 keys
    ],
)
def test_plan_integers_out_of_int32_range(field, value):
    g = npref.rng()
    indptr, indices, last = npref.page_table([5], 16, g)
    args = dict(num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=16)
    kwargs = {}
    if field in args:
        args[field] = value
    else:
        kwargs[field] = value
    w = fi.BatchDecodeWithPagedKVCacheWrapper(np.empty(16, np.uint8))
    with pytest.raises(ValueError, match=rf"{field}.*out of range|out of range.*{field}|int32"):
        w.plan(indptr, indices, last, *args.values(), q_data_type="float32", **kwargs)


def test_integer_type_errors():
    g = npref.rng()
    indptr, indices, last = npref.page_table([5], 16, g)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(np.empty(16, np.uint8))
    with pytest.raises(ValueError, match="num_qo_heads"):
        w.plan(indptr, indices, last, 4.0, 2, 64, 16)
    with pytest.raises(TypeError, match="window_left"):
        w.plan(indptr, indices, last, 4, 2, 64, 16, window_left=1.5)


def test_other_integer_arguments():
    g = npref.rng()
    q, k = npref.randn(g, 3, 4, 64), npref.randn(g, 3, 2, 64)
    pos = np.arange(3, dtype=np.int32)
    with pytest.raises(ValueError, match="rotary_dim"):
        fi.apply_rope_pos_ids(q, k, pos, rotary_dim=2**32 + 64)
    with pytest.raises(ValueError, match="nnz"):
        fi.get_batch_indices_positions(
            np.array([0, 1], np.int32), np.array([1], np.int32), 2**31
        )
    w = fi.BlockSparseAttentionWrapper(np.empty(16, np.uint8))
    with pytest.raises(ValueError, match="R"):
        w.plan(np.array([0, 1], np.int32), np.array([0], np.int32), 4, 4, 2**32 + 4, 4, 2, 2, 64)


# ---------------------------------------------------------- output checks


def test_read_only_out_and_lse_refused():
    w, q, kv, _ = planned_decode(npref.rng(1))
    out = np.empty_like(q)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        w.run(q, kv, out=out)
    lse = np.empty(q.shape[:2], np.float32)
    lse.flags.writeable = False
    with pytest.raises(ValueError, match="lse is a read-only"):
        w.run(q, kv, lse=lse, return_lse=True)


def test_out_shape_dtype_and_overlap_refused():
    w, q, kv, _ = planned_decode(npref.rng(2))
    with pytest.raises(ValueError, match=r"out.shape is \(2, 4, 32\)"):
        w.run(q, kv, out=np.empty((2, 4, 32), np.float32))
    with pytest.raises(TypeError, match="out.dtype is float16, expected float32"):
        w.run(q, kv, out=np.empty(q.shape, np.float16))
    with pytest.raises(TypeError, match="torch.Tensor or numpy.ndarray, got list"):
        w.run(q, kv, out=[0.0])
    overlapping = np.broadcast_to(np.empty((1, 4, 64), np.float32), q.shape)
    with pytest.raises(ValueError, match="read-only|zero stride"):
        w.run(q, kv, out=overlapping)
    base = np.empty((1, 4, 64), np.float32)
    expanded = np.lib.stride_tricks.as_strided(base, q.shape, (0,) + base.strides[1:])
    with pytest.raises(ValueError, match="zero stride"):
        w.run(q, kv, out=expanded)


def test_out_device_checked_with_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA tensor to be on another device")
    w, q, kv, _ = planned_decode(npref.rng(3))
    with pytest.raises(ValueError, match="out is on cuda"):
        w.run(q, kv, out=torch.empty(q.shape, device="cuda"))


def test_read_only_mmap_out_raises_not_crashes(tmp_path):
    """An out= backed by a read-only mapping used to crash the interpreter (SIGSEGV):
    run in a child process, so a regression fails this test instead of pytest."""
    code = f"""
import sys
sys.path.insert(0, {str(ROOT / 'python')!r}); sys.path.insert(0, {str(Path(__file__).parent)!r})
import numpy as np, flashinfer_c as fi, npref
from test_hardening import planned_decode
w, q, kv, _ = planned_decode(npref.rng(4))
path = {str(tmp_path / 'out.bin')!r}
np.zeros(q.shape, np.float32).tofile(path)
out = np.memmap(path, dtype=np.float32, mode='r', shape=q.shape)
try:
    w.run(q, kv, out=out)
except ValueError as e:
    print('refused:', e)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"child died ({r.returncode}): {r.stderr[-2000:]}"
    assert "refused:" in r.stdout and "read-only" in r.stdout


def test_in_place_ops_refuse_read_only_targets():
    g = npref.rng(5)
    v, s = npref.randn(g, 3, 2, 64), npref.randn(g, 3, 2)
    v.flags.writeable = False
    with pytest.raises(ValueError, match="v is a read-only"):
        fi.merge_state_in_place(v, s, v.copy(), s.copy())
    q, k = npref.randn(g, 3, 4, 64), npref.randn(g, 3, 2, 64)
    k.flags.writeable = False
    with pytest.raises(ValueError, match="k is a read-only"):
        fi.apply_rope_pos_ids_inplace(q, k, np.arange(3, dtype=np.int32))
    cache = np.zeros((2, 2, 4, 2, 64), np.float32)
    cache.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        fi.append_paged_kv_cache(
            npref.randn(g, 1, 2, 64), npref.randn(g, 1, 2, 64), np.zeros(1, np.int32),
            np.zeros(1, np.int32), cache, np.array([0], np.int32), np.array([0, 1], np.int32),
            np.array([1], np.int32),
        )


def test_checks_come_before_any_write():
    """A refused run leaves a given out untouched."""
    w, q, kv, _ = planned_decode(npref.rng(6))
    out = np.full(q.shape, 7.0, np.float32)
    lse = np.empty((2, 3), np.float32)  # wrong shape: refused
    with pytest.raises(ValueError, match="lse.shape"):
        w.run(q, kv, out=out, lse=lse, return_lse=True)
    assert (out == 7.0).all()
