"""Recording what the gradient-inversion adversary sees, during training (issue: attacks).

Threat model (seed paper, Sec. 4.2; not the formal round-end release): for ``capture-victims``
clients (a seeded choice), in round ``attack-round`` (default: the last), the client takes
one example from its *first local minibatch* and computes that example's gradient at the
model state it holds immediately before its local update. The reply carries the gradient,
that model state and the example's index; the ServerApp stores them in ``victims.pt``.
Nothing is captured (and nothing slows down) when ``capture-victims`` is 0.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from attacks.inversion.view import capture_single_example_gradient, trainable_parameters
from registry import streams
from strategies.records import number

GRAD_PREFIX, STATE_PREFIX, META_PREFIX = "victim-grad.", "victim-state.", "victim-meta."


def victim_clients(seed: int, num_clients: int, count: int) -> list[int]:
    """The clients whose gradients are captured (seeded, distinct, sorted)."""
    if count <= 0:
        return []
    return sorted(int(c) for c in streams.rng("dfl-dp.victims", seed).choice(num_clients, count, replace=False))


def capture(out: RecordDict, cid: int, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
            first_batch: torch.Tensor, part_index: np.ndarray) -> None:
    """Add one victim record for client ``cid`` to the reply ``out`` (before its local update)."""
    i = int(first_batch[0])  # the first example of the first local minibatch
    device = next(model.parameters()).device
    grad = capture_single_example_gradient(model, x[i : i + 1].to(device), int(y[i]))
    names = [n for n, _ in trainable_parameters(model)]
    out[f"{GRAD_PREFIX}{cid}"] = ArrayRecord({n: Array(g.cpu().numpy()) for n, g in zip(names, grad)})
    out[f"{STATE_PREFIX}{cid}"] = ArrayRecord({k: Array(v.detach().cpu().numpy().copy())
                                               for k, v in model.state_dict().items()})
    out[f"{META_PREFIX}{cid}"] = ConfigRecord({"index": int(part_index[i]), "label": int(y[i])})


def extract(replies: list[Message]) -> list[dict]:
    """Victim records in the replies (client, index into the train part, label, state, gradient)."""
    found = []
    for reply in replies:
        if reply.has_error():
            continue
        c = reply.content
        for key in list(c.config_records):
            if not key.startswith(META_PREFIX):
                continue
            # A reply is validated before this runs (strategies.reply_rules), but a victim record is a side
            # channel: one that is incomplete or not numeric is skipped, never allowed to end the run.
            try:
                cid = int(key[len(META_PREFIX):])
                meta = c.config_records[key]
                grad = c.array_records[f"{GRAD_PREFIX}{cid}"]
                state = c.array_records[f"{STATE_PREFIX}{cid}"]
                index, label = int(number(meta["index"])), int(number(meta["label"]))
            except (KeyError, ValueError, TypeError):
                continue
            found.append({
                "client": cid, "index": index, "label": label,
                "gradient": [torch.from_numpy(v.numpy().copy()) for v in grad.values()],
                "gradient_names": list(grad.keys()),
                "state": {k: torch.from_numpy(v.numpy().copy()) for k, v in state.items()},
            })
    return sorted(found, key=lambda r: r["client"])


def save(records: list[dict], path: Path) -> None:
    """Atomically write the victim records."""
    import io

    from flower_apps.common.results import atomic_write_bytes

    buf = io.BytesIO()
    torch.save(records, buf)
    atomic_write_bytes(path, buf.getvalue())
