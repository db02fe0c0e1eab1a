"""The wrappers on the C library's composable formats: MultiLevelCascadeAttentionWrapper
on fi_cascade_*, the paged wrappers' prefix_detection option on
fi_cascade_create_auto, the block-sparse wrappers on fi_bsr_*; each against
the fp64 reference over the equivalent keys or dense mask."""

import pytest
import torch

import batches
import reference
from conftest import assert_close, assert_lse_close
from test_batch_decode import make_cache

I32 = torch.int32


def i32(x):
    return torch.tensor(x, dtype=I32)


def page_run(lengths, page_size, order, start):
    """Page table of consecutive runs of `lengths` tokens taken from order[start:]."""
    counts = [(n + page_size - 1) // page_size for n in lengths]
    indptr = batches.indptr_of(counts)
    indices = order[start : start + sum(counts)]
    last = i32([n - (c - 1) * page_size if c else 0 for n, c in zip(lengths, counts)])
    return (indptr, indices, last), start + sum(counts)


# ------------------------------------------------------------------ cascade


@pytest.mark.parametrize("heads", [(4, 4), (8, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("prefill", [False, True])
def test_cascade_three_levels(fi, backend, heads, dtype, prefill):
    """A prefix shared by all requests, one per group, each request's own keys
    (partial last pages on every level); the last level causal."""
    hq, hk = heads
    page_size, d = 4, 64
    groups = [[0, 1, 2], [3, 4, 5]]
    qo_lens = [2, 3, 1, 4, 1, 2] if prefill else [1] * 6
    order = torch.randperm(64).int()
    lv0, at = page_run([13], page_size, order, 0)
    lv1, at = page_run([9, 6], page_size, order, at)
    unique = [5, 9, 3, 14, 6, 3]
    lv2, at = page_run(unique, page_size, order, at)
    kv = make_cache(64, page_size, hk, d, dtype, "NHD", True)
    total = sum(qo_lens)
    q = torch.randn(total, hq, d, dtype=dtype)
    group_tokens = [sum(qo_lens[i] for i in g) for g in groups]
    qo = [i32([0, total]), batches.indptr_of(group_tokens), batches.indptr_of(qo_lens)]
    levels = [lv0, lv1, lv2]
    w = fi.MultiLevelCascadeAttentionWrapper(3, backend(torch.empty(1)))
    w.plan(
        [backend(x) for x in qo],
        *[[backend(lv[j]) for lv in levels] for j in range(3)],
        hq,
        hk,
        d,
        page_size,
        causal=True,
        q_data_type=dtype,
    )
    assert type(w._plan).__name__ == "Cascade" and w.plan_info()["num_levels"] == 3
    o = backend.torch(w.run(backend(q), backend(kv)))
    qo_indptr = batches.indptr_of(qo_lens)
    for i in range(6):
        g = 0 if i in groups[0] else 1
        parts = [(lv0, 0), (lv1, g), (lv2, i)]
        k = torch.cat([batches.gather(kv[:, 0], *lv, page_size, r) for lv, r in parts])
        v = torch.cat([batches.gather(kv[:, 1], *lv, page_size, r) for lv, r in parts])
        s, e = int(qo_indptr[i]), int(qo_indptr[i + 1])
        ref_o, _ = reference.attention(q[s:e], k, v, causal=True)
        assert_close(o[s:e], ref_o, dtype, what=f"request {i}")


def test_cascade_replan_grows(fi):
    """One wrapper, batches that outgrow the C cascade's bounds: re-created, still exact."""
    page_size, h, d = 8, 4, 64
    kv = make_cache(600, page_size, h, d, torch.float32, "NHD", True)
    w = fi.MultiLevelCascadeAttentionWrapper(2, torch.empty(1))
    for batch, shared_pages in ((3, 2), (40, 30), (5, 1)):
        order = torch.randperm(600).int()
        shared = (i32([0, shared_pages]), order[:shared_pages], i32([page_size]))
        own, _ = page_run([7] * batch, page_size, order, shared_pages)
        q = torch.randn(batch, h, d)
        w.plan(
            [i32([0, batch]), torch.arange(batch + 1, dtype=I32)],
            [shared[0], own[0]],
            [shared[1], own[1]],
            [shared[2], own[2]],
            h,
            h,
            d,
            page_size,
            q_data_type="float32",
        )
        o = w.run(q, kv)
        for i in range(batch):
            k = torch.cat([kv[order[:shared_pages].long(), 0].reshape(-1, h, d),
                           batches.gather(kv[:, 0], *own, page_size, i)])  # fmt: skip
            v = torch.cat([kv[order[:shared_pages].long(), 1].reshape(-1, h, d),
                           batches.gather(kv[:, 1], *own, page_size, i)])  # fmt: skip
            ref_o, _ = reference.attention(q[i : i + 1], k, v)
            assert_close(o[i : i + 1], ref_o, torch.float32)


def test_cascade_refuses_rope(fi):
    w = fi.MultiLevelCascadeAttentionWrapper(2, torch.empty(1))
    table = ([i32([0, 1]), i32([0, 1, 2])], [i32([0]), i32([1, 2])], [i32([4]), i32([4, 4])])
    with pytest.raises(ValueError, match="fi_rope_apply"):
        w.plan(
            [i32([0, 2]), i32([0, 1, 2])], *table, 4, 4, 64, 4, pos_encoding_mode="ROPE_LLAMA"
        )


# -------------------------------------------------------- prefix detection


def radix_batch(page_size):
    """Six requests over a 3-deep radix tree: 3 pages shared by all, 2 more by
    requests 0-2 (1 more by 0-1), 1 more by 3-4, then each request's own tokens."""
    common, left, right, pair = [0, 1, 2], [3, 4], [5], [6]
    own = 7
    indices, indptr, last, lens = [], [0], [], []
    for i, n in enumerate([9, 5, 12, 7, 1, 15]):
        shared = common + (left if i < 3 else right if i < 5 else []) + (pair if i < 2 else [])
        pages = (n + page_size - 1) // page_size
        indices += shared + list(range(own, own + pages))
        own += pages
        indptr.append(len(indices))
        last.append(n - (pages - 1) * page_size)
        lens.append(len(shared) * page_size + n)
    return i32(indptr), i32(indices), i32(last), own


@pytest.mark.parametrize("kind", ["decode", "prefill"])
@pytest.mark.parametrize("mode", ["always", "auto", "off"])
def test_prefix_detection(fi, backend, kind, mode):
    page_size, hq, hk, d = 4, 8, 2, 64
    indptr, indices, last, num_pages = radix_batch(page_size)
    kv = make_cache(num_pages, page_size, hk, d, torch.float16, "NHD", True)
    qo_lens = [1] * 6 if kind == "decode" else [3, 1, 2, 4, 1, 2]
    q = torch.randn(sum(qo_lens), hq, d, dtype=torch.float16)
    outs = {}
    for detection in (None, mode):
        if kind == "decode":
            w = fi.BatchDecodeWithPagedKVCacheWrapper(
                backend(torch.empty(1)), prefix_detection=detection
            )
            w.plan(backend(indptr), backend(indices), backend(last), hq, hk, d, page_size)
        else:
            w = fi.BatchPrefillWithPagedKVCacheWrapper(
                backend(torch.empty(1)), prefix_detection=detection
            )
            w.plan(
                backend(batches.indptr_of(qo_lens)), backend(indptr), backend(indices),
                backend(last), hq, hk, d, page_size, causal=True,
            )  # fmt: skip
        outs[detection] = w.run(backend(q), backend(kv), return_lse=True)
        info = w.plan_info()
    assert type(w._plan).__name__ == "AutoCascadePlan"
    if mode == "always":
        assert info["split"] and info["num_levels"] == 4, info
    if mode == "off":
        assert not info["split"] and info["num_levels"] == 1, info
    ref_o, ref_s = outs[None]
    assert_close(outs[mode][0], backend.torch(ref_o).double(), torch.float16)
    assert_lse_close(outs[mode][1], backend.torch(ref_s).double(), torch.float16)


def test_prefix_detection_option(fi):
    with pytest.raises(ValueError, match="prefix_detection"):
        fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1), prefix_detection="sometimes")
    w = fi.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1), prefix_detection=True)
    assert w.prefix_detection == 0  # FI_PREFIX_DETECTION_AUTO
    assert fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1)).prefix_detection is None


