"""One wrapper protocol (strategies.layer, strategies.wrapper): every wrapper delegates what it does not change.

Contract tests over the whole family, each wrapper around a recording inner strategy (ours, and a bare Flower
one that gets the protocol's defaults), plus the compositions the studies build, walked with ``layers()``.
"""

from __future__ import annotations

import uuid
from contextlib import contextmanager

import numpy as np
import pytest
from flwr.app import ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg, FedProx, Strategy

from flower_apps.tabular_pdp.strategy import CohortFedAvg
from flower_apps.ultrasound.strategy import build_ultrasound_strategy
from privacy.audit import CanarySet, make_canaries
from privacy.randomness import NoiseSource
from strategies.base import FastGrid, PatternStrategy
from strategies.canaries import CanaryInsertion
from strategies.cohorts import PlanChecked, build_messages, round_problems
from strategies.drift_guard import DriftGuard
from strategies.fedavg_equal import EqualWeightFedAvg
from strategies.fedavg_examples import ExampleWeightedFedAvg
from strategies.fixed_cohort import FixedCohort
from strategies.layer import Layer, layer_of, layers, set_reply_rules
from strategies.matched_perturbation import MatchedPerturbation
from strategies.observer import RoundObserver
from strategies.personalized_clipping import PersonalizedServerSideClipping
from strategies.records import client_key, from_numpy
from strategies.registry import build_strategy
from strategies.reply_rules import ReplyRules
from strategies.resume import _FromRound
from strategies.sequential import RelayGrid, SequentialDFL
from strategies.server_fixed_clipping import ServerSideFixedClipping
from strategies.wrapper import StrategyWrapper

ARRAYS = from_numpy({"w": np.zeros(3, dtype=np.float32)})


def _pushed(messages: list[Message]) -> list[Message]:
    for m in messages:  # what the grid does when it pushes them
        m.metadata.__dict__["_message_id"] = str(uuid.uuid4())
    return messages


class Limits:
    """A round-limits context that counts its entries."""

    def __init__(self) -> None:
        self.entered = 0

    @contextmanager
    def __call__(self):
        self.entered += 1
        yield


class View:
    """The grid view a recorder prepares: sends nothing, answers nothing."""

    def __init__(self, grid) -> None:
        self.grid = grid

    def send_and_receive(self, messages, *, timeout=None):
        assert list(messages) == []
        return []


class Recorder(PatternStrategy):
    """An inner pattern strategy whose every answer is its own (unusual values, so delegation shows)."""

    array_claims = "last"
    required_metrics = frozenset({"inner-metric"})

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.limits = Limits()
        self.clip = None
        self.messages = _pushed(build_messages([(1, [0])], ARRAYS, ConfigRecord(), "x"))

    @property
    def weight_key(self) -> str:
        return "inner-weight"

    def prepare_grid(self, grid):
        return View(grid)

    def round_limits(self):
        return self.limits()

    def clip_members_with(self, clip) -> None:
        self.clip = clip

    def summary(self) -> None:
        self.calls.append(("summary",))

    def configure_train(self, server_round, arrays, config, grid):
        self.calls.append(("configure_train", server_round, grid))
        return [] if isinstance(grid, View) else self.messages

    def aggregate_train(self, server_round, replies):
        self.calls.append(("aggregate_train", server_round, list(replies)))
        return None, MetricRecord({"num-contributors": 0})

    def configure_evaluate(self, server_round, arrays, config, grid):
        self.calls.append(("configure_evaluate", server_round))
        return []

    def aggregate_evaluate(self, server_round, replies):
        self.calls.append(("aggregate_evaluate", server_round))
        return MetricRecord({"inner-eval": 1.0})


