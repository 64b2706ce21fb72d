"""vLLM's `embed_dtype` and `endianness`: the bytes of each value of a base64 row, or of vLLM's raw `bytes` answer,
as vLLM's tensor2binary writes them (the float32 row cast by torch to the dtype, then its bytes in the order asked):
float32, float16 by numpy, bfloat16 and fp8 (torch's float8_e4m3fn, saturating at 448, and float8_e5m2) by hand,
since numpy has neither; each rounded to nearest, ties to even, as torch casts."""

from __future__ import annotations

import sys

import numpy as np

from ivy.errors import IvyError, Problem

BFLOAT16 = ("<bf2", ">bf2")  # numpy has no bfloat16: its bytes are made by hand (_bfloat16_bytes)
# numpy has no fp8 either (_fp8_bytes): torch's float8_e4m3fn and float8_e5m2 as (mantissa bits, least normal
# exponent, the code of anything past the largest finite value: e4m3fn saturates at 448 as torch casts, e5m2 is inf)
_FP8 = {"e4m3": (3, -6, 0x7E), "e5m2": (2, -14, 0x7C)}


_ORDER = {"native": "<" if sys.byteorder == "little" else ">", "little": "<", "big": ">"}
_DTYPES = {(dtype, order): mark + code for dtype, code in (("float32", "f4"), ("float16", "f2"), ("bfloat16", "bf2"),
                                                            ("fp8_e4m3", "e4m3"), ("fp8_e5m2", "e5m2"))
           for order, mark in _ORDER.items()}  # one byte a value: fp8's order changes nothing


def wire_dtype(fmt: str, embed_dtype: str | None, endianness: str | None, *, sent: bool = True) -> str:
    """A request's values for base64 and bytes (omitted fields are vLLM's defaults): a numpy dtype string, one of
    BFLOAT16, or an order mark and a key of _FP8. embed_dtype is theirs only: with base64_int8 or base64_binary
    sent as encoding_format, whose bytes the format sets, another than float32 is a 422 naming it; with float
    (vLLM's default, where vLLM ignores it), or a model's own default format (`sent` false: pplx-embed's
    base64_int8), it is ignored."""
    if sent and embed_dtype not in (None, "float32") and fmt in ("base64_int8", "base64_binary"):
        raise IvyError(Problem.INVALID_PARAMETER, f"embed_dtype applies to encoding_format base64 and bytes only; "
                       f"{fmt} has its own bytes (send float32 or omit it)", param="embed_dtype")
    return _DTYPES[embed_dtype or "float32", endianness or "native"]


def _bfloat16_bytes(row: np.ndarray, dtype: str) -> bytes:
    """float32 -> bfloat16 as torch's `.to(torch.bfloat16)` casts it (vLLM's embed_dtype): round to nearest, ties
    to even; the upper 16 bits of the rounded float32 (NaN and the infinities stay so)."""
    bits = np.ascontiguousarray(row, dtype=np.float32).view(np.uint32)
    rounded = ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)
    return rounded.astype(dtype[0] + "u2", copy=False).tobytes()


def _fp8_bytes(row: np.ndarray, kind: str) -> bytes:
    """float32 -> fp8 (`kind` of _FP8) as torch's `.to(torch.float8_e4m3fn / float8_e5m2)` casts it: round to
    nearest, ties to even, subnormals kept, past the largest finite value _FP8's code; the sign bit on top. A
    value's code is its exponent's steps above the least, then its rounded mantissa, so a carry out of the
    mantissa is the next exponent's first code and the codes grow with the magnitude (14 µs a 1024-wide row on
    this VM, against bfloat16's 6.6)."""
    mantissa, least, above = _FP8[kind]
    x = np.asarray(row, dtype=np.float32)
    a = np.abs(x)
    finite = np.isfinite(a).all()
    if not finite:  # as torch casts them: NaN 0x7F, an infinity what is past the largest finite value
        nan, a = np.isnan(a), np.where(np.isfinite(a), a, 0)
    exponent = np.frexp(np.maximum(a, np.float32(2.0 ** least)))[1] - 1  # the subnormals' is the least
    units = np.rint(np.ldexp(a, mantissa - exponent)).astype(np.int32)  # exact scaling, then ties to even
    code = np.minimum(((exponent - least) << mantissa) + units, above)
    if not finite:
        code[np.isinf(x)] = above
        code[nan] = 0x7F
    return (code | (np.signbit(x) << 7)).astype(np.uint8).tobytes()


def value_bytes(rows: np.ndarray, dtype: str) -> bytes:
    """The bytes of `rows` (one row, or a matrix: its rows back to back) as `dtype` (wire_dtype's)."""
    if dtype in BFLOAT16:
        return _bfloat16_bytes(rows, dtype)
    if dtype[1:] in _FP8:
        return _fp8_bytes(rows, dtype[1:])
    if dtype[1:] == "f2":
        with np.errstate(over="ignore"):  # |x| over 65504 is inf in float16, as torch casts it
            return np.ascontiguousarray(rows, dtype=dtype).tobytes()
    return np.ascontiguousarray(rows, dtype=dtype).tobytes()  # float32, base64's default: no errstate a row

