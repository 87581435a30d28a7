"""Node-local data in a deployment: ask each SuperNode which logical clients it holds, address them there.

With ``node-local-data = true`` a SuperNode started with ``--node-config "data-path='...'"``
reads only that folder (:mod:`datasets.node_local`). The server cannot know which node holds
which logical clients, so before the first round it sends every node one *describe* query
(``query.<action>`` with ``query = describe-node-data`` in its config; each study's ClientApp
registers a query handler). A node answers with the client ids, sizes and label counts of its
folder, or an error reply naming itself and the problem. The answers give the placement
(logical client -> node id, :attr:`Discovery.placement`): the explicit plan the strategies and
exchanges build their messages from (``strategies.cohorts.plan_cohorts(..., placement=...)``),
so each message goes to the node that holds its ``client-ids``.

Query messages name their query in the config's ``query`` key (:func:`query_name`): one message
type (``query``) has several kinds in one study (tabular-pdp's describe, anonymize, harmonize),
and Flower's ``<type>.<action>`` leaves one action per study.

Whom it protects: an institution's records never leave its node; what the coordinator learns
is what the protocol sends plus the sizes and label counts of the describe reply (the same
statistics the simulation writes to ``class_counts.csv``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Error, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from datasets.base import DataError
from strategies.cohorts import wait_for_nodes
from strategies.transport import send_and_receive

log = logging.getLogger("flwr")

DATA_PATH = "data-path"  # --node-config key: the node's data folder
NODE_NAME = "node-name"  # --node-config key: how the node is named in errors and in the run summary
QUERY = "query"  # config key of a query.<action> message: which query it is
DESCRIBE = "describe-node-data"  # the describe query: which logical clients a node holds
NODE_DATA_ERROR = 902  # Error code of a node whose data is missing or malformed


def _node_config(context: Context | None) -> dict:
    return {} if context is None else dict(context.node_config)  # None: a handler called directly (tests)


def node_name(context: Context | None) -> str:
    """The node's ``node-name`` (node config), else ``node <id>``."""
    if context is None:
        return "this node"
    return str(context.node_config.get(NODE_NAME) or f"node {context.node_id}")


def node_data_path(context: Context | None, node_local: bool) -> Path | None:
    """The node's ``data-path`` when the run uses node-local data, else None (simulation).

    A node that holds a data-path serves only that folder: a run that would make it load a
    global dataset is refused, and a node-local run on a node without data-path too.
    """
    raw = _node_config(context).get(DATA_PATH)
    path = Path(str(raw)) if raw not in (None, "") else None
    if node_local and path is None:
        raise DataError(f"{node_name(context)}: the run sets node-local-data=true but this SuperNode has no "
                        f"data-path (start it with --node-config \"{DATA_PATH}='/path/to/folder'\")")
    if not node_local and path is not None:
        raise DataError(f"{node_name(context)}: this SuperNode serves only its data-path '{path}'; the run must "
                        "set node-local-data=true")
    return path


def query_name(msg: Message, allowed: Iterable[str]) -> str:
    """The query a ``query.<action>`` message asks (its config's ``query``); ValueError unless in ``allowed``."""
    name = str(msg.content["config"].get(QUERY, ""))
    if name not in set(allowed):
        raise ValueError(f"{msg.metadata.message_type} message asks for query {name!r}; allowed: {sorted(allowed)}")
    return name


def query_config(config: ConfigRecord, name: str) -> ConfigRecord:
    """``config`` with the query's name (what :func:`query_name` reads on the node)."""
    return ConfigRecord({**dict(config), QUERY: name})


def describe_reply(msg: Message, name: str, sizes: Mapping[int, int],
                   label_counts: Mapping[int, list[int]] | None = None) -> Message:
    """The node's answer to the describe query: its clients, their sizes and label counts."""
    ids = sorted(sizes)
    rec = ConfigRecord({"node": name, "client-ids": ids, "sizes": [int(sizes[c]) for c in ids]})
    if label_counts:
        rec["num-classes"] = len(next(iter(label_counts.values())))
        rec["label-counts"] = [int(v) for c in ids for v in label_counts[c]]
    return Message(RecordDict({"node-data": rec}), reply_to=msg)