class BareRecorder(Strategy):
    """One of Flower's strategies in spirit: no protocol of its own (not a strategies.layer.Layer)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def summary(self) -> None:
        self.calls.append(("summary",))

    def configure_train(self, server_round, arrays, config, grid):
        self.calls.append(("configure_train", server_round, grid))
        return []

    def aggregate_train(self, server_round, replies):
        self.calls.append(("aggregate_train", server_round, list(replies)))
        return None, MetricRecord({"num-contributors": 0})

    def configure_evaluate(self, server_round, arrays, config, grid):
        self.calls.append(("configure_evaluate", server_round))
        return []

    def aggregate_evaluate(self, server_round, replies):
        self.calls.append(("aggregate_evaluate", server_round))
        return MetricRecord({"inner-eval": 1.0})


class Tagging(StrategyWrapper):
    """A new wrapper written against the base: it overrides aggregate_train only, nothing else."""

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        metrics = MetricRecord() if metrics is None else metrics
        metrics["tagged"] = 1
        return arrays, metrics


def _canaries() -> CanarySet:
    return make_canaries(2, 3, 1.0, np.random.default_rng(0))


# name -> (wrap(inner), round offset the inner sees, whether aggregate_train reaches the inner with no replies)
WRAPPERS = {
    "matched-perturbation-client": (lambda s: MatchedPerturbation(s, 1.0, 1.0, 1e-5, "client"), 0, True),
    "matched-perturbation-aggregate": (lambda s: MatchedPerturbation(s, 1.0, 1.0, 1e-5, "aggregate"), 0, True),
    "canary-insertion": (lambda s: CanaryInsertion(s, _canaries(), "cohort-mean"), 0, True),
    "round-observer": (lambda s: RoundObserver(s), 0, True),
    "server-fixed-clipping": (lambda s: ServerSideFixedClipping(s, 0.5, 1.0, np.random.default_rng(0)), 0, True),
    # PDP draws no noise and releases nothing when no client contributed: it returns before the aggregation
    "personalized-clipping": (lambda s: PersonalizedServerSideClipping(s, 0.5, 1.0, {0: 0.1},
                                                                      np.random.default_rng(0)), 0, False),
    "drift-guard": (lambda s: DriftGuard(s, CohortFedAvg([0], "x"), every=1, threshold=3.5), 0, True),
    "resume-offset": (lambda s: _FromRound(s, 4), 4, True),
    "new-wrapper": (lambda s: Tagging(s), 0, True),
}
EQUAL_ONLY = {"matched-perturbation-client", "matched-perturbation-aggregate", "canary-insertion"}


@pytest.mark.parametrize("name", sorted(WRAPPERS))
def test_every_wrapper_delegates_the_protocol(name):
    wrap, offset, reaches = WRAPPERS[name]
    inner = Recorder()
    w = wrap(inner)
    assert isinstance(w, StrategyWrapper) and list(w.layers()) == [w, inner] == list(layers(w))
    assert (w.array_claims, w.member_weights, w.weight_key) == ("last", "equal", "inner-weight")
    grid = object()
    view = w.prepare_grid(grid)
    assert isinstance(view, View) and view.grid is grid
    with w.round_limits():
        assert inner.limits.entered == 1

    def clip(r, who, model):
        return model

    if name == "matched-perturbation-client":  # it hands its own client clip down when built
        assert inner.clip == w._clip_model
    w.clip_members_with(clip)
    if name == "canary-insertion":  # the canaries are this layer's members: the clip stops here
        assert w._clip is clip and inner.clip is None
    else:
        assert inner.clip is clip
    # the rules given to the outermost layer reach the inner one; the inner's required metrics are in force
    rules = ReplyRules(max_examples=9)
    set_reply_rules(w, rules)
    assert inner.reply_rules is rules and w.reply_rules is rules
    assert w.reply_rules_in_force().required_metrics >= {"inner-metric"}

    inner.calls.clear()
    sent = list(w.configure_train(1, ARRAYS, ConfigRecord(), grid))
    assert sent == inner.messages and w._sent == inner.messages  # the wrapper checks replies against them
    assert inner.calls == [("configure_train", 1 + offset, grid)]
    w.aggregate_train(1, [])
    assert (("aggregate_train", 1 + offset, []) in inner.calls) is reaches
    assert list(w.configure_evaluate(2, ARRAYS, ConfigRecord(), grid)) == []
    assert w.aggregate_evaluate(2, []) == MetricRecord({"inner-eval": 1.0})
    assert inner.calls[-2:] == [("configure_evaluate", 2 + offset), ("aggregate_evaluate", 2 + offset)]
    w.summary()
    assert inner.calls[-1] == ("summary",)


@pytest.mark.parametrize("name", sorted(WRAPPERS))
def test_every_wrapper_starts_rounds_on_the_inner_grid_view_in_its_limits(name):
    inner = Recorder()
    w = WRAPPERS[name][0](inner)
    grid = object()
    w.start(grid, ARRAYS, num_rounds=1, timeout=1.0)
    trained = [c for c in inner.calls if c[0] == "configure_train"]
    assert len(trained) == 1 and isinstance(trained[0][2], View) and trained[0][2].grid is grid
    assert inner.limits.entered == 1 and ("summary",) in inner.calls


@pytest.mark.parametrize("name", sorted(WRAPPERS))
def test_a_bare_flower_strategy_gets_the_protocol_defaults(name):
    wrap, offset, reaches = WRAPPERS[name]
    inner = BareRecorder()
    if name in EQUAL_ONLY:  # Flower's FedAvg family weights by examples: noise sized for equal members is refused
        with pytest.raises(ValueError, match="equal-weight members"):
            wrap(inner)
        return
    w = wrap(inner)
    assert list(w.layers()) == [w, inner]
    assert (w.array_claims, w.member_weights, w.weight_key) == ("none", "examples", "num-examples")
    grid = View(None)
    assert w.prepare_grid(grid) is grid
    w.clip_members_with(lambda r, who, m: m)  # no members of its own: nothing to clip, no error
    with w.round_limits() as limits:
        assert limits is None  # no limits of its own
    w.start(grid, ARRAYS, num_rounds=1, timeout=1.0)  # Flower's loop on the grid as it is
    assert inner.calls[1] == ("configure_train", 1 + offset, grid)
    assert inner.calls[-2:] == [("configure_evaluate", 1 + offset), ("aggregate_evaluate", 1 + offset)]


def test_flowers_fedavg_family_answers_with_its_weight_key():
    fedavg = FedAvg(weighted_by_key="n-train")
    assert layer_of(fedavg).weight_key == "n-train" and ServerSideFixedClipping(
        fedavg, 0.5, 1.0, np.random.default_rng(0)).weight_key == "n-train"
    cohort = CohortFedAvg([0, 1], "x")
    cohort.weighted_by_key = "n-train"
    assert DriftGuard(ServerSideFixedClipping(cohort, 0.5, 1.0, np.random.default_rng(0)), cohort, 1, 3.5
                      ).weight_key == "n-train"


class CohortFedProx(FixedCohort, FedProx):
    """Example B's FedProx on a fixed cohort (tests/examples/fedprox_gdp_tabular.py)."""


