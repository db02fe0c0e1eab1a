"""A serving loop on the GPU: prefill steps run eagerly; decode steps append
each request's new K/V to the paged cache, plan once, and run every layer
through one CUDA graph, captured at the first decode step and replayed at
every later one while requests join and leave (the batch padded to the
graph's fixed size with requests of no pages, as serving engines pad).
Every step's outputs are checked against the fp64 reference.

K/V are appended with flashinfer_c.append_paged_kv_cache on CUDA, and, so
that the graph replays are checked whatever the state of that op's CUDA
kernel, once more with plain torch indexing as the writer.
"""

import pytest
import torch

import reference
from conftest import DEVICE, GPU_MARKS, Graph, assert_close, on_gpu, synchronize

pytestmark = GPU_MARKS

LAYERS, HQ, HK, D, PAGE, POOL, BATCH = 2, 8, 2, 128, 16, 48, 4
F16 = torch.float16


def i32(values):
    return torch.tensor(values, dtype=torch.int32)


class Engine:
    def __init__(self, fi, layout, writer):
        self.fi, self.layout, self.writer = fi, layout, writer
        shape = (POOL, 2, PAGE, HK, D) if layout == "NHD" else (POOL, 2, HK, PAGE, D)
        self.caches = [torch.zeros(shape, dtype=F16, device=DEVICE) for _ in range(LAYERS)]
        self.free = torch.randperm(POOL).tolist()
        self.requests = {}  # id -> dict(pages, len, k[layer], v[layer]) (history on the host)
        ws = torch.empty(1 << 20, dtype=torch.uint8, device=DEVICE)
        self.prefill = fi.BatchPrefillWithPagedKVCacheWrapper(ws, layout)
        self.decode = fi.BatchDecodeWithPagedKVCacheWrapper(
            ws,
            layout,
            use_cuda_graph=True,
            paged_kv_indptr_buffer=torch.zeros(BATCH + 1, dtype=torch.int32, device=DEVICE),
            paged_kv_indices_buffer=torch.zeros(POOL, dtype=torch.int32, device=DEVICE),
            paged_kv_last_page_len_buffer=torch.zeros(BATCH, dtype=torch.int32, device=DEVICE),
        )
        # The graph's fixed tensors: one q and one out per layer.
        self.q = torch.zeros(LAYERS, BATCH, HQ, D, dtype=F16, device=DEVICE)
        self.out = torch.zeros(LAYERS, BATCH, HQ, D, dtype=F16, device=DEVICE)
        self.graph = None
        self.captured_plan = None

    # ------------------------------------------------------------ requests

    def join(self, r, prompt_len):
        empty = torch.zeros(0, HK, D, dtype=F16)
        self.requests[r] = dict(pages=[], len=0, k=[empty] * LAYERS, v=[empty] * LAYERS)
        self.grow(r, prompt_len)

    def leave(self, r):
        self.free += self.requests.pop(r)["pages"]

    def grow(self, r, n):
        req = self.requests[r]
        req["len"] += n
        while len(req["pages"]) * PAGE < req["len"]:
            req["pages"].append(self.free.pop())

    def page_table(self, ids, pad_to=None):
        """(indptr, indices, last_page_len) on the host; padded with empty requests."""
        indptr, indices, last = [0], [], []
        for r in ids:
            req = self.requests[r]
            indices += req["pages"]
            indptr.append(len(indices))
            last.append(req["len"] - (len(req["pages"]) - 1) * PAGE)
        while pad_to is not None and len(last) < pad_to:
            indptr.append(len(indices))
            last.append(0)
        return i32(indptr), i32(indices), i32(last)

    # ------------------------------------------------------------- KV cache

    def append(self, ids, counts):
        """New K/V for the last counts[i] tokens of each request, every layer."""
        indptr, indices, last = self.page_table(ids)
        nnz = sum(counts)
        append_indptr = torch.zeros(len(ids) + 1, dtype=torch.int32)
        append_indptr[1:] = torch.cumsum(i32(counts), 0)
        fi = self.fi
        d_indptr, d_indices, d_last = on_gpu(indptr), on_gpu(indices), on_gpu(last)
        seq_lens = fi.get_seq_lens(d_indptr, d_last, PAGE)
        bi, pos = fi.get_batch_indices_positions(on_gpu(append_indptr), seq_lens, nnz)
        for layer in range(LAYERS):
            k = torch.randn(nnz, HK, D, dtype=F16)
            v = torch.randn(nnz, HK, D, dtype=F16)
            cache = self.caches[layer]
            if self.writer == "flashinfer":
                table = (d_indices, d_indptr, d_last)
                try:
                    fi.append_paged_kv_cache(
                        on_gpu(k), on_gpu(v), bi, pos, cache, *table, kv_layout=self.layout
                    )
                except fi.BackendUnsupportedError as e:
                    pytest.skip(f"append_paged_kv_cache is not on CUDA yet: {e}")
            else:
                slots = (bi.cpu().long(), pos.cpu().long())
                self.write_with_torch(cache, k, v, *slots, indptr, indices)
            for i, r in enumerate(ids):
                rows = slice(int(append_indptr[i]), int(append_indptr[i + 1]))
                req = self.requests[r]
                req["k"][layer] = torch.cat([req["k"][layer], k[rows]])
                req["v"][layer] = torch.cat([req["v"][layer], v[rows]])

    def write_with_torch(self, cache, k, v, bi, pos, indptr, indices):
        pages = indices[indptr[bi].long() + pos // PAGE].long().to(DEVICE)
        slots = (pos % PAGE).to(DEVICE)
        for j, rows in ((0, k), (1, v)):
            if self.layout == "NHD":
                cache[pages, j, slots] = on_gpu(rows)
            else:
                cache[pages, j, :, slots] = on_gpu(rows)

    # ---------------------------------------------------------------- steps

    def check(self, ids, qo_lens, q, o, layer):
        start = 0
        for r, n in zip(ids, qo_lens):
            req = self.requests[r]
            rows = slice(start, start + n)
            ref, _ = reference.attention(q[rows], req["k"][layer], req["v"][layer], causal=True)
            assert_close(o[rows], ref, F16, what=f"request {r} layer {layer}")
            start += n

    def prefill_step(self, prompts):
        """prompts {id: length}: eager, one plan and every layer."""
        for r, n in prompts.items():
            self.join(r, n)
        ids, lens = list(prompts), list(prompts.values())
        self.append(ids, lens)
        indptr, indices, last = self.page_table(ids)
        qo_indptr = torch.zeros(len(ids) + 1, dtype=torch.int32)
        qo_indptr[1:] = torch.cumsum(i32(lens), 0)
        table = (indptr, indices, last)
        self.prefill.plan(qo_indptr, *table, HQ, HK, D, PAGE, causal=True, q_data_type=F16)
        for layer in range(LAYERS):
            q = torch.randn(sum(lens), HQ, D, dtype=F16)
            o = self.prefill.run(on_gpu(q), self.caches[layer])
            self.check(ids, lens, q, o, layer)

    def forward(self):
        """What the graph holds: decode attention of every layer."""
        for layer in range(LAYERS):
            self.decode.run(self.q[layer], self.caches[layer], out=self.out[layer])

    def decode_step(self):
        ids = sorted(self.requests)
        assert len(ids) <= BATCH
        for r in ids:
            self.grow(r, 1)
        self.append(ids, [1] * len(ids))
        indptr, indices, last = self.page_table(ids, pad_to=BATCH)
        self.decode.plan(indptr, indices, last, HQ, HK, D, PAGE, q_data_type=F16)
        q = torch.randn(LAYERS, BATCH, HQ, D, dtype=F16)
        self.q.copy_(q)
        if self.graph is None:
            self.graph = Graph(self.forward)
            self.captured_plan = self.decode._plan.handle
        self.graph.replay()
        synchronize()
        for layer in range(LAYERS):
            self.check(ids, [1] * len(ids), q[layer], self.out[layer].cpu(), layer)
        return len(ids)


@pytest.mark.parametrize("writer", ["flashinfer", "torch"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_serving_loop_with_cuda_graph(fi, layout, writer):
    torch.manual_seed(7)
    engine = Engine(fi, layout, writer)
    engine.prefill_step({0: 14, 1: 31})
    live = []
    for step in range(12):
        if step == 2:
            engine.prefill_step({2: 5})
        if step == 4:
            engine.leave(0)
        if step == 5:
            engine.prefill_step({3: 40, 4: 1})
        if step == 8:
            engine.leave(2)
            engine.leave(3)
        if step == 9:
            engine.prefill_step({5: 16})
        live.append(engine.decode_step())
    assert live == [2, 2, 3, 3, 2, 4, 4, 4, 2, 3, 3, 3]
    # the graph ran one C plan throughout, re-planned 12 times
    assert engine.decode._plan.handle == engine.captured_plan
