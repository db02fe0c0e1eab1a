"""FlashInfer's enums, and the parsing of the string options that name them."""

from enum import Enum

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