def error_reply(msg: Message, name: str, exc: Exception) -> Message:
    """An error reply naming the node (the server counts it as a failed node and records why).

    The same line goes to this node's own log (the SuperNode's output, where its ClientApps log): the site
    whose folder is missing or unreadable sees why in its own log, not only in the coordinator's summary."""
    text = str(exc)
    reason = text if name in text else f"{name}: {text}"
    log.error("node-local data refused (%s): %s", msg.metadata.message_type, reason)
    return Message(Error(NODE_DATA_ERROR, reason), reply_to=msg)


@dataclass
class Discovery:
    """What the describe round found: who holds which clients, and which nodes failed."""

    placement: dict[int, int] = field(default_factory=dict)  # logical client -> node id
    nodes: dict[int, dict] = field(default_factory=dict)  # node id -> {"node", "client-ids", "sizes", ...}
    errors: dict[int, str] = field(default_factory=dict)  # node id -> why it holds nothing usable

    @property
    def client_ids(self) -> list[int]:
        return sorted(self.placement)

    def sizes(self) -> dict[int, int]:
        return {c: s for n in self.nodes.values() for c, s in zip(n["client-ids"], n["sizes"])}

    def label_counts(self) -> dict[int, list[int]]:
        out = {}
        for n in self.nodes.values():
            k = int(n.get("num-classes", 0))
            flat = list(n.get("label-counts", []))
            for i, c in enumerate(n["client-ids"]):
                out[c] = flat[i * k:(i + 1) * k]
        return out

    def summary(self, expected: Iterable[int]) -> dict:
        """What summary.json records: the nodes, their clients, the failed nodes, the missing clients."""
        missing = sorted(set(expected) - set(self.placement))
        return {"node_local_data": True,
                "nodes": [{"node_id": nid, "node": n["node"], "client_ids": list(n["client-ids"]),
                           "sizes": list(n["sizes"])} for nid, n in sorted(self.nodes.items())],
                "node_errors": [{"node_id": nid, "error": e} for nid, e in sorted(self.errors.items())],
                "missing_clients": missing}


def discover(grid: Grid, action: str, config: ConfigRecord, timeout: float, num_clients: int) -> Discovery:
    """Send the describe query (``query.<action>``) to every connected node and build the placement.

    A node that replies with an error (its data is missing or malformed), with a reply of another
    message type, or not at all is recorded in ``errors`` and holds no client: the run goes on
    without it, as without a dead node. Raises :class:`DataError` when no node holds usable data,
    when two nodes claim the same client, or when a node claims a client id outside ``[0, num_clients)``.
    """
    nodes = wait_for_nodes(grid, 1)
    cfg = query_config(ConfigRecord({**dict(config), "server-round": 0}), DESCRIBE)
    kind = f"{MessageType.QUERY}.{action}"
    msgs = [Message(RecordDict({"config": cfg}), message_type=kind, dst_node_id=n) for n in nodes]
    replies = send_and_receive(grid, msgs, timeout=timeout)
    out = Discovery()
    answered = set()
    for r in sorted(replies, key=lambda r: r.metadata.src_node_id):  # arrival order must not matter
        nid = r.metadata.src_node_id
        answered.add(nid)
        if r.has_error():
            out.errors[nid] = str(r.error.reason)
            log.warning("node %d holds no usable data: %s", nid, r.error.reason)
            continue
        if r.metadata.message_type != kind:  # Flower copies the type into a reply; a client can rewrite it
            out.errors[nid] = f"node {nid}: a {r.metadata.message_type!r} reply to the {kind!r} describe query"
            log.warning("node %d refused: %s", nid, out.errors[nid])
            continue
        rec = r.content["node-data"]
        info: dict[str, Any] = {k: (list(v) if isinstance(v, list) else v) for k, v in rec.items()}
        for c in info["client-ids"]:
            if not 0 <= int(c) < num_clients:
                raise DataError(f"{info['node']} (node id {nid}) holds client {c}, outside "
                                f"[0, num-clients={num_clients})")
            if c in out.placement:
                first = out.placement[c]
                raise DataError(f"client {c} is held by two nodes: {out.nodes[first]['node']} (node id {first}) "
                                f"and {info['node']} (node id {nid}); each SuperNode's data-path must hold its "
                                "own clients (check their --node-config)")
            out.placement[int(c)] = nid
        out.nodes[nid] = info
    for nid in set(nodes) - answered:
        out.errors[nid] = f"node {nid}: no reply to the describe query within {timeout:g}s"
    if not out.placement:
        raise DataError("no SuperNode holds usable node-local data: "
                        + "; ".join(out.errors.values() or ["no node answered"]))
    log.info("node-local data: %d clients on %d nodes (%d failed)", len(out.placement), len(out.nodes),
             len(out.errors))
    return out


