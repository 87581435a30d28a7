"""A hostile-client fuzzer: every study's server path, in process, with one client whose replies are forged.

Each study's real ``server_main`` runs on an in-process grid whose nodes call the study's real ClientApp.
One logical client (``HOSTILE``) is hostile: from the first round that trains the shared model, each of its
train replies is forged with the next corruption of :data:`CORRUPTIONS` (NaN, Inf, huge values, shapes,
dtypes, missing / extra / empty tensors and records, negative / zero / huge / fractional / NaN sizes, extra
and missing metrics), one per round. The baseline is the same run in which that client's replies are refused
by the check that predates the validator (they claim to speak for another client). Every forged reply must be
refused the same way: the run completes, the model stays finite, equals the baseline bit for bit (with DP too:
a local noise seed file makes the noise the same), and ``round_errors`` names each refusal.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict

from flower_apps.config import RUN_CONFIG_DEFAULTS
from flower_apps.router import prepare

torch.set_num_threads(1)
HOSTILE = 1


def _float_keys(rec: ArrayRecord) -> list[str]:
    return [k for k, v in rec.items() if v.numpy().dtype.kind == "f"]


def _map_models(content: RecordDict, fn) -> None:
    """Replace every model record (not side arrays) of ``content`` by ``fn(record)``."""
    for key in list(content.array_records):
        if not key.startswith("victim-"):
            content[key] = fn(content.array_records[key])


def _edit_first(fn):
    def edit(rec: ArrayRecord) -> ArrayRecord:
        k = _float_keys(rec)[0]
        out = OrderedDict((n, v.numpy().copy()) for n, v in rec.items())
        out[k] = fn(out[k])
        return ArrayRecord(OrderedDict((n, Array(np.ascontiguousarray(v))) for n, v in out.items()))
    return edit


def _set_value(v):
    def fn(a):
        a = a.copy()
        a.flat[0] = v
        return a
    return fn


def _all(fn):
    def edit(rec: ArrayRecord) -> ArrayRecord:
        return ArrayRecord(OrderedDict((n, Array(np.ascontiguousarray(fn(v.numpy())))) for n, v in rec.items()))
    return edit


def _drop_last(rec: ArrayRecord) -> ArrayRecord:
    keys = list(rec.keys())
    return ArrayRecord(OrderedDict((n, rec[n]) for n in keys[:-1]))


def _add_extra(rec: ArrayRecord) -> ArrayRecord:
    out = OrderedDict((n, rec[n]) for n in rec.keys())
    out["evil"] = Array(np.ones(3, np.float32))
    return ArrayRecord(out)


def _metrics(content: RecordDict):
    return [content.metric_records[k] for k in content.metric_records]


def _set_metric(name, value):
    def corrupt(content: RecordDict) -> None:
        for m in _metrics(content):
            if name in m:
                m[name] = value
    return corrupt


def _add_metric(content: RecordDict) -> None:
    for m in _metrics(content):
        m["evil"] = 1.0


def _del_metric(name):
    def corrupt(content: RecordDict) -> None:
        for m in _metrics(content):
            if name in m:
                del m[name]
    return corrupt


def _models(fn):
    return lambda content: _map_models(content, fn)


#: name -> (corruption of a reply's content, a word the refusal reason must contain)
CORRUPTIONS = {
    "nan-weight": (_models(_edit_first(_set_value(np.nan))), "non-finite"),
    "inf-weight": (_models(_edit_first(_set_value(np.inf))), "non-finite"),
    "huge-weights": (_models(_all(lambda a: a * 1e30 + (1e30 if a.dtype.kind == "f" else 0))), "beyond"),
    "shape-(1,)": (_models(_edit_first(lambda a: np.zeros(1, a.dtype))), "shape"),
    "transposed": (_models(_edit_first(lambda a: a.reshape(-1))), "shape"),
    "empty-tensor": (_models(_edit_first(lambda a: np.zeros(0, a.dtype))), "shape"),
    "float64": (_models(_all(lambda a: a.astype(np.float64) if a.dtype.kind == "f" else a)), "dtype"),
    "int32": (_models(_all(lambda a: a.astype(np.int32))), "dtype"),
    "missing-tensor": (_models(_drop_last), "missing"),
    "extra-tensor": (_models(_add_extra), "extra"),
    "empty-record": (_models(lambda rec: ArrayRecord()), "missing"),
    "negative-size": (_set_metric("num-examples", -299), "num-examples"),
    "zero-size": (_set_metric("num-examples", 0), "num-examples"),
    "huge-size": (_set_metric("num-examples", 10**15), "num-examples"),
    "fractional-size": (_set_metric("num-examples", 2.5), "num-examples"),
    "nan-size": (_set_metric("num-examples", math.nan), "num-examples"),
    "nan-loss": (_set_metric("train-loss", math.nan), "train-loss"),
    "extra-metric": (_add_metric, "evil"),
    "missing-size": (_del_metric("num-examples"), "num-examples"),
}


def _frags(field, value):
    def corrupt(content: RecordDict) -> None:
        for k in list(content.config_records):
            if k.startswith("frags."):
                rec = content.config_records[k]
                rec[field] = [value] * len(list(rec[field]))  # same length: only the values are wrong
    return corrupt


#: unlinkable-dfl: the fragment sends the coordinator acts on
FRAG_CORRUPTIONS = {
    "frag-index": (_frags("idx", 999), "index is outside"),
    "frag-destination": (_frags("dst", -1), "destination is not"),
    "frag-not-bytes": (_frags("fragments", 7), "bytes"),
}
CORRUPTIONS.update(FRAG_CORRUPTIONS)


def _planned(msg: Message) -> list[int]:
    cfg = msg.content.config_records.get("config")
    return [int(c) for c in cfg["client-ids"]] if cfg is not None and "client-ids" in cfg else []


class HostileHandler:
    """Call the study's ClientApp; forge the hostile client's train replies from the ``skip``-th on."""

    def __init__(self, client, mode: str, corruptions: list[str], skip: int = 0, is_train=None) -> None:
        self.client, self.mode, self.corruptions, self.skip = client, mode, corruptions, skip
        self.is_train = is_train or (lambda msg: len(msg.content.array_records) > 0)
        self.seen = 0
        self.forged: list[str] = []

    def __call__(self, node: int, msg: Message) -> Message:
        reply = self.client(msg, Context(1, node, {}, RecordDict(), {}))
        if HOSTILE not in _planned(msg) or reply.has_error() or not self.is_train(msg):
            return reply
        self.seen += 1
        if self.seen <= self.skip:
            return reply
        if self.mode == "baseline":  # refused by the plan check that predates the validator
            key = f"client.{HOSTILE}"
            if key in reply.content.array_records:
                reply.content[f"client.{HOSTILE + 100}"] = reply.content.array_records[key]
                del reply.content[key]
                return reply
            for m in _metrics(reply.content):
                if "client-ids" in m:
                    m["client-ids"] = [HOSTILE + 100]
                    return reply
            reply.content["info"] = __import__("flwr").app.ConfigRecord({"client-id": HOSTILE + 100})
            return reply
        name = self.corruptions[(self.seen - self.skip - 1) % len(self.corruptions)]
        CORRUPTIONS[name][0](reply.content)
        self.forged.append(name)
        return reply


def _cfg(tmp_path, **over):
    raw = {**RUN_CONFIG_DEFAULTS, "preset": "smoke", "results-dir": str(tmp_path), **over}
    return prepare(raw, given=[*over, "preset", "results-dir"])[1]


def _final_state(path) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in torch.load(path, weights_only=True).items()}


def _assert_same_finite(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if a[k].dtype.kind == "f":
            assert np.isfinite(a[k]).all(), k
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _refusals(summary: dict, forged: list[str]) -> None:
    """round_errors names one refusal of the hostile client per forged reply, with the reason's keyword."""
    rows = [r for r in summary["round_errors"] if HOSTILE in r.get("clients", [HOSTILE])]
    assert len(rows) >= len(forged), (rows, forged)
    for name in set(forged):
        word = CORRUPTIONS[name][1]
        assert any("rejected" in r["error"] and word in r["error"] for r in rows), (name, word, rows)


