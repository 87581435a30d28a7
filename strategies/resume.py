"""Resume Flower's round loop after a finished round: the strategy's state, a round offset, a checkpoint file.

A federated run that stops (a killed sweep, a session's end, a crash) keeps every finished round: after
round r the ServerApp writes a checkpoint (the global arrays, the strategy's state, the study's own
per-round rows); a rerun of the same config starts at round r + 1 instead of round 1.

What makes the resumed run the same run:

- the round loop is still Flower's ``Strategy.start``; :func:`start_from_round` runs it over a thin
  wrapper (a strategies.wrapper.StrategyWrapper: the grid view and the rest delegated) that adds the
  offset to every round number the strategy sees, so round-dependent arithmetic (FedAdam's bias
  correction, the clients' per-round seeds and lr schedule from ``server-round``) sees the true round;
- every layer's state across rounds is saved and restored (strategies.layer.Layer.state, one entry per
  layer of the composition, outermost first): each layer's per-round client metrics and problems (the DP
  ledger, timing and error summary are built from them), a fixed cohort's contributors and cohort, the
  FedOpt family's server moments (``m_t``, ``v_t``), a DP wrapper's clip and noise records, a drift
  guard's reports. Everything else a strategy here holds is rebuilt each round (``current_arrays``, the
  round's checked replies). A layer with other cross-round state extends ``state`` / ``restore_state``;
  one whose state lives elsewhere (an observer's callbacks, the ultrasound auditor's tap) sets
  ``unresumable`` and a checkpoint of its composition is refused.
- DP noise: a seeded noise source's generator state is saved, so a resumed run adds the noise the
  uninterrupted run would (bit for bit); a secure source's never is (it is the secret that hides the
  clients' updates): a resumed secure run draws fresh OS entropy, which the privacy analysis allows
  (every round's noise is an independent draw either way).

The study writes the checkpoint atomically (:func:`encode_checkpoint` gives its bytes); it is loaded with
``torch.load(weights_only=True)`` (tensors, strings, numbers only: no pickle of arbitrary objects); it
names the config it belongs to (``run_hash``), and a checkpoint of another config is ignored, never
resumed from.

Whom it concerns: the checkpoint holds what the server already holds (the global model, the metrics the
clients reported, and for a seeded DP run the noise generator's state, which predicts the remaining
rounds' noise as the seed file does); it stays in the server's run folder, is written readable by its
owner only, and is deleted when the run finishes.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAdagrad, FedAdam, FedYogi, Result, Strategy

from strategies.layer import Layer, layers
from strategies.wrapper import StrategyWrapper

log = logging.getLogger(__name__)

CHECKPOINT = "round_checkpoint.pt"
FORMAT = 2  # 2: every layer's state (strategies.layer.Layer.state); 1 held only the outer strategy's
STATE_ATTRS = ("m_t", "v_t")  # flwr.serverapp.strategy.fedopt: the server optimizer's moments
#: Flower's exported server optimizers (the FedOpt family, which holds m_t and v_t)
SERVER_OPTIMIZERS = (FedAdagrad, FedAdam, FedYogi)


def _optimizer_state(strategy: object) -> dict[str, Any]:
    """A Flower server optimizer's moments (``m_t``, ``v_t``) as tensors; nothing for another strategy."""
    state: dict[str, Any] = {}
    if isinstance(strategy, SERVER_OPTIMIZERS):
        for name, value in (("m_t", strategy.m_t), ("v_t", strategy.v_t)):
            if value is not None:
                state[name] = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in value.items()}
    return state


def strategy_state(strategy: Strategy) -> dict[str, Any]:
    """What ``strategy`` carries from one round to the next: every layer's :meth:`Layer.state
    <strategies.layer.Layer.state>` (outermost first, strategies.layer.layers) with its kind, plus a Flower
    server optimizer's moments. A composition with a layer whose state cannot be saved (``unresumable``)
    is refused with that layer's reason."""
    saved = []
    for layer in layers(strategy):
        why = layer.unresumable if isinstance(layer, Layer) else ""
        if why:
            raise ValueError(f"{type(layer).__name__} cannot be resumed from a round checkpoint: {why}")
        state = layer.state() if isinstance(layer, Layer) else {}
        saved.append({"kind": type(layer).__name__, **state, **_optimizer_state(layer)})
    return {"layers": saved}


