"""FedAdam whose adaptive step applies to parameters only; buffers take the plain weighted mean.

FedAdam's server step (Reddi et al. 2021) is meant for parameters; applied to BatchNorm running
statistics it can drive a running variance negative. Buffers (``buffer_keys``) therefore take the
weighted mean (FedAvg; a buffer identical in every reply keeps its value exactly, strategies.exact_mean)
while parameters take Flower's FedAdam step.

The new global arrays keep the dtypes of the arrays the round sent: Flower's FedAdam forms its step
with a numpy float64 scalar (``eta_norm``), which under numpy 2's promotion rules turns a float32 model
into float64 arrays, doubling every later round's server-to-client bytes while the clients load them
back into float32 anyway. The step is computed as Flower computes it and rounded once to the sent dtype.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import FedAdam

from strategies.exact_mean import exact_weighted_mean


class BufferAveragingFedAdam(FedAdam):
    """Flower's FedAdam on parameters; plain weighted mean on ``buffer_keys`` (e.g. BN running stats)."""

    def __init__(self, *args, buffer_keys: Iterable[str] = (), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.buffer_keys = frozenset(buffer_keys)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        sent = {k: v.dtype for k, v in (self.current_arrays or {}).items()}  # set by configure_train
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None:
            return arrays, metrics
        out = {k: self._as_sent(v, sent.get(k)) for k, v in arrays.items()}
        if self.buffer_keys:
            ok = [m.content for m in replies if not m.has_error()]
            mean = exact_weighted_mean(ok, self.weighted_by_key)  # a buffer every client left alone stays as it was
            out.update({k: Array(mean[k].numpy()) for k in out if k in self.buffer_keys})
        return ArrayRecord(out), metrics

    @staticmethod
    def _as_sent(array: Array, dtype: np.dtype | None) -> Array:
        """``array`` in the floating dtype the round sent (unchanged when it was not a float or already is)."""
        a = array.numpy()
        if dtype is None or a.dtype == dtype or not (np.issubdtype(dtype, np.floating)
                                                       and np.issubdtype(a.dtype, np.floating)):
            return array
        return Array(a.astype(dtype))
