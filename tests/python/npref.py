"""numpy-only helpers for the tests that run without torch: random paged
batches and an fp64 reference of attention (reference.py's semantics, with
attention sinks).

Semantics: GQA head h reads KV head h // (H_qo / H_kv); causal is aligned
bottom-right; the window keeps keys j >= kv_len - qo_len + i - window_left;
soft-cap is c * tanh(s * sm_scale / c); a sink adds exp(sink[h]) to the
softmax denominator (gpt-oss); LSE is base 2 (with the sink's term); a row
that sees no key has O = 0 and LSE -inf (log2 of the sink's term with a sink).
"""

import math

import numpy as np

LOG2E = 1.0 / math.log(2.0)

TOL = {  # (atol, rtol) against the fp64 reference
    "float32": (2e-5, 2e-5),
    "float16": (4e-3, 4e-3),
}


def rng(seed=1234):
    return np.random.default_rng(seed)


def randn(g, *shape, dtype="float32"):
    return g.standard_normal(shape).astype(dtype)


def page_table(kv_lens, page_size, g, num_pages=None):
    """(indptr, indices, last_page_len) int32, pages drawn at random from a pool."""
    counts = [(n + page_size - 1) // page_size for n in kv_lens]
    total = sum(counts)
    num_pages = num_pages or total + 3
    indices = g.permutation(num_pages)[:total].astype(np.int32)
    indptr = np.zeros(len(kv_lens) + 1, dtype=np.int32)
    indptr[1:] = np.cumsum(counts)
    last = np.array(
        [(n - (c - 1) * page_size) if c else 0 for n, c in zip(kv_lens, counts)], dtype=np.int32
    )
    return indptr, indices, last


def indptr_of(lengths):
    out = np.zeros(len(lengths) + 1, dtype=np.int32)
    out[1:] = np.cumsum(lengths)
    return out


def gather(cache, indptr, indices, last, page_size, i, layout="NHD"):
    """Request i's K or V [kv_len, H, D] from a paged cache [pages, ...]."""
    pages = indices[indptr[i] : indptr[i + 1]]
    heads = cache.shape[2] if layout == "NHD" else cache.shape[1]
    if len(pages) == 0:
        return np.zeros((0, heads, cache.shape[-1]), dtype=cache.dtype)
    rows = cache[pages]
    if layout == "HND":
        rows = rows.transpose(0, 2, 1, 3)
    rows = rows.reshape(-1, rows.shape[-2], rows.shape[-1])
    return rows[: (len(pages) - 1) * page_size + int(last[i])]


def attention(
    q, k, v, causal=False, window_left=-1, logits_soft_cap=0.0, sm_scale=None, sinks=None
):
    """One request: q [qo_len, H_qo, D], k/v [kv_len, H_kv, D] -> (o, lse) float64."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    qo_len, hq, d = q.shape
    kv_len, hk, _ = k.shape
    group = hq // hk
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    out = np.zeros((qo_len, hq, v.shape[-1]))
    lse = np.full((qo_len, hq), -np.inf)
    i = np.arange(qo_len)[:, None]
    j = np.arange(kv_len)[None, :]
    diag = kv_len - qo_len + i
    visible = np.ones((qo_len, kv_len), dtype=bool)
    if causal:
        visible &= j <= diag
    if window_left >= 0:
        visible &= j >= diag - window_left
    for h in range(hq):
        kh = h // group
        s = (q[:, h, :] @ k[:, kh, :].T) * scale
        if logits_soft_cap:
            s = logits_soft_cap * np.tanh(s / logits_soft_cap)
        s = np.where(visible, s, -np.inf)
        for r in range(qo_len):
            row = s[r]
            terms = row[visible[r]]
            if sinks is not None:
                terms = np.concatenate([terms, [float(sinks[h])]])
            if terms.size == 0:
                continue
            m = terms.max()
            denom = np.exp(terms - m).sum()
            p = np.where(visible[r], np.exp(row - m), 0.0) / denom
            out[r, h] = p @ v[:, kh, :]
            lse[r, h] = (m + math.log(denom)) * LOG2E
    return out, lse


def batch_reference(q, k_cache, v_cache, qo_indptr, indptr, indices, last, page_size,
                    layout="NHD", **options):
    """Every request of a paged batch: (o [total_q, H, D], lse [total_q, H])."""
    outs, lses = [], []
    for i in range(len(last)):
        k = gather(k_cache, indptr, indices, last, page_size, i, layout)
        v = gather(v_cache, indptr, indices, last, page_size, i, layout)
        o, s = attention(q[qo_indptr[i] : qo_indptr[i + 1]], k, v, **options)
        outs.append(o)
        lses.append(s)
    return np.concatenate(outs), np.concatenate(lses)


def assert_close(got, ref, dtype="float32", what="output"):
    got = np.asarray(got, dtype=np.float64)
    assert not np.isnan(got).any(), f"{what}: NaN"
    atol, rtol = TOL[dtype]
    np.testing.assert_allclose(got, ref, atol=atol, rtol=rtol, err_msg=what)


def assert_lse_close(got, ref, dtype="float32"):
    got = np.asarray(got, dtype=np.float64)
    inf = np.isinf(ref)
    assert np.array_equal(np.isinf(got), inf), "lse: -inf rows differ"
    atol, rtol = TOL[dtype]
    np.testing.assert_allclose(got[~inf], ref[~inf], atol=4 * atol, rtol=4 * rtol)