# ------------------------------------------------------------- block-sparse


def gathered_mask(M, N, row_starts, row_keys, causal):
    """Dense [M, N] mask of block rows [row_starts[i], row_starts[i+1]) reading
    keys row_keys[i] (in gathered order); causal along the gathered keys,
    bottom-right aligned (FlashInfer's block-sparse causal)."""
    dense = torch.zeros(M, N, dtype=torch.bool)
    for i, keys in enumerate(row_keys):
        rows = range(row_starts[i], row_starts[i + 1])
        for r, t in enumerate(rows):
            seen = keys
            if causal:
                seen = keys[: max(len(keys) - len(rows) + r + 1, 0)]
            dense[t, seen] = True
    return dense


def variable_mask(blocks, row_sz, col_sz, causal):
    """Dense mask of one KV head's variable blocks [MB, NB] (causal as gathered_mask)."""
    starts = [0] + torch.cumsum(row_sz, 0).tolist()
    col0 = [0] + torch.cumsum(col_sz, 0).tolist()
    MB, NB = blocks.shape
    keys = [
        [t for j in range(NB) if blocks[i, j] for t in range(col0[j], col0[j + 1])]
        for i in range(MB)
    ]
    return gathered_mask(starts[-1], col0[-1], starts, keys, causal)


def bsr_keys(indptr, indices, N, C):
    """Each block row's keys, in gathered order."""
    rows = [indices[indptr[i] : indptr[i + 1]].tolist() for i in range(len(indptr) - 1)]
    return [[t for j in row for t in range(j * C, min((j + 1) * C, N))] for row in rows]


