"""Run one node in the foreground until SIGINT or SIGTERM (or `p2pnode stop`)."""

from __future__ import annotations

import logging
import signal

import trio

from .config import Config
from .memory import limit_arenas
from .node import Node, NodeStartError

__all__ = ["run_until_signalled"]

log = logging.getLogger("p2pnode.runner")


async def _serve(node: Node) -> None:
    # The receiver is open before the node starts: a signal during start-up stops it cleanly
    # instead of raising KeyboardInterrupt somewhere inside.
    failed: NodeStartError | None = None
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:

        async def watch() -> None:
            async for signum in signals:
                log.info("%s received: shutting down", signal.Signals(signum).name)
                node.request_stop()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            try:
                await node.run()
            except NodeStartError as exc:  # kept out of the nursery: raised as itself, not in a group
                failed = exc
            nursery.cancel_scope.cancel()
    if failed is not None:
        raise failed


def run_until_signalled(config: Config) -> None:
    """Raises NodeStartError, naming every problem, if the node cannot start."""
    limit_arenas(config.node.malloc_arenas)  # before the node's threads start (docs/daemon.md, "Memory")
    trio.run(_serve, Node(config))
