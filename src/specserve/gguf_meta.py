"""Fast GGUF header reader: key/value metadata and tensor infos, never tensor data.

``gguf.GGUFReader`` builds numpy objects for every string of every array, which
takes seconds for a 262k-token vocabulary.  This module parses the GGUF v2/v3
header directly with ``struct`` over an ``mmap`` and only materialises what is
asked for:

* scalars and strings are returned as Python values;
* arrays with fewer than ``max_array_items`` items are returned as lists;
* larger arrays are returned as :class:`ArraySummary` (element type, length,
  sha256 of the raw element bytes) unless their key is named in
  ``full_arrays``.

Layout: magic ``GGUF``, u32 version, u64 n_tensors, u64 n_kv, then n_kv of
(string key, u32 type, value), then n_tensors of (string name, u32 n_dims,
u64 dims[n_dims], u32 ggml_type, u64 offset); tensor data starts at the next
multiple of ``general.alignment`` (default 32).  Strings are u64 length + bytes.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import os
import struct
from dataclasses import asdict, dataclass
from typing import Any, Collection, NamedTuple

__all__ = ["ArraySummary", "GGUFError", "GGUFHeader", "ModelSummary", "TensorInfo",
           "VALUE_TYPE_NAMES", "read_header", "read_metadata", "summary", "tensor_infos"]

#: GGUF metadata value type ids -> names (index = type id).
VALUE_TYPE_NAMES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                    "bool", "string", "array", "uint64", "int64", "float64")
_STRING, _ARRAY = 8, 9
_SCALAR_FMT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?",
               10: "Q", 11: "q", 12: "d"}
_DEFAULT_ALIGNMENT = 32


class GGUFError(ValueError):
    """The file is not a readable GGUF file (bad magic, unsupported version, truncated)."""


class ArraySummary(NamedTuple):
    """Stand-in for a large metadata array: element type name, item count and
    sha256 hex digest of the raw element bytes (everything after the count)."""

    type: str
    length: int
    sha256: str


class TensorInfo(NamedTuple):
    """One tensor's header entry.  ``shape`` is in GGUF/ggml order (ne0 first,
    i.e. the fastest-varying dimension first, the reverse of numpy order);
    ``offset`` is absolute in the file."""

    name: str
    shape: tuple[int, ...]
    ggml_type: str
    n_elements: int
    n_bytes: int
    offset: int


@dataclass(frozen=True)
class GGUFHeader:
    """Everything in a GGUF header.  ``types`` maps key -> (type name, element
    type name or None) so values can be re-written faithfully."""

    version: int
    metadata: dict[str, Any]
    types: dict[str, tuple[str, str | None]]
    tensors: list[TensorInfo]
    alignment: int
    data_offset: int
    file_size: int


class _Parser:
    """Cursor over the mapped header; all reads advance ``pos``."""

    def __init__(self, buf: mmap.mmap, endian: str):
        self.buf, self.pos, self.e = buf, 0, endian
        self._u64 = struct.Struct(endian + "Q").unpack_from
        self._u32 = struct.Struct(endian + "I").unpack_from

    def u32(self) -> int:
        (v,) = self._u32(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self) -> int:
        (v,) = self._u64(self.buf, self.pos)
        self.pos += 8
        return v

    def string(self) -> str:
        n = self.u64()
        end = self.pos + n
        if end > len(self.buf):
            raise GGUFError(f"string of {n} bytes runs past end of file at offset {self.pos}")
        s = self.buf[self.pos:end].decode("utf-8", errors="replace")
        self.pos = end
        return s

    def value(self, vtype: int, full: bool, max_items: int) -> tuple[Any, str | None]:
        """Read one value of type ``vtype``; returns (value, element type name)."""
        if vtype == _STRING:
            return self.string(), None
        if vtype == _ARRAY:
            etype, count = self.u32(), self.u64()
            ename = _type_name(etype)
            if full or count < max_items:
                return self.array(etype, count), ename
            start = self.pos
            self.skip_array(etype, count)
            digest = hashlib.sha256(self.buf[start:self.pos]).hexdigest()
            return ArraySummary(ename, count, digest), ename
        fmt = _SCALAR_FMT.get(vtype)
        if fmt is None:
            raise GGUFError(f"unknown GGUF value type {vtype} at offset {self.pos - 4}")
        (v,) = struct.unpack_from(self.e + fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v, None

    def array(self, etype: int, count: int) -> list:
        if etype in _SCALAR_FMT:
            fmt = self.e + str(count) + _SCALAR_FMT[etype]
            out = list(struct.unpack_from(fmt, self.buf, self.pos))
            self.pos += struct.calcsize(fmt)
            return out
        if etype == _STRING:
            buf, pos, u64, out = self.buf, self.pos, self._u64, []
            append = out.append
            for _ in range(count):
                (n,) = u64(buf, pos)
                pos += 8
                append(buf[pos:pos + n].decode("utf-8", errors="replace"))
                pos += n
            self.pos = pos
            return out
        if etype == _ARRAY:
            return [self.value(_ARRAY, True, 0)[0] for _ in range(count)]
        raise GGUFError(f"unknown GGUF array element type {etype}")

    def skip_array(self, etype: int, count: int) -> None:
        if etype in _SCALAR_FMT:
            self.pos += count * struct.calcsize(_SCALAR_FMT[etype])
        elif etype == _STRING:
            buf, pos, u64 = self.buf, self.pos, self._u64
            for _ in range(count):
                pos += 8 + u64(buf, pos)[0]
            self.pos = pos
        elif etype == _ARRAY:
            for _ in range(count):
                self.skip_array(self.u32(), self.u64())
        else:
            raise GGUFError(f"unknown GGUF array element type {etype}")
        if self.pos > len(self.buf):
            raise GGUFError("array runs past end of file")


def _type_name(vtype: int) -> str:
    if not 0 <= vtype < len(VALUE_TYPE_NAMES):
        raise GGUFError(f"unknown GGUF value type {vtype}")
    return VALUE_TYPE_NAMES[vtype]


def _tensor_nbytes(ggml_type: int, shape: tuple[int, ...]) -> tuple[str, int, int]:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    n = math.prod(shape)
    try:
        qtype = GGMLQuantizationType(ggml_type)
        block, size = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        return f"UNKNOWN_{ggml_type}", n, -1
    return qtype.name, n, n // block * size


def read_header(path: str | os.PathLike, full_arrays: Collection[str] | bool = (),
                max_array_items: int = 4096) -> GGUFHeader:
    """Parse the whole GGUF header of ``path`` (metadata + tensor infos).

    ``full_arrays`` is a collection of keys whose arrays are always returned in
    full, or ``True`` for all arrays.  Other arrays with ``>= max_array_items``
    items become :class:`ArraySummary`.
    """
    path = os.fspath(path)
    if isinstance(full_arrays, str):
        full_arrays = (full_arrays,)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            raise GGUFError(f"{path}: too small to be a GGUF file ({size} bytes)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if buf[:4] != b"GGUF":
                raise GGUFError(f"{path}: not a GGUF file (magic {bytes(buf[:4])!r})")
            (version,) = struct.unpack_from("<I", buf, 4)
            endian = "<"
            if version & 0xFFFF == 0:  # written big-endian
                endian, version = ">", struct.unpack_from(">I", buf, 4)[0]
            if version not in (2, 3):
                raise GGUFError(f"{path}: unsupported GGUF version {version} (need 2 or 3)")
            p = _Parser(buf, endian)
            p.pos = 8
            try:
                n_tensors, n_kv = p.u64(), p.u64()
                meta: dict[str, Any] = {}
                types: dict[str, tuple[str, str | None]] = {}
                for _ in range(n_kv):
                    key = p.string()
                    vtype = p.u32()
                    full = full_arrays is True or (full_arrays is not False and key in full_arrays)
                    meta[key], sub = p.value(vtype, full, max_array_items)
                    types[key] = (_type_name(vtype), sub)
                alignment = int(meta.get("general.alignment", _DEFAULT_ALIGNMENT)) or _DEFAULT_ALIGNMENT
                raw = []
                for _ in range(n_tensors):
                    name = p.string()
                    n_dims = p.u32()
                    shape = tuple(p.u64() for _ in range(n_dims))
                    raw.append((name, shape, p.u32(), p.u64()))
            except struct.error as exc:
                raise GGUFError(f"{path}: truncated or corrupt GGUF header ({exc})") from None
            data_offset = -(-p.pos // alignment) * alignment
    tensors = [TensorInfo(name, shape, *_tensor_nbytes(gtype, shape), data_offset + off)
               for name, shape, gtype, off in raw]
    return GGUFHeader(version, meta, types, tensors, alignment, data_offset, size)


def read_metadata(path: str | os.PathLike, full_arrays: Collection[str] | bool = (),
                  max_array_items: int = 4096) -> dict[str, Any]:
    """Return the key/value metadata of a GGUF file as ``{key: value}``.

    Example: ``read_metadata(p, full_arrays=("tokenizer.ggml.tokens",))``.
    Invalid UTF-8 in strings is replaced with U+FFFD.
    """
    return read_header(path, full_arrays, max_array_items).metadata


def tensor_infos(path: str | os.PathLike) -> list[TensorInfo]:
    """Name, GGUF-order shape, ggml type name, element count, byte size and
    absolute data offset of every tensor in the file."""
    return read_header(path).tensors


@dataclass(frozen=True)
class ModelSummary:
    """Architecture facts needed for memory estimates and model pairing."""

    architecture: str
    name: str | None
    n_layer: int | None
    n_embd: int | None
    n_head: int | None
    n_head_kv: int | None
    head_dim_k: int | None
    head_dim_v: int | None
    context_length: int | None
    vocab_size: int | None
    file_type: int | None
    n_params: int
    tensor_bytes: int
    file_size: int

    @property
    def kv_bytes_per_token(self) -> int | None:
        """KV-cache bytes per token at F16 (all layers, K and V), if known."""
        if None in (self.n_layer, self.n_head_kv, self.head_dim_k, self.head_dim_v):
            return None
        return 2 * self.n_layer * self.n_head_kv * (self.head_dim_k + self.head_dim_v)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "kv_bytes_per_token": self.kv_bytes_per_token}


def _int_or_max(v: Any) -> int | None:
    """Per-layer arrays (some archs) collapse to their maximum."""
    if isinstance(v, list):
        return max(v) if v else None
    return None if v is None else int(v)


def summary(path: str | os.PathLike) -> ModelSummary:
    """Architecture, sizes and dimensions of the model in a GGUF file."""
    h = read_header(path)
    m = h.metadata
    arch = str(m.get("general.architecture", "unknown"))
    g = lambda k: _int_or_max(m.get(f"{arch}.{k}"))  # noqa: E731
    n_embd, n_head = g("embedding_length"), g("attention.head_count")
    dflt = n_embd // n_head if n_embd and n_head else None
    n_head_kv = g("attention.head_count_kv") or n_head
    tokens = m.get("tokenizer.ggml.tokens")
    vocab = len(tokens) if isinstance(tokens, list) else getattr(tokens, "length", None)
    if vocab is None:
        vocab = g("vocab_size")
    ft = m.get("general.file_type")
    return ModelSummary(
        architecture=arch, name=m.get("general.name"), n_layer=g("block_count"),
        n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
        head_dim_k=g("attention.key_length") or dflt, head_dim_v=g("attention.value_length") or dflt,
        context_length=g("context_length"), vocab_size=vocab,
        file_type=int(ft) if ft is not None else None,
        n_params=sum(t.n_elements for t in h.tensors),
        tensor_bytes=sum(max(t.n_bytes, 0) for t in h.tensors), file_size=h.file_size)