@dataclass
class ImageNode:
    """An images-npz node folder as normalized tensors per logical client (dfl-dp, unlinkable-dfl ClientApps)."""

    node: str
    num_classes: int
    image_shape: tuple[int, int, int]
    x: dict  # logical client -> normalized images (torch.Tensor)
    y: dict  # logical client -> labels (torch.Tensor)

    def sizes(self) -> dict[int, int]:
        return {c: len(v) for c, v in self.y.items()}

    def label_counts(self) -> dict[int, list[int]]:
        import numpy as np

        return {c: np.bincount(v.numpy(), minlength=self.num_classes).tolist() for c, v in self.y.items()}


def image_shape(x) -> tuple[int, int, int]:
    """(C, H, W) of a uint8 image array (n, H, W) or (n, H, W, C)."""
    s = x.shape[1:]
    return (1, s[0], s[1]) if len(s) == 2 else (s[2], s[0], s[1])


def read_image_node(data_path: str, study: str, node: str) -> tuple[ImageNode, dict]:
    """``<data-path>[/<study>]/node.json`` (images-npz) as an :class:`ImageNode`, plus the raw clients read.

    Raises NodeDataError (a DataError) when the folder is unusable, naming the node and the file.
    """
    import torch

    from datasets.node_local import image_meta, node_folder, read_image_clients, read_manifest
    from datasets.transforms import normalize_images

    m = read_manifest(node_folder(data_path, study), "images-npz", node)
    raw = read_image_clients(m)
    num_classes, mean, std = image_meta(m)
    return ImageNode(m.node, num_classes, image_shape(next(iter(raw.values())).x),
                     {c: normalize_images(v.x, mean, std) for c, v in raw.items()},
                     {c: torch.from_numpy(v.y) for c, v in raw.items()}), raw


class RoundErrors:
    """Every error reply of a run, per round, for ``summary.json`` (not only the logs).

    A node whose data turns unusable mid-run (or whose ClientApp fails) replies with an error;
    the strategies count it as a failed client and go on. This keeps *who* and *why*:
    ``rows`` are ``{"round", "node_id", "error"}`` (plus ``clients`` when the server knows which
logical clients the failed message asked for), in arrival-independent order.
    """

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def record(self, server_round: int, replies: Iterable[Message]) -> None:
        """Keep the error replies among ``replies`` (valid replies are ignored)."""
        rows = []
        for r in replies:
            if r.has_error():
                # an error reply has no content: the node and its reason are what it says
                rows.append({"round": int(server_round), "node_id": int(r.metadata.src_node_id),
                             "error": str(r.error.reason)})
        self.rows += sorted(rows, key=lambda row: (row["node_id"], row["error"]))

    def record_problems(self, server_round: int, problem_of: Mapping[int, str], node_of: Mapping[int, int]) -> None:
        """Keep a checked exchange's ``problem_of`` (logical client -> why), grouped by node and reason."""
        grouped: dict[tuple[int, str], list[int]] = {}
        for c, why in sorted(problem_of.items()):
            grouped.setdefault((int(node_of.get(c, -1)), why), []).append(int(c))
        self.rows += [{"round": int(server_round), "node_id": n, "clients": cs, "error": why}
                      for (n, why), cs in sorted(grouped.items())]

    def summary(self) -> dict:
        return {"round_errors": list(self.rows)}

