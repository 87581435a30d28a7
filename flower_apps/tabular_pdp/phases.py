"""The tabular-pdp exchanges outside Flower's round loop: anonymize, harmonize, one local fit.

Each is one Flower message round (``train.tabular_pdp`` messages with a ``phase``), one
logical client per message, replies matched to clients by message id so that error
replies (which carry no content) are attributed too.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid

from flower_apps.tabular_pdp.config import ACTION, TabularPdpConfig
from privacy.anonymization import harmonize_levels, validate_levels
from strategies.cohorts import build_train_messages, plan_cohorts
from strategies.cohorts import exchange as cohort_exchange
from strategies.reply_rules import DEFAULT_RULES, ReplyRules

log = logging.getLogger("flwr")


def exchange(grid: Grid, client_ids: Sequence[int], arrays: ArrayRecord, config: ConfigRecord,
             timeout: float, rules: ReplyRules = DEFAULT_RULES) -> dict[int, Message | None]:
    """Send one message per client; client id -> its reply (an error reply if it failed or lied; None: none).

    Replies are matched to clients by the message they answer (strategies.cohorts), never by
    what they say, so error replies (which carry no content) are attributed too. A reply whose content
    breaks ``rules`` (strategies.reply_rules) comes back as an error reply naming why.
    """
    plan = plan_cohorts(list(client_ids), list(grid.get_node_ids()), 1)
    checked = cohort_exchange(grid, build_train_messages(plan, arrays, config, ACTION), timeout, array_claims="none",
                              rules=rules)
    return {c: checked.answer_of.get(c) for c in client_ids}


def anonymization_rules(cfg: TabularPdpConfig) -> ReplyRules:
    """What an anonymization reply must satisfy: k-anonymous at the run's k, so ARIREC <= 1/k (it sets PDP noise)."""

    def k_anonymous(reply: Message, planned: tuple[int, ...]) -> str | None:
        m = reply.content.metric_records.get("metrics")
        if m is None:
            return None  # a skipped client says why in its info record
        if "arirec" in m and float(m["arirec"]) > 1.0 / cfg.k * (1 + 1e-9):
            return f"arirec = {m['arirec']} exceeds 1/k = {1.0 / cfg.k:g} (a k-anonymous table has classes >= k)"
        if "k" in m and int(m["k"]) < cfg.k:
            return f"k = {m['k']} below the run's k = {cfg.k}"
        return None

    return ReplyRules(returns_model=False, content_check=k_anonymous)


def phase_config(cfg: TabularPdpConfig, phase: str, levels: Sequence[int] | None = None,
                 server_round: int = 0) -> ConfigRecord:
    rec = ConfigRecord({"run-config": cfg.to_json(), "phase": phase, "server-round": server_round})
    if levels is not None:
        rec["levels"] = [int(v) for v in levels]
    return rec


def _reason(reply: Message | None) -> str:
    if reply is None:
        return "no reply (timeout or node gone)"
    if reply.has_error():
        return f"client error: {reply.error.reason}"
    return str(reply.content["info"].get("reason", ""))


def _ok(reply: Message | None) -> bool:
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


def anonymize_and_harmonize(grid: Grid, cfg: TabularPdpConfig, client_ids: Sequence[int]) -> AnonymizationOutcome:
    """Round A: each client's own levels; server: element-wise max; round B: apply it and measure."""
    skipped: dict[int, str] = {}
    own: dict[int, dict] = {}
    regions: dict[int, str] = {}
    if cfg.levels is None:
        replies = exchange(grid, client_ids, ArrayRecord(), phase_config(cfg, "anonymize"), cfg.round_timeout,
                           anonymization_rules(cfg))
        for cid, r in replies.items():
            if _ok(r):
                m = r.content["metrics"]
                own[cid] = {"levels": [int(v) for v in m["levels"]], "suppressed": int(m["suppressed"]),
                            "n_records": int(m["n-records"])}
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
    replies = exchange(grid, todo, ArrayRecord(), phase_config(cfg, "harmonize", levels), cfg.round_timeout,
                       anonymization_rules(cfg))
    harmonized: dict[int, dict] = {}
    for cid, r in replies.items():
        if _ok(r):
            harmonized[cid] = {k.replace("-", "_"): v for k, v in r.content["metrics"].items()}
            regions[cid] = str(r.content["info"]["region"])
        else:
            skipped[cid] = _reason(r)
            log.warning("tabular-pdp: client %d skipped at harmonization: %s", cid, skipped[cid])
    return AnonymizationOutcome(levels, source, own, harmonized, regions, skipped)
