"""fp64 references, written plainly: one request at a time, one head at a time.

Semantics (docs/ARCHITECTURE.md, FlashInfer's): GQA head h reads KV head
h // (H_qo / H_kv); the causal mask is aligned bottom-right; the sliding
window keeps keys j >= kv_len - qo_len + i - window_left; soft-cap is
c * tanh(s * sm_scale / c); ALiBi adds slope_h * (j - (kv_len - qo_len + i));
LSE is base 2; a row that sees no key has output 0 and LSE -inf.
"""

import math

import torch


def alibi_slopes(num_heads):
    """FlashInfer's ALiBi slopes (geometric, for any number of heads)."""
    n = 2 ** math.floor(math.log2(num_heads))
    slopes = [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]
    slopes += [2.0 ** (-4.0 * (2 * h + 1) / n) for h in range(num_heads - n)]
    return torch.tensor(slopes, dtype=torch.float64)


def rope_frequencies(rotary_dim, rope_scale, rope_theta, llama31=None):
    i = torch.arange(rotary_dim // 2, dtype=torch.float64)
    freq = rope_theta ** (-2.0 * i / rotary_dim)
    if llama31 is None:
        return freq / rope_scale
    low, high, old_context_len = llama31
    smooth = ((old_context_len * freq / (2 * math.pi)) - low) / (high - low)
    smooth = smooth.clamp(0.0, 1.0)
    return (1 - smooth) * freq / rope_scale + smooth * freq


def rope(
    x, positions, rotary_dim=None, interleave=False, rope_scale=1.0, rope_theta=1e4, llama31=None
):
    """RoPE of x [n, H, D] at positions [n]: pairs (i, i + d/2), or (2i, 2i + 1) interleaved."""
    x = x.double().clone()
    d = rotary_dim or x.shape[-1]
    freq = rope_frequencies(d, rope_scale, rope_theta, llama31)
    angle = positions.double()[:, None] * freq[None, :]  # [n, d/2]
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]
    if interleave:
        a, b = x[..., 0:d:2].clone(), x[..., 1:d:2].clone()
        x[..., 0:d:2] = a * cos - b * sin
        x[..., 1:d:2] = b * cos + a * sin
    else:
        a, b = x[..., : d // 2].clone(), x[..., d // 2 : d].clone()
        x[..., : d // 2] = a * cos - b * sin
        x[..., d // 2 : d] = b * cos + a * sin
    return x


def attention(
    q,
    k,
    v,
    causal=False,
    window_left=-1,
    logits_soft_cap=0.0,
    sm_scale=None,
    mask=None,
    alibi=False,
    rope_llama=None,
):
    """One request. q [qo_len, H_qo, D]; k [kv_len, H_kv, D]; v [kv_len, H_kv, D_v] (NHD).

    mask: bool [qo_len, kv_len] (True = visible). rope_llama: (rope_scale,
    rope_theta) to rotate q and k at their positions first.
    Returns (out [qo_len, H_qo, D_v], lse [qo_len, H_qo]) in float64.
    """
    q, k, v = q.double(), k.double(), v.double()
    qo_len, num_qo_heads, head_dim = q.shape
    kv_len, num_kv_heads, _ = k.shape
    group = num_qo_heads // num_kv_heads
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    if rope_llama is not None:
        scale, theta = rope_llama
        q = rope(q, torch.arange(qo_len) + kv_len - qo_len, rope_scale=scale, rope_theta=theta)
        k = rope(k, torch.arange(kv_len), rope_scale=scale, rope_theta=theta)
    out = torch.zeros(qo_len, num_qo_heads, v.shape[-1], dtype=torch.float64)
    lse = torch.full((qo_len, num_qo_heads), -math.inf, dtype=torch.float64)
    slopes = alibi_slopes(num_qo_heads)
    i = torch.arange(qo_len)[:, None]
    j = torch.arange(kv_len)[None, :]
    diagonal = kv_len - qo_len + i  # the key aligned with query i
    visible = torch.ones(qo_len, kv_len, dtype=torch.bool)
    if causal:
        visible &= j <= diagonal
    if window_left >= 0:
        visible &= j >= diagonal - window_left
    if mask is not None:
        visible &= mask.bool()
    for h in range(num_qo_heads):
        kh = h // group
        s = (q[:, h, :] @ k[:, kh, :].T) * sm_scale
        if logits_soft_cap > 0:
            s = logits_soft_cap * torch.tanh(s / logits_soft_cap)
        if alibi:
            s = s + slopes[h] * (j - diagonal).double()
        s = s.masked_fill(~visible, -math.inf)
        for r in range(qo_len):
            if not visible[r].any():
                continue
            p = torch.softmax(s[r], dim=0)
            out[r, h] = p @ v[:, kh, :]
            lse[r, h] = torch.logsumexp(s[r], dim=0) / math.log(2)
    return out, lse


def merge(v_a, s_a, v_b, s_b):
    """Merge of two states (o, lse base 2), in fp64."""
    v_a, s_a, v_b, s_b = v_a.double(), s_a.double(), v_b.double(), s_b.double()
    m = torch.maximum(s_a, s_b)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w_a, w_b = torch.exp2(s_a - m), torch.exp2(s_b - m)
    total = w_a + w_b
    v = (w_a[..., None] * v_a + w_b[..., None] * v_b) / total.clamp_min(1e-300)[..., None]
    v = torch.where(total[..., None] > 0, v, torch.zeros_like(v))
    return v, m + torch.log2(total)
