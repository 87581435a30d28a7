"""The one protocol every strategy in a composition speaks, and how to walk a composition's layers.

A study composes strategies: a round pattern (strategies.base.PatternStrategy) or one of Flower's
FedAvg family on a fixed cohort (strategies.fixed_cohort), wrapped by DP, audit canaries, observers,
a drift re-check or the resume offset (strategies.wrapper.StrategyWrapper). Every layer answers the
same questions, so no code asks "does this strategy have ...?":

- ``prepare_grid(grid)``: the grid view the round communicates through (the relay for token passing);
- ``round_limits()``: the context a round loop runs in (the pattern strategies' one BLAS thread);
- ``array_claims``: which planned clients a reply carries a model for (strategies.cohorts);
- ``member_weights``: how the aggregate weights its members ("equal" or "examples"), and
  ``weight_key``: the reply metric a weight is read from;
- ``clip_members_with(clip)``: members the layer adds itself (audit canaries) go through a DP
  wrapper's client clip;
- ``reply_rules`` / ``required_metrics``: what replies are checked with (strategies.reply_rules);
- ``problems`` and ``client_metrics``: this layer's own per-round records (strategies.cohorts);
- ``state()`` / ``restore_state(state)``: what this layer carries from one round to the next, for a round
  checkpoint (strategies.resume saves every layer's); ``unresumable``: why a layer's state cannot be saved
  (a checkpoint of a composition holding it is refused), or "";
- ``layers()``: this layer, then the layers it wraps, outermost first.

:class:`Layer` holds the defaults of a layer that wraps nothing and adds no members, as Flower's FedAvg
family is (one model per reply, weighted by examples, the grid as it is). A Flower strategy that is not
a Layer (bare ``FedAvg``) gets the same defaults through :func:`layer_of`.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, overload

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result, Strategy

if TYPE_CHECKING:
    from strategies.reply_rules import ReplyRules

#: a DP wrapper's client clip: (round, who, model) -> the clipped model
MemberClip = Callable[[int, str, "OrderedDict[str, np.ndarray]"], "OrderedDict[str, np.ndarray]"]


class PerLayer:
    """A dict attribute kept in each layer's own ``__dict__`` (created empty on first read): a layer's records
    are its own, never the wrapped strategy's."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> PerLayer: ...

    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> dict[int, Any]: ...

    def __get__(self, obj: object | None, objtype: type | None = None) -> PerLayer | dict[int, Any]:
        if obj is None:
            return self
        return obj.__dict__.setdefault(self.name, {})

    def __set__(self, obj: object, value: dict[int, Any]) -> None:
        obj.__dict__[self.name] = value


class Layer:
    """The protocol of a strategy layer, with the defaults of one that wraps nothing (see the module doc)."""

    #: round -> {planned client: why it did not contribute}, from this layer's reply checks
    problems = PerLayer()
    #: round -> {client: the metrics of its reply}, for the replies that passed this layer's check
    client_metrics = PerLayer()
    #: the rules this layer checks replies with (strategies.reply_rules.set_reply_rules gives them to every layer)
    reply_rules: ReplyRules | None = None
    #: what this layer's aggregation reads from each reply (added to the rules in force)
    required_metrics: frozenset[str] = frozenset()

    @property
    def array_claims(self) -> str:
        """Which planned clients a reply carries a model for: "each", "last" or "none" (strategies.cohorts)."""
        return "none"  # Flower's FedAvg family: one model per reply, under its arrays key

    @property
    def member_weights(self) -> str:
        """How the aggregate weights its members: "equal" or "examples" (the DP wrappers size noise for "equal")."""
        return "examples"  # Flower's FedAvg: by each reply's weighted_by_key

    @property
    def weight_key(self) -> str:
        """The reply metric a member's weight is read from."""
        return "num-examples"

    def prepare_grid(self, grid: Grid) -> Grid:
        """The grid view this layer's rounds communicate through."""
        return grid

    def round_limits(self) -> AbstractContextManager[object]:
        """The context the round loop runs in."""
        return nullcontext()

    def clip_members_with(self, clip: MemberClip) -> None:
        """Pass the members this layer adds itself through ``clip`` (a DP wrapper's client clip); none here."""

    def layers(self) -> Iterator[object]:
        """This layer, then the layers it wraps (outermost first)."""
        yield self

    #: why this layer's cross-round state cannot be saved in a round checkpoint (e.g. observations held by a
    #: callback), or "" when :meth:`state` holds all of it
    unresumable: str = ""

    def state(self) -> dict[str, Any]:
        """This layer's own cross-round state as JSON text and tensors (what a round checkpoint keeps;
        ``torch.load(weights_only=True)`` reads it back). A layer with more state extends it; the default is
        the layer's records, ``client_metrics`` and ``problems``."""
        return {"client_metrics": json.dumps({str(r): {str(c): dict(m) for c, m in per.items()}
                                              for r, per in self.client_metrics.items()}, sort_keys=True),
                "problems": json.dumps({str(r): {str(c): why for c, why in per.items()}
                                        for r, per in self.problems.items()}, sort_keys=True)}

    def restore_state(self, state: dict[str, Any]) -> None:
        """Put :meth:`state`'s output back into a freshly built layer of the same kind."""
        self.client_metrics = {int(r): {int(c): m for c, m in per.items()}
                               for r, per in json.loads(state["client_metrics"]).items()}
        self.problems = {int(r): {int(c): why for c, why in per.items()}
                         for r, per in json.loads(state["problems"]).items()}


class _BareFlower(Layer):
    """The protocol's defaults for a Flower strategy that is not a :class:`Layer` (e.g. a bare ``FedAvg``)."""

    def __init__(self, strategy: object) -> None:
        self._strategy = strategy

    @property
    def weight_key(self) -> str:
        return self._strategy.weighted_by_key if isinstance(self._strategy, FedAvg) else "num-examples"


def layer_of(strategy: object) -> Layer:
    """``strategy``'s answers to the protocol: itself when it is a :class:`Layer`, else the defaults."""
    return strategy if isinstance(strategy, Layer) else _BareFlower(strategy)


def layers(strategy: object) -> Iterator[object]:
    """The layers of a composition, outermost first (a strategy that is not a Layer is one layer)."""
    return strategy.layers() if isinstance(strategy, Layer) else iter((strategy,))


def start_rounds(strategy: Strategy, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int, timeout: float,
                 train_config: ConfigRecord | None, evaluate_config: ConfigRecord | None,
                 evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None) -> Result:
    """Flower's round loop (``Strategy.start``) over the composition's grid view, in its round limits."""
    layer = layer_of(strategy)
    with layer.round_limits():
        return Strategy.start(strategy, layer.prepare_grid(grid), initial_arrays, num_rounds, timeout, train_config,
                              evaluate_config, evaluate_fn)


def set_reply_rules(strategy: object, rules: ReplyRules) -> None:
    """Give ``rules`` (strategies.reply_rules) to ``strategy`` and every layer it wraps (:func:`layers`)."""
    for layer in layers(strategy):
        if isinstance(layer, Layer):
            layer.reply_rules = rules
