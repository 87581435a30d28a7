"""Every reply is hostile until validated: keys, shapes, dtypes, finiteness and sizes, before any arithmetic.

Threat: a malicious participant (a client, or a SuperNode playing several logical clients) answers
a train message with content chosen to break the server's arithmetic rather than to train: NaN or
Inf weights (a NaN norm makes ``clip_by_l2``'s scale NaN, so one reply turns the global model NaN
with or without DP), arrays of other shapes or dtypes (a shape ``(1,)`` is broadcast by NumPy and
silently accepted; an int32 model becomes a sequential chain's release), missing or extra tensors
(Flower's aggregation raises and ends the run), and metrics that enter a computation with values
out of range (``num-examples = -299`` gives an honest client's clipped update coefficient 99.8 in
a size-weighted mean whose noise was sized for coefficients <= 1).

:func:`reply_problem` says why a reply must not touch a model (None when it may). It is called by
:func:`strategies.cohorts.check_replies` for every reply of every study, so a bad reply is rejected
there, counted as a failed client and recorded (the run summary's ``round_errors``) like any other
refused reply: it never crashes the run and never enters a model.

What a reply is checked against comes from the server, never from the reply:

* the arrays the server sent (the message's own ArrayRecords) fix the keys, their order, the
  shapes and the dtypes of every model the reply returns;
* :class:`ReplyRules` (set by the study) fixes which metric keys must be present, the range of
  every metric the server computes with, and the bound on ``num-examples`` the server knows
  (the data plan's sizes, or sizes committed earlier in the run).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ArrayRecord, Message

from strategies.records import CLIENT_PREFIX, number

#: The largest ``num-examples`` accepted when the study gives no tighter bound (2^31 - 1).
MAX_EXAMPLES_DEFAULT = 2**31 - 1
#: The largest magnitude of a returned weight. Training never produces it; a value near float32's
#: 3.4e38 would overflow the float32 sums of Flower's weighted mean to Inf (a finite hostile reply
#: poisoning the model all the same). 1e12 leaves room for a million such values in one sum.
MAX_ABS_VALUE_DEFAULT = 1e12


@dataclass(frozen=True)
class MetricRule:
    """Range of one reply metric: ``lo <= value <= hi``; ``integer``: integral values only.

    A list-valued metric has every element checked.
    """

    lo: float = -math.inf
    hi: float = math.inf
    integer: bool = False

    def problem(self, name: str, value: object) -> str | None:
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                return f"metric {name!r} = {v!r} is not a number"
            if not math.isfinite(v):
                return f"metric {name!r} = {v} is not finite"
            if self.integer and float(v) != math.floor(v):
                return f"metric {name!r} = {v} is not an integer"
            if not self.lo <= v <= self.hi:
                return f"metric {name!r} = {v} is outside [{self.lo:g}, {self.hi:g}]"
        return None


#: Metrics the project's servers compute with, by name, wherever a reply carries them.
#: ``num-examples`` is added by :meth:`ReplyRules.rule_for` with the study's bound.
METRIC_RULES: dict[str, MetricRule] = {
    "client-ids": MetricRule(lo=0, integer=True),
    "client-id": MetricRule(lo=0, integer=True),
    "steps": MetricRule(lo=0, integer=True),
    "sample-rate": MetricRule(lo=0.0, hi=1.0),
    "noise-multiplier": MetricRule(lo=0.0),
    "n-records": MetricRule(lo=0, integer=True),
    "n-original": MetricRule(lo=0, integer=True),
    "suppressed": MetricRule(lo=0, integer=True),
    "levels": MetricRule(lo=0, integer=True),
    "abs-err-sum": MetricRule(lo=0.0),
    "rel-err-sum": MetricRule(lo=0.0),
    "sq-err-sum": MetricRule(lo=0.0),
    "train-loss": MetricRule(lo=0.0),
    # anonymization (tabular-pdp): ARIREC is a mean of 1/|EC| over equivalence classes, so in (0, 1]
    "arirec": MetricRule(lo=1e-12, hi=1.0),
    "k": MetricRule(lo=1, integer=True),
    "l": MetricRule(lo=1, integer=True),
    "t": MetricRule(lo=0.0, hi=1.0),
    "n-classes": MetricRule(lo=1, integer=True),
}


@dataclass(frozen=True)
class ReplyRules:
    """What a study's replies must satisfy beyond matching the arrays that were sent.

    Parameters
    ----------
    max_examples : the largest ``num-examples`` one logical client may report (a bound the
        server knows: its data plan's largest client, the dataset size, ...); a reply for k
        planned clients may report up to k times as many.
    committed_examples : client id -> the exact ``num-examples`` that client must report (sizes
        the server fixed earlier, e.g. those its privacy ledger uses); a reply for several planned
        clients must report their sum.
    returns_model : the reply must carry a model for every ArrayRecord the message sent
        (``False`` for queries and evaluation rounds, whose replies carry metrics only).
    metric_keys : when set, each MetricRecord of the reply must have exactly these keys
        (Flower's aggregation needs identical metric keys in every reply).
    finite_arrays : every floating-point value of every returned array must be finite and at most
        ``max_abs_value`` in magnitude.
    finite_metrics : every numeric metric must be finite (except ``nonfinite_metrics``); ``False`` for
        replies whose metrics only describe the node's own state and enter no shared computation.
    nonfinite_metrics : metrics that may legitimately be NaN (e.g. a test accuracy a node without
        a test set cannot compute); they must still be numbers.
    max_examples_of : client id -> the largest ``num-examples`` that client may report (a bound it
        committed to earlier, e.g. its record count); clients not listed use ``max_examples``.
    side_arrays : prefixes of ArrayRecords that are not models (e.g. captured gradients for the
        inversion attacks): any shape, every value finite; they never enter an aggregate.
    content_check : a study's own check of the rest of the content (reply, planned clients) ->
        why not, or None; runs after everything above passed.
    required_metrics : metrics the reply's ``metrics`` record must carry (what the aggregation reads;
        a strategy adds its own, ``PlanChecked.required_metrics``): a reply without one is refused
        rather than crashing the round.
    """

    max_examples: int = MAX_EXAMPLES_DEFAULT
    committed_examples: Mapping[int, int] | None = None
    returns_model: bool = True
    metric_keys: frozenset[str] | None = None
    finite_arrays: bool = True
    finite_metrics: bool = True
    max_abs_value: float = MAX_ABS_VALUE_DEFAULT
    nonfinite_metrics: frozenset[str] = field(default_factory=frozenset)
    max_examples_of: Mapping[int, int] | None = None
    side_arrays: tuple[str, ...] = ()
    content_check: Callable[[Message, tuple[int, ...]], str | None] | None = None
    required_metrics: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not 1 <= int(self.max_examples) <= MAX_EXAMPLES_DEFAULT:
            raise ValueError(f"max_examples must be in [1, {MAX_EXAMPLES_DEFAULT}], got {self.max_examples}")

    def rule_for(self, name: str, planned: tuple[int, ...] = ()) -> MetricRule | None:
        """The range of metric ``name`` in a reply for the ``planned`` logical clients (None: finite only)."""
        if name == "num-examples":
            bound = self.max_examples_of or {}
            hi = sum(min(int(bound.get(c, self.max_examples)), self.max_examples) for c in planned) or self.max_examples
            return MetricRule(lo=1, hi=hi, integer=True)
        return METRIC_RULES.get(name)


DEFAULT_RULES = ReplyRules()


def template_of(sent: Message) -> dict[str, ArrayRecord]:
    """The ArrayRecords a message carried (the models its reply must match), by record key."""
    return {k: rec for k, rec in sent.content.array_records.items() if len(rec) > 0}


def _array_problem(key: str, got: ArrayRecord, want: ArrayRecord, finite: bool,
                   max_abs: float = MAX_ABS_VALUE_DEFAULT) -> str | None:
    """Why ``got`` is not a model shaped like ``want`` (None when it is)."""
    got_keys, want_keys = list(got.keys()), list(want.keys())
    if got_keys != want_keys:
        missing = [k for k in want_keys if k not in got.keys()]
        extra = [k for k in got_keys if k not in want.keys()]
        if missing or extra:
            return f"record {key!r}: missing tensors {missing[:3]}, extra tensors {extra[:3]}"
        return f"record {key!r}: tensors in another order than sent"
    for name in want_keys:
        ref = want[name]
        try:
            arr = got[name].numpy()
        except Exception as exc:  # a malformed payload must not crash the server
            return f"record {key!r} tensor {name!r}: unreadable ({type(exc).__name__}: {exc})"
        if not isinstance(arr, np.ndarray):
            return f"record {key!r} tensor {name!r}: not an array"
        if tuple(arr.shape) != tuple(ref.shape):
            return f"record {key!r} tensor {name!r}: shape {tuple(arr.shape)}, sent {tuple(ref.shape)}"
        # Flower's FedOpt returns integer buffers (BatchNorm's num_batches_tracked) as float64; a client
        # loads them back as int64. That pair is the only dtype change accepted.
        if str(arr.dtype) != str(ref.dtype) and not (str(ref.dtype) == "float64" and arr.dtype.kind in "iu"):
            return f"record {key!r} tensor {name!r}: dtype {arr.dtype}, sent {ref.dtype}"
        if finite and arr.dtype.kind in "fc" and not (np.abs(arr) <= max_abs).all():
            bad = int(np.size(arr) - np.isfinite(arr).sum())
            if bad:
                return f"record {key!r} tensor {name!r}: {bad} non-finite values"
            return f"record {key!r} tensor {name!r}: values up to {float(np.abs(arr).max()):.3g}, beyond {max_abs:g}"
    return None


def reply_problem(sent: Message, reply: Message, planned: tuple[int, ...], array_claims: str,
                  rules: ReplyRules = DEFAULT_RULES) -> str | None:
    """Why ``reply`` (a non-error answer to ``sent``) must not enter any computation; None if it may.

    Arrays: every ArrayRecord of the reply must match a record the message sent: the one under the
    same key, else (for per-client records ``client.<id>``) the message's single model. Metrics:
    every numeric value finite (except ``rules.nonfinite_metrics``), every metric with a rule in
    range, ``num-examples`` a finite integer in ``[1, rules.max_examples]`` (or the committed size).
    """
    content = reply.content
    sent_arrays = template_of(sent)
    single = next(iter(sent_arrays.values())) if len(sent_arrays) == 1 else None
    for key, rec in content.array_records.items():
        if rules.side_arrays and key.startswith(rules.side_arrays):
            problem = _array_problem(key, rec, rec, True, rules.max_abs_value)
            if problem is not None:
                return problem
            continue
        want = sent_arrays.get(key)
        if want is None and key.startswith(CLIENT_PREFIX):
            want = single
        if want is None:
            if sent_arrays:
                return f"unexpected array record {key!r} (sent {sorted(sent_arrays)})"
            want = rec  # nothing was sent to compare with: only finiteness can be checked
        problem = _array_problem(key, rec, want, rules.finite_arrays, rules.max_abs_value)
        if problem is not None:
            return problem
    if rules.returns_model and array_claims == "none":
        missing = [k for k in sent_arrays if k not in content.array_records]
        if missing:
            return f"no model under {missing} (the message sent one)"
    if rules.required_metrics:
        have = set(content.metric_records["metrics"].keys()) if "metrics" in content.metric_records else set()
        missing = sorted(rules.required_metrics - have)
        if missing:
            return f"metrics 'metrics': missing {missing}, which the aggregation reads"
    for rkey, mrec in content.metric_records.items():
        if rules.metric_keys is not None and set(mrec.keys()) != set(rules.metric_keys):
            extra = sorted(set(mrec.keys()) - rules.metric_keys)
            missing = sorted(rules.metric_keys - set(mrec.keys()))
            return f"metrics {rkey!r}: missing {missing}, unexpected {extra}"
        for name, value in mrec.items():
            rule = rules.rule_for(name, planned)
            if name != "num-examples" and (not rules.finite_metrics or name in rules.nonfinite_metrics):
                problem = _number_problem(name, value)
            elif rule is not None:
                problem = rule.problem(name, value)
            else:
                problem = MetricRule().problem(name, value)
            if problem is not None:
                return problem
        if rules.committed_examples is not None and "num-examples" in mrec:
            want_n = sum(int(rules.committed_examples.get(c, -1)) for c in planned)
            if int(number(mrec["num-examples"])) != want_n:
                return f"num-examples = {mrec['num-examples']}, the clients committed {want_n}"
    if rules.content_check is not None:
        return rules.content_check(reply, planned)
    return None


def _number_problem(name: str, value: object) -> str | None:
    """Why ``value`` is not a number or a list of numbers (NaN and Inf allowed); None when it is."""
    for v in value if isinstance(value, list) else [value]:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"metric {name!r} = {v!r} is not a number"
    return None