@pytest.fixture
def seed_file(tmp_path):
    p = tmp_path / "noise-seed"
    p.write_text("a1b2c3d4e5f6" * 4)
    return str(p)


DFL_CORRUPTIONS = [c for c in CORRUPTIONS if c not in FRAG_CORRUPTIONS]


@pytest.mark.parametrize("framework,dp", [("fl", False), ("fl", True), ("sequential-dfl", True)])
def test_dfl_dp_hostile_client_is_refused_and_changes_nothing(tmp_path, fake_grid_cls, seed_file, framework, dp):
    from flower_apps.dfl_dp import client_app
    from flower_apps.dfl_dp.server_app import run_dir, server_main

    rounds = len(DFL_CORRUPTIONS) if framework == "fl" and not dp else 5
    over = {"study": "dfl-dp", "framework": framework, "num-clients": 3, "num-rounds": rounds,
            "clients-per-message": 1, "noise-seed-file": seed_file, "local-epochs": 1, "data-fraction": 0.1}
    over.update({"dp": dp, "clip-norm": 1.0, "eps-cal": 2.0})
    finals, summaries, handlers = {}, {}, {}
    for mode in ("baseline", "forged"):
        corr = DFL_CORRUPTIONS if rounds == len(DFL_CORRUPTIONS) else DFL_CORRUPTIONS[::4]
        h = HostileHandler(client_app.train, mode, corr)
        cfg = _cfg(tmp_path / mode, **over)
        summaries[mode] = server_main(fake_grid_cls([1, 2, 3], lambda node, msg: h(node, msg)), cfg)  # noqa: B023 - runs within this iteration
        finals[mode], handlers[mode] = _final_state(run_dir(cfg) / "final_model.pt"), h
    assert handlers["forged"].forged, "no reply was forged"
    _assert_same_finite(finals["forged"], finals["baseline"])
    _refusals(summaries["forged"], handlers["forged"].forged)


