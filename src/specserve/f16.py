"""A GGUF model written again with every tensor dequantized to F16 (1-D tensors F32).

The packaged reference target is built this way from its Q4_K_M wheel parts (models.pull): on a
CPU an F16 target makes the draft model cost about a quarter of a target pass, the regime of a
large target and a small draft on a GPU.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, LlamaFileType
from gguf.quants import dequantize
from tqdm import tqdm

from .gguf_meta import read_header


def convert_to_f16(src: str | os.PathLike, dst: str | os.PathLike, description: str,
                   progress: bool = False) -> Path:
    """Write ``dst``: ``src``'s metadata and tensors, dequantized, as F16 (1-D tensors F32).

    All KV pairs are copied except ``general.file_type`` (set to MOSTLY_F16) and
    ``general.description`` (set to ``description``). Tensors are converted and written
    one at a time, so memory holds one tensor's float32 copy (the largest, a 151936 x
    1536 embedding, is 0.9 GB), never the whole model. Written atomically.
    """
    src, dst = Path(src), Path(dst)
    hdr = read_header(src, full_arrays=True)  # typed values, so they can be re-written as-is
    tmp = dst.with_name(f"{dst.name}.partial-{os.getpid()}")
    w = GGUFWriter(tmp, str(hdr.metadata.get("general.architecture", "llama")))
    if hdr.alignment != 32:
        w.add_custom_alignment(hdr.alignment)
    meta = dict(hdr.metadata)
    meta["general.file_type"] = int(LlamaFileType.MOSTLY_F16)
    meta["general.description"] = description
    types = {**hdr.types, "general.file_type": ("uint32", None), "general.description": ("string", None)}
    for key, val in meta.items():
        if key in ("general.architecture", "general.alignment") or val == []:
            continue  # written by the writer itself / GGUFWriter cannot write empty arrays
        vt, sub = types[key]
        w.add_key_value(key, val, GGUFValueType[vt.upper()], GGUFValueType[sub.upper()] if sub else None)

    def out_dtype(t):
        return np.dtype(np.float16 if len(t.shape) >= 2 else np.float32)

    for t in hdr.tensors:
        w.add_tensor_info(t.name, tuple(reversed(t.shape)), out_dtype(t), t.n_elements * out_dtype(t).itemsize)
    total = sum(t.n_elements * out_dtype(t).itemsize for t in hdr.tensors)
    raw = np.memmap(src, dtype=np.uint8, mode="r")
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        with tqdm(total=total, unit="B", unit_scale=True, desc=f"F16 {dst.name}", file=sys.stderr,
                  disable=not progress, leave=False) as bar:
            for t in hdr.tensors:
                rows = t.n_elements // t.shape[0]
                data = raw[t.offset:t.offset + t.n_bytes].reshape(rows, t.n_bytes // rows)
                vals = dequantize(data, GGMLQuantizationType[t.ggml_type]).reshape(tuple(reversed(t.shape)))
                w.write_tensor_data(vals.astype(out_dtype(t), copy=False))
                bar.update(t.n_elements * out_dtype(t).itemsize)
                del vals
        w.close()
        os.replace(tmp, dst)
    finally:
        w.close()
        del raw
        tmp.unlink(missing_ok=True)
    return dst
