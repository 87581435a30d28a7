"""FedAdam whose adaptive step applies to parameters only; buffers take the plain weighted mean.

FedAdam's server step (Reddi et al. 2021) is meant for parameters; applied to BatchNorm running
statistics it can drive a running variance negative. Buffers (``buffer_keys``) therefore take the
weighted mean (FedAvg; a buffer identical in every reply keeps its value exactly, strategies.exact_mean)
while parameters take Flower's FedAdam step.
"""

from __future__ import annotations

from collections.abc import Iterable

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
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None or not self.buffer_keys:
            return arrays, metrics
        ok = [m.content for m in replies if not m.has_error()]
        mean = exact_weighted_mean(ok, self.weighted_by_key)  # a buffer every client left alone stays as it was
        out = {k: (Array(mean[k].numpy()) if k in self.buffer_keys else v) for k, v in arrays.items()}
        return ArrayRecord(out), metrics