def _fedprox() -> CohortFedProx:
    s = CohortFedProx(proximal_mu=0.1)
    s.set_cohort([0, 1], "x")
    return s


def _dp(inner, clip_at="client"):
    return MatchedPerturbation(inner, 1.0, 1.0, 1e-5, clip_at, NoiseSource(), (0,))


# The compositions the studies build, outermost first: (build, the layer types, array_claims, member_weights,
# prepare_grid's view type)
COMPOSITIONS = {
    "dfl-dp fl": (lambda: RoundObserver(build_strategy("fl", [0, 1], "x", dp=True, clip_norm=1.0, eps_cal=1.0)),
                  [RoundObserver, MatchedPerturbation, EqualWeightFedAvg], "each", "equal", FastGrid),
    "dfl-dp fl audited": (lambda: RoundObserver(build_strategy("fl", [0, 1], "x", dp=True, clip_norm=1.0,
                                                               eps_cal=1.0, canaries=_canaries())),
                          [RoundObserver, MatchedPerturbation, CanaryInsertion, EqualWeightFedAvg], "each",
                          "equal", FastGrid),
    "dfl-dp sequential audited": (lambda: RoundObserver(build_strategy(
        "sequential-dfl", [0, 1], "x", dp=True, clip_norm=1.0, eps_cal=1.0, canaries=_canaries())),
        [RoundObserver, MatchedPerturbation, CanaryInsertion, SequentialDFL], "last", "equal", RelayGrid),
    "examples": (lambda: RoundObserver(ExampleWeightedFedAvg([0, 1], "x")),
                 [RoundObserver, ExampleWeightedFedAvg], "each", "examples", FastGrid),
    "tabular gdp": (lambda: ServerSideFixedClipping(CohortFedAvg([0, 1], "x"), 0.5, 1.0, np.random.default_rng(0)),
                    [ServerSideFixedClipping, CohortFedAvg], "none", "examples", object),
    "tabular pdp + drift": (lambda: (lambda base: DriftGuard(PersonalizedServerSideClipping(
        base, 0.5, 1.0, {0: 0.1, 1: 0.2}, np.random.default_rng(0)), base, 2, 3.5))(CohortFedAvg([0, 1], "x")),
        [DriftGuard, PersonalizedServerSideClipping, CohortFedAvg], "none", "examples", object),
    "example B fedprox gdp": (lambda: ServerSideFixedClipping(_fedprox(), 0.5, 1.0, np.random.default_rng(0)),
                              [ServerSideFixedClipping, CohortFedProx], "none", "examples", object),
    "ultrasound resumed": (lambda: _FromRound(build_ultrasound_strategy("fedadam"), 3),
                           [_FromRound, type(build_ultrasound_strategy("fedadam"))], "none", "examples", object),
}


