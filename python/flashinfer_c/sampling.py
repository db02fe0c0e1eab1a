"""Sampling as FlashInfer's flashinfer.sampling has it: softmax with a
temperature, draws from probabilities or logits with top-k / top-p / min-p
filters, the filters themselves (renormalised probabilities, masked
logits), and chain speculative sampling. Same names, arguments and
defaults; numpy arrays and torch CPU tensors, run by the C library.

Filters keep every value tied with the boundary one (docs/SEMANTICS.md,
"Sampling"). Draws are exact (an inverse CDF over the filtered
distribution) and reproducible: a call's draws depend on its (seed, offset)
alone, never on threads or SIMD level. Without seed and offset they are
drawn from `generator` (a torch.Generator or numpy Generator), else from
torch's default generator (torch inputs) or numpy's global one, so
torch.manual_seed(...) / np.random.seed(...) reproduce a run; they are not
FlashInfer's curand draws. A seed or offset tensor must hold one value.
`deterministic` and `is_deterministic` are accepted: every call is.
"""

from ._arrays import is_torch
from . import _serving as C


def softmax(logits, temperature=None, enable_pdl=None):
    """softmax(logits / temperature) per row; float32 [batch, vocab]."""
    device = C.device_checked(logits, [("temperature", temperature if is_torch(temperature) else None)])
    arr, val = C.param(1.0 if temperature is None else temperature, "f32", logits)
    probs = C.new_out(logits, logits.shape, "float32")
    v = C.Views()
    C.call("fi_softmax", device, v(logits, "logits"), v(arr, "temperature"), val, v(probs, "probs"))
    return probs


def _sample(name, input, indices, params, generator, seed, offset, return_valid, check_nan,
            what):
    if check_nan:
        C.check_no_nan(input, what)
    device = C.device_checked(input, [("indices", indices)])
    idx = C.as_int32(indices) if indices is not None else None
    batch = idx.shape[0] if idx is not None else input.shape[0]
    s, o = C.seed_offset(seed, offset, generator, input)
    samples = C.new_out(input, (batch,), "int32")
    valid = C.new_out(input, (batch,), "bool") if return_valid else None
    v = C.Views()
    args = [v(input, what), v(idx, "indices")]
    for kind, value, pname in params:
        if kind == "order":
            args.append(value)
            continue
        arr, val = C.param(value, kind, input)
        args += [v(arr, pname), val]
    C.call(name, device, *args, s, o, v(samples, "samples"), v(valid, "valid"))
    if indices is not None and C.dtype_of(indices) == "int64":
        samples = samples.long() if is_torch(samples) else samples.astype("int64")
    return (samples, valid) if return_valid else samples


def sampling_from_probs(probs, indices=None, deterministic=True, generator=None,
                        check_nan=False, seed=None, offset=None, return_valid=False):
    """Draw a token per row of probs [batch, vocab] (in proportion: they need
    not sum to 1); with indices [n], output i draws from probs[indices[i]]."""
    return _sample("fi_sampling_from_probs", probs, indices, [], generator, seed, offset,
                   return_valid, check_nan, "probs")


def sampling_from_logits(logits, indices=None, deterministic=True, generator=None,
                         check_nan=False, seed=None, offset=None):
    """Draw a token per row from softmax(logits)."""
    return _sample("fi_sampling_from_logits", logits, indices, [], generator, seed, offset,
                   False, check_nan, "logits")


def top_p_sampling_from_probs(probs, top_p, indices=None, deterministic=True, generator=None,
                              check_nan=False, seed=None, offset=None, return_valid=False):
    return _sample("fi_top_p_sampling_from_probs", probs, indices, [("f32", top_p, "top_p")],
                   generator, seed, offset, return_valid, check_nan, "probs")


def top_k_sampling_from_probs(probs, top_k, indices=None, deterministic=True, generator=None,
                              check_nan=False, seed=None, offset=None, return_valid=False):
    return _sample("fi_top_k_sampling_from_probs", probs, indices, [("i32", top_k, "top_k")],
                   generator, seed, offset, return_valid, check_nan, "probs")


def min_p_sampling_from_probs(probs, min_p, indices=None, deterministic=True, generator=None,
                              check_nan=False, seed=None, offset=None, return_valid=False):
    return _sample("fi_min_p_sampling_from_probs", probs, indices, [("f32", min_p, "min_p")],
                   generator, seed, offset, return_valid, check_nan, "probs")


