"""Reader for the IDX format used by MNIST and Fashion-MNIST (plain or gzip)."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from datasets.base import DataError, one_line

_DTYPES: dict[int, type[np.generic] | str] = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file; checks the magic number and the declared sizes (:class:`DataError` naming the file)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            data = fh.read()
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{path}: not a readable IDX file ({one_line(exc)})") from exc
    if len(data) < 4:
        raise DataError(f"{path}: too short to be an IDX file ({len(data)} bytes)")
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code not in _DTYPES:
        raise DataError(f"{path}: not an IDX file (bad magic {data[:4].hex()})")
    header_end = 4 + 4 * ndim
    if len(data) < header_end:
        raise DataError(f"{path}: truncated IDX header ({len(data)} bytes, expected at least {header_end})")
    shape = struct.unpack(f">{ndim}I", data[4:header_end])
    dtype = np.dtype(_DTYPES[dtype_code])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(data) - header_end != expected:
        raise DataError(f"{path}: header says {expected} payload bytes, file has {len(data) - header_end}")
    return np.frombuffer(data, dtype=dtype, offset=header_end).reshape(shape).astype(dtype.newbyteorder("="))


def find_idx(directory: Path, stem: str) -> Path | None:
    """Find ``stem`` or ``stem.gz`` in ``directory`` or its torchvision-style ``raw/`` subfolder."""
    for sub in (directory, directory / "raw", directory / "MNIST" / "raw", directory / "FashionMNIST" / "raw"):
        for name in (stem, stem + ".gz"):
            p = sub / name
            if p.is_file():
                return p
    return None


def load_idx_pair(directory: Path, prefix: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Load ``{prefix}-images-idx3-ubyte`` and ``{prefix}-labels-idx1-ubyte``; None if absent."""
    xi = find_idx(directory, f"{prefix}-images-idx3-ubyte")
    yi = find_idx(directory, f"{prefix}-labels-idx1-ubyte")
    if xi is None or yi is None:
        return None
    x, y = read_idx(xi), read_idx(yi).astype(np.int64)
    if len(x) != len(y):
        raise DataError(f"{directory}: {len(x)} images but {len(y)} labels for '{prefix}'")
    return x, y
