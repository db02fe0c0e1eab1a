"""Wrong dtypes, shapes, devices and call orders raise ValueError/TypeError/
RuntimeError whose message says what to change."""

import numpy as np
import pytest
import torch

import batches
import flashinfer_c
from test_batch_decode import make_cache


def decode_wrapper(fi):
    return fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1))


def test_run_before_plan(fi):
    w = decode_wrapper(fi)
    kv = torch.zeros(4, 2, 4, 2, 64)
    with pytest.raises(RuntimeError, match="before a successful plan"):
        w.run(torch.zeros(1, 2, 64), kv)


def test_int64_indptr_refused(fi):
    indptr, indices, last = batches.page_table([5], 4)
    with pytest.raises(TypeError, match=r"indptr must be int32, got int64.*\.int\(\)"):
        decode_wrapper(fi).plan(indptr.long(), indices, last, 2, 2, 64, 4)
    with pytest.raises(TypeError, match=r"astype\(np.int32\)"):
        decode_wrapper(fi).plan(
            indptr.numpy().astype(np.int64), indices.numpy(), last.numpy(), 2, 2, 64, 4
        )


def test_bad_indptr_values(fi):
    _, indices, last = batches.page_table([5, 5], 4)
    with pytest.raises(ValueError, match="must not decrease"):
        decode_wrapper(fi).plan(
            torch.tensor([0, 2, 1], dtype=torch.int32), indices, last, 2, 2, 64, 4
        )
    # A page table's indptr may start past 0 (its pages are indices[indptr[0]:],
    # as FlashInfer's kernels read it and vLLM plans its prefills); a query
    # indptr may not.
    with pytest.raises(ValueError, match="start at 0"):
        fi.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1)).plan(
            torch.tensor([1, 2, 4], dtype=torch.int32),
            torch.tensor([0, 1, 2], dtype=torch.int32),
            indices,
            last,
            2,
            2,
            64,
            4,
        )
    with pytest.raises(ValueError, match=r"indptr\[0\]=-1"):
        decode_wrapper(fi).plan(
            torch.tensor([-1, 2, 4], dtype=torch.int32), indices, last, 2, 2, 64, 4
        )


def test_bad_last_page_len_from_c(fi):
    """Checks made by the C library come back with its message."""
    indptr, indices, _ = batches.page_table([5], 4)
    with pytest.raises(ValueError, match=r"kv_last_page_len\[0\]=9"):
        decode_wrapper(fi).plan(indptr, indices, torch.tensor([9], dtype=torch.int32), 2, 2, 64, 4)


def test_heads_not_divisible(fi):
    indptr, indices, last = batches.page_table([5], 4)
    with pytest.raises(ValueError, match="not divisible"):
        decode_wrapper(fi).plan(indptr, indices, last, 6, 4, 64, 4)


def test_unsupported_head_dim(fi):
    with pytest.raises(ValueError, match="head_dim"):
        fi.single_decode_with_kv_cache(
            torch.randn(4, 72), torch.randn(3, 4, 72), torch.randn(3, 4, 72)
        )


def test_dtype_mismatch_with_plan(fi):
    indptr, indices, last = batches.page_table([5], 4)
    w = decode_wrapper(fi)
    w.plan(indptr, indices, last, 2, 2, 64, 4)  # q_data_type defaults to float16
    kv = make_cache(int(indices.max()) + 1, 4, 2, 64, torch.float16, "NHD", True)
    with pytest.raises(TypeError, match="q_data_type=float16 was planned"):
        w.run(torch.randn(1, 2, 64), kv)
    with pytest.raises(TypeError, match="k.dtype is float32, but kv_data_type=float16"):
        w.run(torch.randn(1, 2, 64).half(), kv.float())


def test_unsupported_dtype(fi):
    q = torch.randn(4, 64, dtype=torch.float64)
    with pytest.raises(TypeError, match="float64: supported are float32, float16, bfloat16"):
        fi.single_decode_with_kv_cache(q, q[None].expand(3, 4, 64), q[None].expand(3, 4, 64))


def test_wrong_kv_shape(fi):
    indptr, indices, last = batches.page_table([5], 4)
    w = decode_wrapper(fi)
    w.plan(indptr, indices, last, 2, 2, 64, 4, q_data_type=torch.float32)
    with pytest.raises(ValueError, match="paged_kv_cache"):
        w.run(torch.randn(1, 2, 64), torch.zeros(8, 3, 4, 2, 64))
    with pytest.raises(ValueError, match=r"k\.shape\[2\]=3, expected 2"):
        w.run(torch.randn(1, 2, 64), torch.zeros(8, 2, 4, 3, 64))
    with pytest.raises(ValueError, match="page id"):
        w.run(torch.randn(1, 2, 64), torch.zeros(1, 2, 4, 2, 64))


