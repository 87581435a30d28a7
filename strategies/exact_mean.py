"""The weighted mean of arrays that every reply carries bit for bit the same is that array, exactly.

Flower's ``aggregate_arrayrecords`` sums ``w_k * x_k`` in the arrays' dtype (float32), so an array that
no client changed (a frozen backbone, frozen BatchNorm statistics, a layer without gradient) comes back
moved by rounding every round, and FedAdam then steps on that rounding as if it were an update. The
mathematics says the mean of identical values is the value: :class:`ExactConsensusMean` restores it for
the FedAvg family, in the mean itself (so FedAdam sees a zero pseudo-gradient there and leaves the array
as it was, its moments at zero). Arrays that differ between replies are aggregated exactly as before.

Why it matters beyond the last bit: a frozen trunk that stays bit-identical across rounds lets clients
reuse its features (flower_apps/ultrasound/features.py), and a reader of the saved model sees the frozen
layers equal to the pretrained ones.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

from strategies.flwr_adapter import FedOptMeanHook, is_fedopt, weighted_mean_arrays


def consensus_arrays(records: Iterable[RecordDict]) -> dict[str, np.ndarray]:
    """Arrays (by key, over every ArrayRecord of each record) that all ``records`` carry bit for bit the same."""
    per_record = [{k: v.numpy() for rec in r.array_records.values() for k, v in rec.items()} for r in records]
    if not per_record:
        return {}
    first, rest = per_record[0], per_record[1:]
    out = {}
    for key, value in first.items():
        if all(key in other and other[key].dtype == value.dtype and other[key].shape == value.shape
               and np.array_equal(other[key], value) for other in rest):
            out[key] = value
    return out


def with_consensus(arrays: ArrayRecord, consensus: dict[str, np.ndarray]) -> ArrayRecord:
    """``arrays`` with every key of ``consensus`` replaced by its consensus value (other keys untouched)."""
    if not consensus:
        return arrays
    return ArrayRecord({k: Array(np.array(consensus[k], copy=True)) if k in consensus else v for k, v in arrays.items()})


def exact_weighted_mean(records: list[RecordDict], weighting_metric_name: str) -> ArrayRecord:
    """Flower's weighted mean (``aggregate_arrayrecords``) with the arrays all ``records`` share kept exactly."""
    return with_consensus(weighted_mean_arrays(records, weighting_metric_name), consensus_arrays(records))


class ExactConsensusMean(FedOptMeanHook):
    """Mixin before a Flower FedAvg-family strategy: arrays identical in every valid reply aggregate to themselves.

    For FedAvg / FedProx the mean is replaced after Flower computed it; for FedOpt strategies (FedAdam,
    FedAdagrad, FedYogi) inside the step, before the pseudo-gradient is formed (:meth:`adjust_fedopt_mean`,
    strategies.flwr_adapter.FedOptMeanHook), so the adaptive step sees exactly zero where no client moved.
    """

    _consensus: dict[str, np.ndarray] = {}

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        self._consensus = consensus_arrays(r.content for r in replies if not r.has_error())
        try:
            arrays, metrics = super().aggregate_train(server_round, replies)  # type: ignore[misc]
        finally:
            consensus, self._consensus = self._consensus, {}
        if arrays is not None and not is_fedopt(self):
            arrays = with_consensus(arrays, consensus)
        return arrays, metrics

    def adjust_fedopt_mean(self, aggregated: ArrayRecord) -> ArrayRecord:
        return with_consensus(aggregated, self._consensus)