def restore_strategy_state(strategy: Strategy, state: dict[str, Any]) -> None:
    """Put :func:`strategy_state`'s output back into a freshly built composition of the same layers."""
    walked = list(layers(strategy))
    kinds = [type(x).__name__ for x in walked]
    saved = state.get("layers")
    if not isinstance(saved, list) or [s.get("kind") for s in saved] != kinds:
        raise ValueError(f"the checkpoint holds the state of layers "
                         f"{None if not isinstance(saved, list) else [s.get('kind') for s in saved]}, "
                         f"not of this composition's {kinds}")
    for layer, layer_state in zip(walked, saved):
        for name in STATE_ATTRS:
            if name in layer_state:
                if not isinstance(layer, SERVER_OPTIMIZERS):
                    raise ValueError(f"the checkpoint holds {name!r}, which {type(layer).__name__} does not have")
                setattr(layer, name, {k: v.numpy().copy() for k, v in layer_state[name].items()})
        if isinstance(layer, Layer):
            layer.restore_state(layer_state)


class _FromRound(StrategyWrapper):
    """``inner`` seen by Flower's round loop as rounds 1, 2, ... while it works on rounds offset + 1, ...

    A strategies.wrapper.StrategyWrapper: the grid view, round limits and the rest of the protocol are the
    wrapped strategy's; only the round numbers it sees are shifted."""

    def __init__(self, inner: Strategy, offset: int) -> None:
        super().__init__(inner)
        self.offset = offset

    def summary(self) -> None:
        self.strategy.summary()  # invisible: the run is the wrapped strategy's

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        return super().configure_train(server_round + self.offset, arrays, config, grid)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        return super().aggregate_train(server_round + self.offset, replies)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return super().configure_evaluate(server_round + self.offset, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return super().aggregate_evaluate(server_round + self.offset, replies)


def start_from_round(strategy: Strategy, grid: Grid, arrays: ArrayRecord, *, first_round: int, num_rounds: int,
                     timeout: float, train_config: ConfigRecord | None = None,
                     evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None) -> Result:
    """``strategy.start`` for rounds ``first_round`` .. ``num_rounds`` from ``arrays`` (the global model after
    round ``first_round - 1``). ``evaluate_fn`` sees true round numbers, and 0 once before the first round.
    ``first_round`` past ``num_rounds`` (every round was done): no round runs, ``arrays`` is the result."""
    if first_round < 1:
        raise ValueError(f"first_round must be >= 1, got {first_round}")
    if first_round == 1:
        return strategy.start(grid, arrays, num_rounds, timeout, train_config, evaluate_fn=evaluate_fn)
    if first_round > num_rounds:
        return Result(arrays=arrays)
    offset = first_round - 1
    shifted = None if evaluate_fn is None else (lambda r, a: evaluate_fn(r + offset if r else 0, a))
    log.info("resuming at round %d of %d", first_round, num_rounds)
    return _FromRound(strategy, offset).start(grid, arrays, num_rounds - offset, timeout, train_config,
                                              evaluate_fn=shifted)


def encode_checkpoint(run_id: str, finished_round: int, arrays: ArrayRecord, strategy: Strategy,
                      extra: dict[str, Any]) -> bytes:
    """The state after ``finished_round`` as bytes for the run folder's :data:`CHECKPOINT` (write them
    atomically: ``flower_apps.common.results.atomic_write_bytes``); ``extra`` is JSON-able (the study's rows).

    ``arrays`` is the global ArrayRecord as the round loop holds it, kept with its dtypes (a strategy may
    hold its model in another dtype than the model's, e.g. Flower's own FedAdam in float64 under numpy 2;
    a cast would change the next round's update in the last bits)."""
    buf = io.BytesIO()
    torch.save({"format": FORMAT, "run": run_id, "round": int(finished_round),
                "arrays": {k: torch.from_numpy(np.array(a.numpy(), copy=True)) for k, a in arrays.items()},
                "strategy": strategy_state(strategy), "extra": json.dumps(extra)}, buf)
    return buf.getvalue()


def load_checkpoint(folder: str | Path, run_id: str) -> dict[str, Any] | None:
    """The checkpoint in ``folder`` if it belongs to ``run_id`` (else None, with a log line saying why)."""
    path = Path(folder) / CHECKPOINT
    if not path.is_file():
        return None
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a file we cannot read is not resumed from; the run starts at round 1
        log.warning("round checkpoint %s unreadable (%s); starting at round 1", path, e)
        return None
    if ck.get("format") != FORMAT or ck.get("run") != run_id:
        log.warning("round checkpoint %s belongs to run %s (format %s), not %s; starting at round 1",
                    path, ck.get("run"), ck.get("format"), run_id)
        return None
    ck["extra"] = json.loads(ck["extra"])
    return ck


def checkpoint_arrays(ck: dict[str, Any]) -> ArrayRecord:
    """The global ArrayRecord a checkpoint holds (names, order and dtypes as saved)."""
    return ArrayRecord({k: Array(np.array(t.numpy(), copy=True, order="C")) for k, t in ck["arrays"].items()})


def drop_checkpoint(folder: str | Path) -> None:
    """Remove the checkpoint (the run finished: its summary is written)."""
    (Path(folder) / CHECKPOINT).unlink(missing_ok=True)
