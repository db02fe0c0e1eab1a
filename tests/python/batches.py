"""Random batches: page tables over a shared pool of pages, and the dense
K/V of each request read back from them for the reference."""

import torch


def page_table(kv_lens, page_size, num_pages=None, generator=None):
    """(indptr, indices, last_page_len) int32 for requests of kv_lens tokens,
    with pages drawn at random (shuffled) from a pool of num_pages."""
    counts = [(n + page_size - 1) // page_size for n in kv_lens]
    total = sum(counts)
    num_pages = num_pages or total + 3
    order = torch.randperm(num_pages, generator=generator)[:total]
    indptr = torch.zeros(len(kv_lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(counts, dtype=torch.int32), 0)
    last = torch.tensor(
        [(n - (c - 1) * page_size) if c else 0 for n, c in zip(kv_lens, counts)], dtype=torch.int32
    )
    return indptr, order.int(), last


def indptr_of(lengths):
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0)
    return out


def gather(cache, indptr, indices, last, page_size, i, layout="NHD"):
    """Request i's K or V [kv_len, H, D] (NHD) from a paged cache [pages, ...]."""
    pages = indices[indptr[i] : indptr[i + 1]].long()
    if len(pages) == 0:
        shape = cache.shape
        heads = shape[2] if layout == "NHD" else shape[1]
        return cache.new_zeros(0, heads, shape[-1])
    rows = cache[pages]
    if layout == "HND":
        rows = rows.transpose(1, 2)  # [pages, page_size, H, D]
    rows = rows.reshape(-1, rows.shape[-2], rows.shape[-1])
    return rows[: (len(pages) - 1) * page_size + int(last[i])]