def test_wrong_out(fi):
    q, k, v = torch.randn(3, 4, 64), torch.randn(5, 4, 64), torch.randn(5, 4, 64)
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(1))
    w.plan(batches.indptr_of([3]), batches.indptr_of([5]), 4, 4, 64, q_data_type=torch.float32)
    with pytest.raises(ValueError, match=r"out.shape is \(3, 4, 32\)"):
        w.run(q, k, v, out=torch.empty(3, 4, 32))
    with pytest.raises(TypeError, match="out.dtype is float16, expected float32"):
        w.run(q, k, v, out=torch.empty(3, 4, 64, dtype=torch.float16))


def test_mixed_devices_and_array_types(fi):
    q = torch.randn(4, 64)
    k = torch.randn(3, 4, 64)
    # numpy k with torch q: both on the CPU, so this works
    fi.single_decode_with_kv_cache(q, k.numpy(), k.numpy())
    meta = torch.empty(3, 4, 64, device="meta")
    with pytest.raises(ValueError, match="one device"):
        fi.single_decode_with_kv_cache(q, meta, meta)
    with pytest.raises(TypeError, match="torch.Tensor or numpy.ndarray"):
        fi.single_decode_with_kv_cache(q, k.tolist(), k)


@pytest.mark.skipif(
    flashinfer_c.cuda_available(), reason="the CUDA backend is usable on this machine"
)
def test_cuda_tensors_need_the_cuda_backend(fi):
    """Without a usable CUDA backend, asking for it says so (no GPU needed to check)."""
    from flashinfer_c import _context

    with pytest.raises(RuntimeError, match="cannot run on CUDA here"):
        _context.get(("cuda", 0))


def test_unsupported_op_on_cuda_is_a_runtime_error(fi):
    """An op the CUDA backend lacks (FI_STATUS_UNSUPPORTED) raises, never falls back."""
    from flashinfer_c import _lib, _structs

    with pytest.raises(fi.BackendUnsupportedError, match="cuda:0.*does not fall back") as e:
        _lib.check_op(_structs.STATUS_UNSUPPORTED, "merge_state", ("cuda", 0))
    assert isinstance(e.value, RuntimeError) and isinstance(e.value, NotImplementedError)
    # on the CPU an unsupported value stays a ValueError
    with pytest.raises(fi.UnsupportedError):
        _lib.check_op(_structs.STATUS_UNSUPPORTED, "merge_state", ("cpu", 0))


def test_describe(fi):
    assert fi.describe() == fi.describe("cpu") == fi.describe(("cpu", 0))
    with pytest.raises(ValueError, match="expected 'cpu' or 'cuda"):
        fi.describe("tpu")


def test_unsupported_options_refused(fi):
    q, k, v = torch.randn(3, 4, 64), torch.randn(5, 4, 64), torch.randn(5, 4, 64)
    with pytest.raises(NotImplementedError, match="scale_q"):
        fi.single_prefill_with_kv_cache(q, k, v, scale_q=torch.ones(4))
    with pytest.raises(NotImplementedError, match="jit_args"):
        fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1), jit_args=[1])
    w = fi.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1))
    with pytest.raises(NotImplementedError, match="prefix_len_ptr"):
        w.plan(
            batches.indptr_of([1]),
            *batches.page_table([3], 4),
            4,
            4,
            64,
            4,
            prefix_len_ptr=torch.zeros(1)
        )


def test_bad_enum_strings(fi):
    q, k = torch.randn(4, 64), torch.randn(3, 4, 64)
    with pytest.raises(ValueError, match="kv_layout='NDH'"):
        fi.single_decode_with_kv_cache(q, k, k, kv_layout="NDH")
    with pytest.raises(ValueError, match="ROPE_LLAMA"):
        fi.single_decode_with_kv_cache(q, k, k, pos_encoding_mode="ROPE")


def test_enums(fi):
    assert fi.PosEncodingMode.ROPE_LLAMA.value == 1
    assert fi.MaskMode.CUSTOM.value == 2
    assert fi.TensorLayout["HND"].value == 1
