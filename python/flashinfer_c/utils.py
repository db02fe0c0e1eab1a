"""FlashInfer's enums, the parsing of the string options that name them, and
the few helpers of flashinfer.utils engines import."""

import sys
from enum import Enum

import numpy as np

from . import _structs as S


class PosEncodingMode(Enum):
    NONE = 0
    ROPE_LLAMA = 1
    ALIBI = 2


class MaskMode(Enum):
    NON_CAUSAL = 0
    CAUSAL = 1
    CUSTOM = 2
    MULTIITEMSCORING = 3


class TensorLayout(Enum):
    NHD = 0
    HND = 1


_POS_CODES = {
    PosEncodingMode.NONE: S.POS_NONE,
    PosEncodingMode.ROPE_LLAMA: S.POS_ROPE_LLAMA,
    PosEncodingMode.ALIBI: S.POS_ALIBI,
}


def _member(enum, value, what):
    if isinstance(value, enum):
        return value
    try:
        return enum[value]
    except (KeyError, TypeError):
        names = "/".join(m.name for m in enum)
        raise ValueError(f"{what}={value!r}: expected one of {names}") from None


def pos_encoding_code(mode):
    """fi_pos_encoding for a pos_encoding_mode string ("NONE", "ROPE_LLAMA", "ALIBI")."""
    return _POS_CODES[_member(PosEncodingMode, mode, "pos_encoding_mode")]


def kv_layout_code(layout):
    """fi_kv_layout for a kv_layout string ("NHD" or "HND")."""
    member = _member(TensorLayout, layout, "kv_layout")
    return S.KV_LAYOUT_NHD if member is TensorLayout.NHD else S.KV_LAYOUT_HND


def kv_layout_name(layout):
    return _member(TensorLayout, layout, "kv_layout").name


_range_bufs = {}


def _get_range_buf(seq_len, device):
    """[0, 1, ..., seq_len - 1] as int32 on `device` ("cpu" gives a torch CPU
    tensor when torch is imported, else a numpy array), cached per
    (length, device) as FlashInfer caches it: treat it as read-only."""
    key = (int(seq_len), str(device))
    buf = _range_bufs.get(key)
    if buf is None:
        torch = sys.modules.get("torch")
        if torch is not None:
            buf = torch.arange(int(seq_len), dtype=torch.int32, device=device)
        elif str(device) != "cpu":
            raise ValueError(f"_get_range_buf: device {device!r} needs torch")
        else:
            buf = np.arange(int(seq_len), dtype=np.int32)
            buf.flags.writeable = False
        _range_bufs[key] = buf
    return buf


class FP4Tensor:
    """FlashInfer's container for an NVFP4 tensor (data, block scales, where the
    scales start, the unpacked shape). flashinfer_c has no FP4 kernels (an FP4
    output or KV cache is refused where it would be used); the container itself
    is only data, so an engine can build one."""

    def __init__(self, data, scale, scale_start_index=0, original_shape=None):
        self.data = data
        self.scale = scale
        self.scale_start_index = scale_start_index
        self.original_shape = original_shape
