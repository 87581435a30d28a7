"""Keep Ray's "metrics exporter agent" notices out of a driver's console (issue 41, item 9).

Ray 2.55's GCS and every raylet try to reach a *metrics agent* once they start; that agent is part of the
dashboard agent, which only ``ray[default]`` installs. This project installs plain ``ray`` (via
``flwr[simulation]``) on purpose: the dashboard agent and dashboard open further HTTP / gRPC ports
(the dashboard's job-submission API runs code for whoever reaches it), see docs/deployment.md.
Each cluster process then logs one ERROR line, ``Failed to establish connection to the (event+)metrics
exporter agent ...``, and Ray's log monitor forwards the ``gcs_server*.err`` / ``raylet*.err`` lines to
every attached driver: a sweep on a cluster printed them into its output (ray-project/ray#59665 is open
upstream). Measured with Ray 2.55.1: neither ``RAY_enable_metrics_collection=0`` nor
``RAY_enable_ray_event=0`` in the ``ray start`` environment stops them.

:func:`hide_metrics_agent_notices` filters exactly those lines from what reaches this process's console
(every other forwarded line, an actor's output or a raylet crash included, passes unchanged) and logs
once how many it hid. The cluster's own log files keep them. It wraps the ``emit`` of Ray's driver-side
log dispatcher (``ray._private.ray_logging.global_worker_stdstream_dispatcher``, the one object every
forwarded batch passes through); with a Ray that lacks it, nothing is changed and it says so.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

NOTICE = re.compile(r"Failed to establish connection to the (event\+)?metrics exporter agent")
MARK = "_ppfl_hides_metrics_agent_notices"

log = logging.getLogger("flwr")
hidden = {"lines": 0}


def without_notices(batch: dict[str, Any]) -> dict[str, Any] | None:
    """``batch`` (Ray's forwarded-log dict, its text in ``lines``) without the metrics-agent notices;
    None when nothing else was in it."""
    lines = batch.get("lines")
    if not isinstance(lines, list):
        return batch
    kept = [line for line in lines if not (isinstance(line, str) and NOTICE.search(line))]
    if len(kept) == len(lines):
        return batch
    dropped = len(lines) - len(kept)
    if hidden["lines"] == 0:
        log.info("Ray metrics-exporter notices hidden from this console (no metrics agent without "
                 "ray[default]; the cluster's log files keep them; docs/deployment.md)")
    hidden["lines"] += dropped
    return {**batch, "lines": kept} if kept else None


def hide_metrics_agent_notices(only_if_imported: bool = True) -> bool:
    """Install the filter on this process's Ray log dispatcher; True when it is installed.

    ``only_if_imported``: do nothing unless ``ray`` is already imported (a deployed ServerApp never
    imports Ray for this).
    """
    if only_if_imported and "ray" not in sys.modules:
        return False
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:
        log.debug("this Ray has no global_worker_stdstream_dispatcher: its metrics-agent notices stay visible")
        return False
    if getattr(dispatcher, MARK, False):
        return True
    emit = dispatcher.emit

    def emit_without_notices(data: dict[str, Any]) -> None:
        kept = without_notices(data)
        if kept is not None:
            emit(kept)

    dispatcher.emit = emit_without_notices  # type: ignore[method-assign]  # the one seam every forwarded batch passes
    setattr(dispatcher, MARK, True)
    return True
