"""User-defined variants from Python (flashinfer_c.Variant, jit_args) on the
CPU, against float64 references of the same formulas. Skipped without a C
compiler ($FLASHINFER_CC, $CC or cc), which the CPU backend compiles them with."""

import os
import shutil

import numpy as np
import pytest
import torch

import batches
from conftest import assert_close

_CC = (os.environ.get("FLASHINFER_CC") or os.environ.get("CC") or "cc").split()[0]
pytestmark = pytest.mark.skipif(
    shutil.which(_CC) is None, reason=f"no C compiler ({_CC}) for user-defined variants"
)

SIGMOID = dict(
    scalars=[("bias", "float")],
    use_softmax=False,
    logits_transform="return 1.0f / (1.0f + expf(-(s + p.bias)));",
)
SINK = dict(
    tensors=[("sink", "float32")],
    output_transform=(
        "float w = 1.0f / (1.0f + expf(p.sink[c->qo_head] - lse));\n"
        "for (int32_t d = 0; d < c->head_dim; d++) o[d] *= w;"
    ),
)


def _reference(q, ks, vs, qo_lens, group, causal, weights):
    """Per request: logits s = q.k / sqrt(d); weights(s, mask, h) -> (o, lse)."""
    outs, at = [], 0
    for i, n in enumerate(qo_lens):
        k = ks[i].double().repeat_interleave(group, dim=1)  # [kv, H, D]
        v = vs[i].double().repeat_interleave(group, dim=1)
        qi = q[at : at + n].double()
        s = torch.einsum("qhd,khd->hqk", qi, k) / q.shape[-1] ** 0.5
        kv = k.shape[0]
        mask = torch.ones(n, kv, dtype=torch.bool)
        if causal:
            mask = torch.arange(kv)[None, :] <= (kv - n + torch.arange(n))[:, None]
        outs.append(weights(s, mask, v))
        at += n
    return torch.cat(outs)


def test_sigmoid_decode(fi):
    page_size, hq, hk, d = 16, 8, 2, 64
    kv_lens = [1, 17, 100, 45]
    indptr, indices, last = batches.page_table(kv_lens, page_size)
    kv = torch.randn(int(indices.max()) + 1, 2, page_size, hk, d)
    q = torch.randn(len(kv_lens), hq, d)
    variant = fi.Variant("py_sigmoid", **SIGMOID)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8), "NHD",
                                              jit_args=variant)
    w.plan(indptr, indices, last, hq, hk, d, page_size, q_data_type=torch.float32)
    bias = -0.75
    o = w.run(q, kv, bias)
    ks = [batches.gather(kv[:, 0], indptr, indices, last, page_size, i) for i in range(4)]
    vs = [batches.gather(kv[:, 1], indptr, indices, last, page_size, i) for i in range(4)]

    def sig(s, mask, v):
        p = torch.sigmoid(s + bias) * mask
        return torch.einsum("hqk,khd->qhd", p, v)

    assert_close(o, _reference(q, ks, vs, [1] * 4, hq // hk, False, sig), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sink_prefill(fi, dtype):
    page_size, hq, hk, d = 8, 4, 2, 128
    qo_lens, kv_lens = [3, 1, 7], [20, 9, 7]
    indptr, indices, last = batches.page_table(kv_lens, page_size)
    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32)
    kv = torch.randn(int(indices.max()) + 1, 2, page_size, hk, d, dtype=dtype)
    q = torch.randn(sum(qo_lens), hq, d, dtype=dtype)
    sink = torch.randn(hq)
    variant = fi.Variant.from_jit_args(
        "py_sink", ["sink"], ["float32"], output_transform=SINK["output_transform"]
    )
    w = fi.BatchPrefillWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8), "NHD",
                                               jit_args=[variant])
    w.plan(qo_indptr, indptr, indices, last, hq, hk, d, page_size, causal=True,
           q_data_type=dtype)
    o = w.run(q, kv, sink)
    ks = [batches.gather(kv[:, 0], indptr, indices, last, page_size, i) for i in range(3)]
    vs = [batches.gather(kv[:, 1], indptr, indices, last, page_size, i) for i in range(3)]

    def softmax_sink(s, mask, v):
        s = s.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)  # [H, q]
        o = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v)
        return o / (1 + torch.exp(sink.double()[None, :] - lse.T))[:, :, None]

    assert_close(o, _reference(q, ks, vs, qo_lens, hq // hk, True, softmax_sink), dtype)


def test_source_and_errors(fi):
    v = fi.Variant("py_text", **SINK)
    c, cu = v.source("c"), v.source("cuda")
    assert "const float *sink;" in c and "#define FI_HOOK static inline" in c
    assert "__device__ __forceinline__" in cu and "p.sink[c->qo_head]" in cu
    assert "p.cap * tanhf(s / p.cap)" in fi.variant.builtin_source("soft_cap")
    with pytest.raises(fi.InvalidArgumentError, match="not a C identifier"):
        fi.Variant("bad name")
    with pytest.raises(ValueError, match="expected float or int"):
        fi.Variant("x", scalars=[("a", "complex")])
    with pytest.raises(NotImplementedError, match="flashinfer_c.Variant"):
        fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1), "NHD", jit_args=["uri", "decl"])
    broken = fi.Variant("py_broken", logits_transform="return s * not_declared;")
    w = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8), "NHD",
                                              jit_args=broken)
    indptr, indices, last = batches.page_table([5], 16)
    with pytest.raises(fi.CompileError, match="not_declared"):
        w.plan(indptr, indices, last, 4, 2, 64, 16, q_data_type=torch.float32)
    # wrong number of run() values
    w2 = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8), "NHD",
                                               jit_args=fi.Variant("py_sig2", **SIGMOID))
    w2.plan(indptr, indices, last, 4, 2, 64, 16, q_data_type=torch.float32)
    kv = torch.randn(int(indices.max()) + 1, 2, 16, 2, 64)
    with pytest.raises(ValueError, match="takes 1 values"):
        w2.run(torch.randn(1, 4, 64), kv)
