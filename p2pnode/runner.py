"""Run one node in the foreground until SIGINT or SIGTERM (or `p2pnode stop`)."""

from __future__ import annotations

import logging
import signal

import trio

from .config import Config
from .node import Node, NodeStartError

__all__ = ["run_until_signalled"]

log = logging.getLogger("p2pnode.runner")


async def _serve(node: Node) -> None:
    # The receiver is open before the node starts: a signal during start-up stops it cleanly
    # instead of raising KeyboardInterrupt somewhere inside.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:

        async def watch() -> None:
            async for signum in signals:
                log.info("%s received: shutting down", signal.Signals(signum).name)
                node.request_stop()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await node.run()
            nursery.cancel_scope.cancel()


def run_until_signalled(config: Config) -> None:
    """Raises NodeStartError if the node cannot start."""
    try:
        trio.run(_serve, Node(config))
    except* NodeStartError as group:
        first = group
        while isinstance(first, BaseExceptionGroup):  # nurseries nest their groups
            first = first.exceptions[0]
        raise first from None
