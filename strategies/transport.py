"""Message transport helpers around a Flower ``Grid``.

Flower's ``Grid.send_and_receive`` polls for replies every 100 ms (InMemoryGrid's
``pull_interval``). For token passing, where 100 messages are sent one after the other,
that polling alone would add seconds per round. These helpers push and pull through the
public ``push_messages``/``pull_messages`` API with a short, growing poll interval.
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
) -> list[Message]:
    """Push ``messages`` and collect replies until all arrived or ``timeout`` expired.

    Missing replies (timeout, node gone) are simply absent from the result; callers
    decide what that means (see the strategies' failure handling).
    """
    msg_ids = set(grid.push_messages(list(messages)))
    replies: list[Message] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    poll = min_poll
    while msg_ids:
        got = list(grid.pull_messages(msg_ids))
        if got:
            replies.extend(got)
            msg_ids.difference_update(m.metadata.reply_to_message_id for m in got)
            poll = min_poll
            continue
        if deadline is not None and time.monotonic() >= deadline:
            break
        time.sleep(poll)
        poll = min(poll * 1.5, max_poll)
    return replies
