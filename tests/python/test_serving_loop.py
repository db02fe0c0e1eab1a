"""A serving loop: a prefill step, then decode steps that append each new
token's K/V to the paged cache (append_paged_kv_cache), plan once per step
and run every layer; requests finish and join between steps, so the batch
changes (and the C plan's bounds grow)."""

import pytest
import torch

import reference
from conftest import assert_close

LAYERS, HQ, HK, D, PAGE, POOL = 3, 8, 2, 64, 4, 96


class Engine:
    """The host side of a serving engine: page allocation and KV history."""

    def __init__(self, fi, backend, layout, dtype):
        self.fi, self.backend, self.layout, self.dtype = fi, backend, layout, dtype
        shape = (POOL, 2, PAGE, HK, D) if layout == "NHD" else (POOL, 2, HK, PAGE, D)
        self.caches = [backend(torch.zeros(shape, dtype=dtype)) for _ in range(LAYERS)]
        self.free = list(torch.randperm(POOL).tolist())
        self.requests = {}  # id -> dict(pages, len, k[layer], v[layer])
        ws = backend(torch.empty(1, dtype=torch.uint8))
        self.decode = fi.BatchDecodeWithPagedKVCacheWrapper(ws, layout)
        self.prefill = fi.BatchPrefillWithPagedKVCacheWrapper(ws, layout)

    def page_table(self, ids):
        indptr, indices, last = [0], [], []
        for r in ids:
            req = self.requests[r]
            indices += req["pages"]
            indptr.append(len(indices))
            last.append(req["len"] - (len(req["pages"]) - 1) * PAGE)
        i32 = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
        return i32(indptr), i32(indices), i32(last)

    def grow(self, r, n):
        """Make room for n more tokens of request r."""
        req = self.requests[r]
        req["len"] += n
        while len(req["pages"]) * PAGE < req["len"]:
            req["pages"].append(self.free.pop())

    def append(self, ids, counts):
        """New K/V for the last counts[i] tokens of each request, every layer."""
        b = self.backend
        indptr, indices, last = self.page_table(ids)
        append_indptr = torch.zeros(len(ids) + 1, dtype=torch.int32)
        append_indptr[1:] = torch.cumsum(torch.tensor(counts), 0)
        seq_lens = self.fi.get_seq_lens(b(indptr), b(last), PAGE)
        bi, pos = self.fi.get_batch_indices_positions(b(append_indptr), seq_lens, sum(counts))
        for layer in range(LAYERS):
            k = torch.randn(sum(counts), HK, D, dtype=self.dtype)
            v = torch.randn(sum(counts), HK, D, dtype=self.dtype)
            self.fi.append_paged_kv_cache(
                b(k),
                b(v),
                bi,
                pos,
                self.caches[layer],
                b(indices),
                b(indptr),
                b(last),
                kv_layout=self.layout,
            )
            for i, r in enumerate(ids):
                rows = slice(int(append_indptr[i]), int(append_indptr[i + 1]))
                req = self.requests[r]
                req["k"][layer] = torch.cat([req["k"][layer], k[rows]])
                req["v"][layer] = torch.cat([req["v"][layer], v[rows]])

    def join(self, r, prompt_len):
        self.requests[r] = dict(
            pages=[],
            len=0,
            k=[torch.zeros(0, HK, D, dtype=self.dtype)] * LAYERS,
            v=[torch.zeros(0, HK, D, dtype=self.dtype)] * LAYERS,
        )
        self.grow(r, prompt_len)

    def leave(self, r):
        self.free += self.requests.pop(r)["pages"]

    def check(self, ids, qo_lens, q, o, layer):
        start = 0
        for r, n in zip(ids, qo_lens):
            req = self.requests[r]
            ref, _ = reference.attention(
                q[start : start + n], req["k"][layer], req["v"][layer], causal=True
            )
            assert_close(
                self.backend.torch(o)[start : start + n],
                ref,
                self.dtype,
                what=f"request {r} layer {layer}",
            )
            start += n

    def prefill_step(self, prompts):
        """prompts: {id: length}. One plan, then every layer."""
        for r, n in prompts.items():
            self.join(r, n)
        ids, lens = list(prompts), list(prompts.values())
        self.append(ids, lens)
        b = self.backend
        indptr, indices, last = self.page_table(ids)
        qo_indptr = torch.zeros(len(ids) + 1, dtype=torch.int32)
        qo_indptr[1:] = torch.cumsum(torch.tensor(lens), 0)
        self.prefill.plan(
            b(qo_indptr),
            b(indptr),
            b(indices),
            b(last),
            HQ,
            HK,
            D,
            PAGE,
            causal=True,
            q_data_type=self.dtype,
        )
        for layer in range(LAYERS):
            q = torch.randn(sum(lens), HQ, D, dtype=self.dtype)
            o = self.prefill.run(b(q), self.caches[layer])
            self.check(ids, lens, q, o, layer)

    def decode_step(self):
        ids = sorted(self.requests)
        for r in ids:
            self.grow(r, 1)
        self.append(ids, [1] * len(ids))
        b = self.backend
        indptr, indices, last = self.page_table(ids)
        self.decode.plan(b(indptr), b(indices), b(last), HQ, HK, D, PAGE, q_data_type=self.dtype)
        for layer in range(LAYERS):
            q = torch.randn(len(ids), HQ, D, dtype=self.dtype)
            o = self.decode.run(b(q), self.caches[layer])
            self.check(ids, [1] * len(ids), q, o, layer)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_serving_loop(fi, backend, layout, dtype):
    engine = Engine(fi, backend, layout, dtype)
    engine.prefill_step({0: 5, 1: 9, 2: 2})
    for step in range(8):
        if step == 2:
            engine.leave(1)
        if step == 3:
            engine.prefill_step({3: 7})
        if step == 5:
            # Nine requests: past the C plan's first bounds, which then grow.
            engine.prefill_step({4: 3, 5: 12, 6: 1, 7: 2, 8: 5, 9: 4})
        engine.decode_step()
    assert len(engine.requests) == 9
    assert engine.decode._plan.bounds.batch >= 9
