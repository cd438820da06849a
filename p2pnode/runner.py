"""Run one node in the foreground until SIGINT or SIGTERM (or `p2pnode stop`)."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable

import trio

from .config import Config
from .exits import EXIT_FAILED, EXIT_USAGE
from .memory import limit_arenas
from .node import Node, NodeStartError

__all__ = ["run_until_signalled", "start", "StartFailed"]


class StartFailed(Exception):
    """The node could not start: a bad config (exit 2), or what `NodeStartError` names (exit 1)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def start(config_path: str, make_node: Callable[[Config], Node] = Node) -> None:
    """`p2pnode start`: load the config, log as it says, and run `make_node(config)` until
    signalled. Raises StartFailed."""
    from .config import ConfigError, load_config
    from .files import describe_os_error
    from .operations.logs import configure_logging

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise StartFailed(str(exc), EXIT_USAGE) from None
    try:
        configure_logging(config.log, config.identity.node_id)
    except OSError as exc:
        raise StartFailed(f"[log].file: cannot open {config.log.file}: {describe_os_error(exc)}", EXIT_FAILED) from None
    try:
        run_until_signalled(config, make_node)
    except NodeStartError as exc:
        raise StartFailed(str(exc), EXIT_FAILED) from None


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


def run_until_signalled(config: Config, make_node: Callable[[Config], Node] = Node) -> None:
    """Raises NodeStartError, naming every problem, if the node cannot start. `make_node`: the
    node (a rehearsal's Byzantine node, testnet/launch/byzantine.py, is one)."""
    limit_arenas(config.node.malloc_arenas)  # before the node's threads start (docs/daemon.md, "Memory")
    trio.run(_serve, make_node(config))
