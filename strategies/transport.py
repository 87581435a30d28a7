"""Message transport helpers around a Flower ``Grid``.

Flower's ``Grid.send_and_receive`` polls for replies every 100 ms (InMemoryGrid's
``pull_interval``). For token passing, where 100 messages are sent one after the other,
that polling alone would add seconds per round. These helpers push and pull through the
public ``push_messages``/``pull_messages`` API with a short poll interval that grows
geometrically from ``min_poll`` up to a cap set by what a pull costs.

The cap: a pull takes the grid's lock and checks every outstanding message, so its cost
grows with the number of messages in flight (~0.07 ms for one, ~1 ms for a hundred on the
2-core VM). Sleeping ``pull_cost / poll_budget`` between pulls keeps polling near
``poll_budget`` of one core, whatever the fan-out. For a relay hop (one message) that is a
~1.5 ms interval, so a reply waits ~1 ms on average to be seen (a fixed 20 ms cap cost ~10 ms
per hop); for a 100-message broadcast the interval stays near the 20 ms ``max_poll``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from flwr.app import Message
from flwr.serverapp import Grid


def send_and_receive(
    grid: Grid,
    messages: Iterable[Message],
    timeout: float | None = None,
    min_poll: float = 0.0005,
    max_poll: float = 0.02,
    poll_budget: float = 0.05,
) -> list[Message]:
    """Push ``messages`` and collect replies until all arrived or ``timeout`` expired.

    Missing replies (timeout, node gone) are simply absent from the result; callers
    decide what that means (see the strategies' failure handling).

    Parameters
    ----------
    min_poll, max_poll : bounds of the sleep between two pulls (seconds).
    poll_budget : fraction of one core the pulls may use while waiting; sets the interval's cap.
    """
    if not 0 < poll_budget <= 1:
        raise ValueError(f"poll_budget must be in (0, 1], got {poll_budget}")
    if not 0 < min_poll <= max_poll:
        raise ValueError(f"need 0 < min_poll <= max_poll, got {min_poll}, {max_poll}")
    messages = list(messages)
    if not messages:  # an empty sampled cohort: nothing to push, nothing to wait for
        return []
    msg_ids = set(grid.push_messages(messages))
    replies: list[Message] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    poll = min_poll
    while msg_ids:
        t0 = time.perf_counter()
        got = list(grid.pull_messages(msg_ids))
        pull_cost = time.perf_counter() - t0
        if got:
            replies.extend(got)
            msg_ids.difference_update(m.metadata.reply_to_message_id for m in got)
            poll = min_poll
            continue
        if deadline is not None and time.monotonic() >= deadline:
            break
        time.sleep(poll)
        poll = min(poll * 1.5, max(min_poll, min(max_poll, pull_cost / poll_budget)))
    return replies