def _order(filter_apply_order):
    try:
        return C.FILTER_ORDER[filter_apply_order]
    except KeyError:
        raise ValueError(f"Invalid filter_apply_order: {filter_apply_order}") from None


def top_k_top_p_sampling_from_probs(probs, top_k, top_p, indices=None,
                                    filter_apply_order="top_k_first", deterministic=True,
                                    generator=None, check_nan=False, seed=None, offset=None,
                                    return_valid=False):
    params = [("i32", top_k, "top_k"), ("f32", top_p, "top_p"),
              ("order", _order(filter_apply_order), None)]
    return _sample("fi_top_k_top_p_sampling_from_probs", probs, indices, params, generator,
                   seed, offset, return_valid, check_nan, "probs")


def top_k_top_p_sampling_from_logits(logits, top_k, top_p, indices=None,
                                     filter_apply_order="top_k_first", deterministic=True,
                                     generator=None, check_nan=False, seed=None, offset=None):
    params = [("i32", top_k, "top_k"), ("f32", top_p, "top_p"),
              ("order", _order(filter_apply_order), None)]
    return _sample("fi_top_k_top_p_sampling_from_logits", logits, indices, params, generator,
                   seed, offset, False, check_nan, "logits")


def _filter(name, input, value, kind, pname, out_dtype):
    device = C.device_checked(input, [(pname, value if is_torch(value) else None)])
    arr, val = C.param(value, kind, input)
    out = C.new_out(input, input.shape, out_dtype)
    v = C.Views()
    C.call(name, device, v(input, "input"), v(arr, pname), val, v(out, "out"))
    return out


def top_p_renorm_probs(probs, top_p, is_deterministic=False):
    """Probabilities outside the top-p set zeroed, the rest renormalised."""
    return _filter("fi_top_p_renorm_probs", probs, top_p, "f32", "top_p", None)


def top_k_renorm_probs(probs, top_k, is_deterministic=False):
    """Probabilities outside the top-k (ties kept) zeroed, the rest renormalised."""
    return _filter("fi_top_k_renorm_probs", probs, top_k, "i32", "top_k", None)


def top_k_mask_logits(logits, top_k):
    """Logits outside the top-k (ties kept) set to -inf."""
    return _filter("fi_top_k_mask_logits", logits, top_k, "i32", "top_k", None)


top_p_renorm_prob = top_p_renorm_probs
top_k_renorm_prob = top_k_renorm_probs


def chain_speculative_sampling(draft_probs, draft_token_ids, target_probs,
                               maybe_output_accepted_token_num=None,
                               maybe_output_emitted_draft_token_num=None, deterministic=True,
                               generator=None, seed=None, offset=None):
    """(output_token_ids [b, n+1], accepted [b], emitted [b]); the counters
    given are added to in place, as FlashInfer's."""
    device = C.device_checked(
        draft_probs,
        [("draft_token_ids", draft_token_ids), ("target_probs", target_probs),
         ("maybe_output_accepted_token_num", maybe_output_accepted_token_num),
         ("maybe_output_emitted_draft_token_num", maybe_output_emitted_draft_token_num)],
    )
    b, n = draft_token_ids.shape[0], draft_token_ids.shape[1]
    ids = C.as_int32(draft_token_ids)
    acc = maybe_output_accepted_token_num
    emi = maybe_output_emitted_draft_token_num
    acc = C.new_zeros(draft_probs, (b,), "int32") if acc is None else C.out_checked(acc, "accepted")
    emi = C.new_zeros(draft_probs, (b,), "int32") if emi is None else C.out_checked(emi, "emitted")
    out = C.new_out(draft_probs, (b, n + 1), "int32")
    s, o = C.seed_offset(seed, offset, generator, draft_probs)
    v = C.Views()
    C.call("fi_chain_speculative_sampling", device, v(draft_probs, "draft_probs"),
           v(ids, "draft_token_ids"), v(target_probs, "target_probs"), s, o,
           v(out, "output_token_ids"), v(acc, "output_accepted_token_num"),
           v(emi, "output_emitted_draft_token_num"))
    return out, acc, emi


__all__ = [
    "softmax",
    "sampling_from_probs",
    "sampling_from_logits",
    "top_p_sampling_from_probs",
    "top_k_sampling_from_probs",
    "min_p_sampling_from_probs",
    "top_k_top_p_sampling_from_probs",
    "top_k_top_p_sampling_from_logits",
    "top_p_renorm_probs",
    "top_p_renorm_prob",
    "top_k_renorm_probs",
    "top_k_renorm_prob",
    "top_k_mask_logits",
    "chain_speculative_sampling",
]