def random_bsr(MB, NB, density):
    blocks = torch.rand(MB, NB) < density
    indptr = batches.indptr_of(blocks.sum(1).tolist())
    indices = torch.nonzero(blocks)[:, 1].int()
    return indptr, indices


@pytest.mark.parametrize(
    "shape", [(64, 96, 16, 32), (50, 70, 16, 16), (37, 45, 4, 1), (7, 9, 3, 5)]
)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("element_mask", [False, True])
def test_block_sparse_c(fi, backend, shape, causal, element_mask):
    M, N, R, C = shape
    MB, NB = -(-M // R), -(-N // C)
    indptr, indices = random_bsr(MB, NB, 0.4)
    hq, hk, d = 8, 2, 64
    q, k, v = (torch.randn(n, h, d, dtype=torch.float16) for n, h in ((M, hq), (N, hk), (N, hk)))
    masks = torch.rand(len(indices), R, C) > 0.3 if element_mask else None
    w = fi.BlockSparseAttentionWrapper(backend(torch.empty(1)))
    w.plan(
        backend(indptr), backend(indices), M, N, R, C, hq, hk, d,
        mask=None if masks is None else backend(masks), causal=causal,
    )  # fmt: skip
    assert w._bsr is not None and not w._tokens  # on fi_bsr
    o, lse = w.run(backend(q), backend(k), backend(v), return_lse=True)
    starts = [min(i * R, M) for i in range(MB + 1)]
    dense = gathered_mask(M, N, starts, bsr_keys(indptr, indices, N, C), causal)
    if masks is not None:
        dense &= element_dense(indptr, indices, M, N, R, C, masks)
    ref_o, ref_lse = reference.attention(q, k, v, mask=dense)
    assert_close(o, ref_o, torch.float16)
    assert_lse_close(lse, ref_lse, torch.float16)


def element_dense(indptr, indices, M, N, R, C, masks):
    """The element masks placed in a dense [M, N] mask (True outside blocks)."""
    dense = torch.ones(M, N, dtype=torch.bool)
    for i in range(len(indptr) - 1):
        for e in range(int(indptr[i]), int(indptr[i + 1])):
            j = int(indices[e])
            h, wd = min(R, M - i * R), min(C, N - j * C)
            dense[i * R : i * R + h, j * C : j * C + wd] = masks[e][:h, :wd]
    return dense



def test_block_sparse_packed_mask(fi):
    """packed_mask (each block row's [rows, gathered keys] bits, segment_packbits)
    gives what mask gives."""
    M, N, R, C = 24, 40, 8, 8
    indptr, indices = random_bsr(3, 5, 0.6)
    masks = torch.rand(len(indices), R, C) > 0.4
    hq, d = 4, 64
    q, k, v = torch.randn(M, hq, d), torch.randn(N, hq, d), torch.randn(N, hq, d)
    bits, seg = [], [0]
    for i in range(3):
        s, e = int(indptr[i]), int(indptr[i + 1])
        bits.append(masks[s:e].permute(1, 0, 2).reshape(-1))
        seg.append(seg[-1] + R * (e - s) * C)
    packed, _ = fi.segment_packbits(torch.cat(bits), i32(seg), bitorder="little")
    outs = []
    for kw in (dict(mask=masks), dict(packed_mask=packed)):
        w = fi.BlockSparseAttentionWrapper(torch.empty(1))
        w.plan(indptr, indices, M, N, R, C, hq, hq, d, q_data_type="float32",
               o_data_type="float32", **kw)  # fmt: skip
        outs.append(w.run(q, k, v))
    assert torch.equal(outs[0], outs[1])


def test_block_sparse_rope_falls_back(fi):
    """Fused RoPE: the token lowering (a plain plan); one dense block row is one request."""
    M, N, d = 16, 32, 64
    q, k, v = torch.randn(M, 4, d), torch.randn(N, 4, d), torch.randn(N, 4, d)
    w = fi.BlockSparseAttentionWrapper(torch.empty(1))
    w.plan(i32([0, 4]), i32([0, 1, 2, 3]), M, N, M, 8, 4, 4, d, causal=True,
           pos_encoding_mode="ROPE_LLAMA", q_data_type="float32",
           o_data_type="float32")  # fmt: skip
    assert w._tokens
    ref = fi.single_prefill_with_kv_cache(q, k, v, causal=True, pos_encoding_mode="ROPE_LLAMA")
    assert_close(w.run(q, k, v), ref.double(), torch.float32)


@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_variable_block_sparse_c(fi, backend, heads, causal, dtype):
    """Per-head block sizes (zero-size blocks, sizes of a common multiple),
    out/lse given by the caller; causal runs on the token lowering."""
    hq, hk = heads
    d = 64
    rows = [[1, 2, 3, 10, 0], [4, 4, 4, 4, 0], [0, 16, 0, 0, 0], [5, 5, 5, 1, 0]]
    cols = [[3, 1, 2, 20, 6], [8, 8, 8, 4, 4], [4, 4, 8, 12, 4], [0, 32, 0, 0, 0]]
    row_sz = i32([rows[h % 4] for h in range(hk)])
    col_sz = i32([cols[(h + 1) % 4] for h in range(hk)])
    blocks = torch.rand(hk, 5, 5) > 0.4
    qo_len, kv_len = 16, 32
    q = torch.randn(hq, qo_len, d, dtype=dtype)
    k, v = torch.randn(hk, kv_len, d, dtype=dtype), torch.randn(hk, kv_len, d, dtype=dtype)
    w = fi.VariableBlockSparseAttentionWrapper(backend(torch.empty(1)))
    w.plan(backend(blocks), backend(row_sz), backend(col_sz), hq, hk, d, causal=causal,
           q_data_type=dtype)  # fmt: skip
    assert w._tokens == causal
    out = backend(torch.full((hq, qo_len, d), float("nan"), dtype=dtype))
    lse = backend(torch.full((hq, qo_len), float("nan")))
    o, s = w.run(backend(q), backend(k), backend(v), out=out, lse=lse, return_lse=True)
    assert o is out and s is lse
    for h in range(hq):
        kh = h // (hq // hk)
        dense = variable_mask(blocks[kh], row_sz[kh], col_sz[kh], causal)
        ref_o, ref_lse = reference.attention(
            q[h][:, None], k[kh][:, None], v[kh][:, None], mask=dense
        )
        assert_close(backend.torch(o)[h], ref_o[:, 0], dtype, what=f"head {h}")
        assert_lse_close(backend.torch(s)[h], ref_lse[:, 0], dtype)
