"""The tabular-pdp exchanges outside Flower's round loop: anonymize, harmonize, one local fit.

Each is one Flower message round, one logical client per message: the anonymize and harmonize
queries (``query.tabular_pdp``, the config's ``query`` naming which; they train nothing) and a
local fit (``train.tabular_pdp``). Replies are matched to clients by message id so that error
replies (which carry no content) are attributed too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeGuard, cast

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.serverapp import Grid

from flower_apps.common.node_data import query_config
from flower_apps.tabular_pdp.client_app import ANONYMIZE, HARMONIZE
from flower_apps.tabular_pdp.config import ACTION, TabularPdpConfig
from privacy.anonymization import harmonize_levels, validate_levels
from strategies.cohorts import build_messages, plan_cohorts
from strategies.cohorts import exchange as cohort_exchange
from strategies.records import int_list, number
from strategies.reply_rules import DEFAULT_RULES, ReplyRules

log = logging.getLogger("flwr")


def exchange(grid: Grid, client_ids: Sequence[int], arrays: ArrayRecord, config: ConfigRecord,
             timeout: float, rules: ReplyRules = DEFAULT_RULES, kind: str = MessageType.TRAIN,
             placement: Mapping[int, int] | None = None) -> dict[int, Message | None]:
    """Send one ``<kind>.tabular_pdp`` message per client; client id -> its reply (an error reply if it
    failed or lied; None: none).

    Replies are matched to clients by the message they answer (strategies.cohorts), never by
    what they say, so error replies (which carry no content) are attributed too. A reply whose content
    breaks ``rules`` (strategies.reply_rules) or whose type is not ``kind`` comes back as an error reply
    naming why. ``placement`` (node-local data): the node holding each client, where its message goes.
    """
    plan = plan_cohorts(list(client_ids), list(grid.get_node_ids()), 1, placement)
    checked = cohort_exchange(grid, build_messages(plan, arrays, config, ACTION, kind), timeout, array_claims="none",
                              rules=rules)
    return {c: checked.answer_of.get(c) for c in client_ids}


def anonymization_rules(cfg: TabularPdpConfig) -> ReplyRules:
    """What an anonymization reply must satisfy: k-anonymous at the run's k, so ARIREC <= 1/k (it sets PDP noise)."""

    def k_anonymous(reply: Message, planned: tuple[int, ...]) -> str | None:
        m = reply.content.metric_records.get("metrics")
        if m is None:
            return None  # a skipped client says why in its info record
        if "arirec" in m and float(number(m["arirec"])) > 1.0 / cfg.k * (1 + 1e-9):
            return f"arirec = {m['arirec']} exceeds 1/k = {1.0 / cfg.k:g} (a k-anonymous table has classes >= k)"
        if "k" in m and int(number(m["k"])) < cfg.k:
            return f"k = {m['k']} below the run's k = {cfg.k}"
        return None

    return ReplyRules(returns_model=False, content_check=k_anonymous)


def message_config(cfg: TabularPdpConfig, levels: Sequence[int] | None = None, server_round: int = 0) -> ConfigRecord:
    """The config every tabular-pdp message carries: the run config, the round, the harmonized levels."""
    rec = ConfigRecord({"run-config": cfg.to_json(), "server-round": server_round})
    if levels is not None:
        rec["levels"] = [int(v) for v in levels]
    return rec


def query(grid: Grid, cfg: TabularPdpConfig, client_ids: Sequence[int], name: str,
          levels: Sequence[int] | None = None, placement: Mapping[int, int] | None = None) -> dict[int, Message | None]:
    """The ``name`` query (anonymize or harmonize) to each client: client id -> its checked reply."""
    return exchange(grid, client_ids, ArrayRecord(), query_config(message_config(cfg, levels), name),
                    cfg.round_timeout, anonymization_rules(cfg), MessageType.QUERY, placement)


def _reason(reply: Message | None) -> str:
    if reply is None:
        return "no reply (timeout or node gone)"
    if reply.has_error():
        return f"client error: {reply.error.reason}"
    return str(reply.content["info"].get("reason", ""))


def _ok(reply: Message | None) -> TypeGuard[Message]:
    return reply is not None and not reply.has_error() and reply.content["info"]["status"] == "ok"


@dataclass
class AnonymizationOutcome:
    """What the two anonymization rounds produced (per client, by id)."""

    levels: tuple[int, ...]
    levels_source: str
    own: dict[int, dict]
    harmonized: dict[int, dict]
    regions: dict[int, str]
    skipped: dict[int, str]

    @property
    def active(self) -> list[int]:
        return sorted(self.harmonized)


def anonymize_and_harmonize(grid: Grid, cfg: TabularPdpConfig, client_ids: Sequence[int],
                            placement: Mapping[int, int] | None = None) -> AnonymizationOutcome:
    """Round A: each client's own levels; server: element-wise max; round B: apply it and measure.

    ``placement`` (node-local data): the node holding each client, where its queries go.
    """
    skipped: dict[int, str] = {}
    own: dict[int, dict] = {}
    regions: dict[int, str] = {}
    if cfg.levels is None:
        replies = query(grid, cfg, client_ids, ANONYMIZE, placement=placement)
        for cid, r in replies.items():
            if _ok(r):
                m = cast(MetricRecord, r.content["metrics"])  # typing only: a RecordDict item is any record
                own[cid] = {"levels": [int(v) for v in int_list(m["levels"])], "suppressed": int(number(m["suppressed"])),
                            "n_records": int(number(m["n-records"]))}
                regions[cid] = str(r.content["info"]["region"])
            else:
                skipped[cid] = _reason(r)
                if r is not None and not r.has_error():
                    regions[cid] = str(r.content["info"].get("region", ""))
        if not own:
            raise RuntimeError(f"k-anonymity (k={cfg.k}, suppression <= {cfg.suppression:g}) failed on every client: "
                               + "; ".join(f"client {c}: {why}" for c, why in sorted(skipped.items())))
        levels = harmonize_levels([v["levels"] for v in own.values()])
        source = f"element-wise maximum of {len(own)} clients' anjana levels"
    else:
        levels = validate_levels(cfg.levels)
        source = "fixed by tab-levels"
    for cid, why in skipped.items():
        log.warning("tabular-pdp: client %d skipped at anonymization: %s", cid, why)
    todo = [c for c in client_ids if c not in skipped]
    replies = query(grid, cfg, todo, HARMONIZE, levels, placement)
    harmonized: dict[int, dict] = {}
    for cid, r in replies.items():
        if _ok(r):
            harmonized[cid] = {k.replace("-", "_"): v for k, v in r.content["metrics"].items()}
            regions[cid] = str(r.content["info"]["region"])
        else:
            skipped[cid] = _reason(r)
            log.warning("tabular-pdp: client %d skipped at harmonization: %s", cid, skipped[cid])
    return AnonymizationOutcome(levels, source, own, harmonized, regions, skipped)