@pytest.mark.parametrize("name", sorted(COMPOSITIONS))
def test_study_compositions_walk_and_answer_like_their_innermost_strategy(name):
    build, kinds, claims, weights, view = COMPOSITIONS[name]
    outer = build()
    walked = list(layers(outer))
    assert [type(x) for x in walked] == kinds
    base = walked[-1]
    assert isinstance(base, Layer) and not isinstance(base, StrategyWrapper)
    for layer in walked:  # every layer answers the same
        assert isinstance(layer, Layer)
        assert (layer.array_claims, layer.member_weights, layer.weight_key) == (claims, weights, "num-examples")
        grid = object()
        got = layer.prepare_grid(grid)
        assert (got is grid) if view is object else isinstance(got, view)
        with layer.round_limits() as mine, base.round_limits() as its:
            assert type(mine) is type(its)
    rules = ReplyRules(max_examples=7)
    set_reply_rules(outer, rules)
    assert all(layer.reply_rules is rules for layer in walked)


class _Grid:
    def get_node_ids(self):
        return [1, 2]


def _reply(msg: Message, cid: int, claim: int | None = None) -> Message:
    who = cid if claim is None else claim
    return Message(RecordDict({client_key(who): from_numpy({"w": np.ones(3, dtype=np.float32)}),
                               "metrics": MetricRecord({"num-examples": 4, "train-loss": 0.5, "client-ids": [who]})}),
                   reply_to=msg)


def test_round_problems_walk_every_layer_outermost_first():
    """A forged reply (it speaks for another client) refused by the outer layer; the outer reason wins, and the
    inner layers' records are their own (no layer list passed by hand)."""
    outer = RoundObserver(_dp(EqualWeightFedAvg([0, 1, 2], "x")))
    msgs = _pushed(list(outer.configure_train(1, ARRAYS, ConfigRecord(), _Grid())))
    replies = [_reply(msgs[0], 0), _reply(msgs[1], 1, claim=2),
               Message(Error(7, "node lost"), reply_to=msgs[2])]
    outer.aggregate_train(1, replies)
    probs = round_problems(outer)[1]
    assert sorted(probs) == [1, 2] and "rejected" in probs[1] and "node lost" in probs[2]
    mp, base = outer.strategy, outer.strategy.strategy
    assert probs[1] == outer.problems[1][1] != mp.problems[1][1]  # the inner saw the refusal as an error reply
    assert mp.problems[1][1].startswith("error reply") and sorted(base.problems[1]) == [1, 2]
    assert sorted(outer.client_metrics[1]) == sorted(mp.client_metrics[1]) == sorted(base.client_metrics[1]) == [0]
    assert round_problems(base) == {1: base.problems[1]}  # a single strategy is one layer


def test_layers_of_a_plain_strategy_is_itself():
    fedavg = FedAvg()
    assert list(layers(fedavg)) == [fedavg]
    ewfa = EqualWeightFedAvg([0], "x")
    assert list(layers(ewfa)) == [ewfa] and isinstance(ewfa, PlanChecked)
