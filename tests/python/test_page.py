"""append_paged_kv_cache, get_batch_indices_positions, get_seq_lens."""

import pytest
import torch

import batches


def test_get_seq_lens(fi, backend):
    indptr = torch.tensor([0, 3, 3, 4], dtype=torch.int32)
    last = torch.tensor([2, 0, 16], dtype=torch.int32)
    got = fi.get_seq_lens(backend(indptr), backend(last), 16)
    assert backend.torch(got).tolist() == [34, 0, 16]


def test_get_batch_indices_positions(fi, backend):
    append_indptr = torch.tensor([0, 1, 3, 6, 10], dtype=torch.int32)
    seq_lens = torch.tensor([5, 5, 5, 5], dtype=torch.int32)
    b, p = fi.get_batch_indices_positions(backend(append_indptr), backend(seq_lens), 10)
    assert backend.torch(b).tolist() == [0, 1, 1, 2, 2, 2, 3, 3, 3, 3]
    assert backend.torch(p).tolist() == [4, 3, 4, 2, 3, 4, 1, 2, 3, 4]
    assert backend.torch(b).dtype == torch.int32
    # preallocated outputs, nnz past the last entry padded with -1 / 0
    bo = backend(torch.empty(12, dtype=torch.int32))
    po = backend(torch.empty(12, dtype=torch.int32))
    b2, p2 = fi.get_batch_indices_positions(
        backend(append_indptr), backend(seq_lens), 12, batch_indices=bo, positions=po
    )
    assert b2 is bo and p2 is po
    assert backend.torch(bo).tolist()[10:] == [-1, -1]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("five_d", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
def test_append_paged_kv_cache(fi, backend, layout, five_d, dtype):
    page_size, h, d = 4, 2, 64
    old_lens, new_lens = [5, 0, 8], [3, 6, 1]
    total = [a + b for a, b in zip(old_lens, new_lens)]
    indptr, indices, last = batches.page_table(total, page_size, num_pages=20)
    shape = (20, 2, page_size, h, d) if layout == "NHD" else (20, 2, h, page_size, d)
    kv = torch.zeros(shape, dtype=dtype)
    append_indptr = batches.indptr_of(new_lens)
    nnz = sum(new_lens)
    k_new = torch.randn(nnz, h, d, dtype=dtype)
    v_new = torch.randn(nnz, h, d, dtype=dtype)
    seq_lens = fi.get_seq_lens(indptr, last, page_size)
    bi, pos = fi.get_batch_indices_positions(append_indptr, seq_lens, nnz)
    # numpy arrays made with .numpy() share kv's memory, so kv shows the writes
    cache = backend(kv) if five_d else (backend(kv)[:, 0], backend(kv)[:, 1])
    fi.append_paged_kv_cache(
        backend(k_new),
        backend(v_new),
        backend(bi),
        backend(pos),
        cache,
        backend(indices),
        backend(indptr),
        backend(last),
        kv_layout=layout,
    )
    got = kv
    for i in range(3):
        k_all = batches.gather(got[:, 0], indptr, indices, last, page_size, i, layout)
        v_all = batches.gather(got[:, 1], indptr, indices, last, page_size, i, layout)
        sl = slice(int(append_indptr[i]), int(append_indptr[i + 1]))
        assert torch.equal(k_all[old_lens[i] :], k_new[sl])
        assert torch.equal(v_all[old_lens[i] :], v_new[sl])


def test_append_converts_int64_indices(fi):
    """FlashInfer converts the index tensors with .int(); so does this."""
    page_size, h, d = 4, 1, 64
    indptr, indices, last = batches.page_table([3], page_size)
    kv = torch.zeros(int(indices.max()) + 1, 2, page_size, h, d)
    k, v = torch.randn(3, h, d), torch.randn(3, h, d)
    fi.append_paged_kv_cache(
        k,
        v,
        torch.zeros(3, dtype=torch.long),
        torch.arange(3),
        kv,
        indices.long(),
        indptr.long(),
        last.long(),
    )
    assert torch.equal(kv[indices[0], 0, :3], k)
