"""Torch glue: state dict <-> ArrayRecord, device choice.

The arrays travel in Flower's own format (``Array`` with stype ``numpy.ndarray``: the bytes of
``np.save``), so any SuperNode or ServerApp reads them with ``Array.numpy()``. What we avoid is
Flower's extra copies on the way: ``Array(ndarray)`` writes through a ``BytesIO`` and copies it out,
``Array.numpy()`` reads through one and copies again. Here each direction copies the data once
(the same bytes and the same chain result: tests/strategies/test_transport_records.py).
"""

from __future__ import annotations

import io
from collections import OrderedDict

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

_NUMPY_STYPE = "numpy.ndarray"  # flwr.app's SType.NUMPY


def pick_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cpu'/'cuda'/'cuda:1' taken as given."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but CUDA is not available here; use 'auto' or 'cpu'")
    return torch.device(name)


def ndarray_to_array(a: np.ndarray) -> Array:
    """``Array(a)``: a .npy v1.0 header and the data in C order, as ``np.save`` writes them, copied once."""
    a = np.asarray(a, order="C")  # keeps 0-d arrays 0-d (num_batches_tracked), unlike ascontiguousarray
    if a.dtype.hasobject:
        raise ValueError(f"object arrays cannot travel in an ArrayRecord, got dtype {a.dtype}")
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(a))
    return Array(dtype=str(a.dtype), shape=tuple(int(s) for s in a.shape), stype=_NUMPY_STYPE,
                 data=b"".join((header.getvalue(), a)))  # type: ignore[arg-type]  # join reads the array's buffer (the one copy); numpy's stubs do not declare ndarray a Buffer


def array_to_ndarray(arr: Array) -> np.ndarray:
    """A writable ndarray with a copy of ``arr``'s data: ``Array.numpy()``, copied once instead of twice."""
    if arr.stype != _NUMPY_STYPE:
        return arr.numpy()  # Flower raises the informative error for other serializations
    head = io.BytesIO(arr.data)  # shares the bytes (no copy)
    if np.lib.format.read_magic(head) != (1, 0):
        return arr.numpy()  # np.save writes 2.0/3.0 headers only for huge or non-ASCII descriptions
    shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(head)
    flat = np.frombuffer(arr.data, dtype=dtype, count=int(np.prod(shape, dtype=np.int64)), offset=head.tell())
    return flat.reshape(shape, order="F" if fortran_order else "C").copy(order="K")


def state_to_record(model: torch.nn.Module) -> ArrayRecord:
    """Model parameters and buffers as an ArrayRecord (numpy, CPU)."""
    return ArrayRecord(OrderedDict((k, ndarray_to_array(v.detach().cpu().numpy()))
                                   for k, v in model.state_dict().items()))


def record_to_state(record: ArrayRecord) -> OrderedDict[str, torch.Tensor]:
    """ArrayRecord -> state dict of CPU tensors (each owns its memory: safe to modify)."""
    return OrderedDict((k, torch.from_numpy(array_to_ndarray(v))) for k, v in record.items())


def save_state_dict(state: torch.nn.Module | dict, path) -> None:
    """A model's (or a state dict's) CPU tensors written atomically with ``torch.save``: a crash
    mid-write never leaves a truncated file that a later attack run would load."""
    from flower_apps.common.results import atomic_write_bytes

    sd = state.state_dict() if isinstance(state, torch.nn.Module) else state
    buf = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in sd.items()}, buf)
    atomic_write_bytes(path, buf.getvalue())