def test_tabular_pdp_hostile_client_is_refused_in_every_setting(tmp_path, fake_grid_cls, seed_file):
    from flower_apps.router import client_app  # every tabular-pdp message type, routed as on a SuperNode
    from flower_apps.tabular_pdp.server_app import model_path, run_dir, server_main

    corr = [c for c in CORRUPTIONS if c not in FRAG_CORRUPTIONS]
    over = {"study": "tabular-pdp", "num-clients": 4, "num-rounds": 7, "local-epochs": 1,
            "tab-settings": "vanilla,gdp,pdp", "tab-drift-exclude": False, "noise-seed-file": seed_file}
    is_fit = lambda msg: msg.metadata.message_type == "train.tabular_pdp"
    out = {}
    for mode in ("baseline", "forged"):
        # the first two fits (drift detection, clip-norm estimate) stay honest, so the cohort is the same
        h = HostileHandler(lambda m, c: client_app(m, None), mode, corr, skip=2, is_train=is_fit)
        cfg = _cfg(tmp_path / mode, **over)
        summary = server_main(fake_grid_cls([1], lambda node, msg: h(node, msg)), cfg)  # noqa: B023 - runs within this iteration
        out[mode] = (h, summary, {s: _final_state(model_path(run_dir(cfg), s)) for s in ("vanilla", "gdp", "pdp")})
    h, summary, models = out["forged"]
    assert len(h.forged) == 3 * 7
    for setting in ("vanilla", "gdp", "pdp"):
        _assert_same_finite(models[setting], out["baseline"][2][setting])
    _refusals(summary, h.forged)


def test_ultrasound_hostile_client_is_refused_and_the_run_goes_on(tmp_path, fake_grid_cls):
    from flower_apps.ultrasound import client_app
    from flower_apps.ultrasound.server_app import run_dir, server_main

    corr = [c for c in CORRUPTIONS if c not in FRAG_CORRUPTIONS]
    over = {"study": "ultrasound", "dataset": "synthetic", "num-clients": 3, "num-rounds": len(corr),
            "local-epochs": 1, "data-fraction": 0.25, "us-image-size": 32, "us-pretrained": False}
    out = {}
    for mode in ("baseline", "forged"):
        h = HostileHandler(client_app.train, mode, corr)
        cfg = _cfg(tmp_path / mode, **over)
        summary = server_main(fake_grid_cls([1, 2, 3], lambda node, msg: h(node, msg)), cfg)  # noqa: B023 - runs within this iteration
        out[mode] = (h, summary, _final_state(run_dir(cfg) / "final_model.pt"))
    h, summary, model = out["forged"]
    assert h.forged == corr
    _assert_same_finite(model, out["baseline"][2])
    _refusals(summary, h.forged)


def test_unlinkable_dfl_hostile_node_sits_out_and_the_others_are_unchanged(tmp_path, fake_grid_cls):
    from flower_apps.common.results import read_jsonl
    from flower_apps.unlinkable_dfl import client_app
    from flower_apps.unlinkable_dfl.server_app import run_dir, server_main

    # Each node's model is its own state (not averaged by the coordinator), so NaN weights are the node's own
    # business there (docs: strategies/reply_rules.py); everything the coordinator acts on is checked.
    corr = ["shape-(1,)", "int32", "missing-tensor", "extra-tensor", "empty-record", "negative-size",
            "nan-size", *FRAG_CORRUPTIONS]
    over = {"study": "unlinkable-dfl", "num-clients": 4, "num-rounds": len(corr), "udfl-degree": 2,
            "clients-per-message": 1, "udfl-eval-samples": 50, "local-epochs": 1}
    is_train = lambda msg: str(msg.content["config"].get("phase", "")) == "train"
    out = {}
    for mode in ("baseline", "forged"):
        h = HostileHandler(lambda m, c: client_app.train(m, None), mode, corr, is_train=is_train)
        cfg = _cfg(tmp_path / mode, **over)
        summary = server_main(fake_grid_cls([1, 2, 3, 4], lambda node, msg: h(node, msg)), cfg)  # noqa: B023 - runs within this iteration
        out[mode] = (h, summary, [r["test_acc"] for r in read_jsonl(run_dir(cfg) / "rounds.jsonl")])
    h, summary, accs = out["forged"]
    assert h.forged == corr
    assert accs == out["baseline"][2] and all(np.isfinite(accs))
    _refusals(summary, h.forged)
