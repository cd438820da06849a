"""The checks of a configuration once every section has loaded on its own: each section's own rules
(its settings class's `check`, beside its declarations: wire/settings.py, discovery/settings.py,
learning/settings.py, operations/settings.py, and sections.py for [node]), then the rules that
need two or more sections, which no one section can check and which alone live here:

- a `[discovery].bootstrap` entry names its peer's key when `[security].curve` is on;
- `[transport]`'s buffers hold the largest frames `[limits]` lets through;
- `[node].capabilities` leave HELLO room for the node's own tokens (its algorithm, labels and roles);
- `[relay].enabled` is not for a client node;
- `[algorithm].start_peers` fits in `[discovery].max_peers`;
- the rules of `[data]`, `[model]` and `[algorithm]` that read files or import the learning stack
  apply to a node whose `[algorithm].name` learns (CheckContext.learns).

A problem here names every field it involves."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from protocol.messages import MAX_CAPABILITIES

from ..options import CheckContext, split_bootstrap
from .sections import SECTIONS, Config


def check_config(config: Config, raw: Mapping[str, Any], base: Path, check_learning: bool = True) -> list[str]:
    """Every problem of a configuration whose sections each loaded: `raw` the file's tables (a rule
    may be about giving a key at all), `base` its folder; `check_learning=False` skips the rules
    that import the learning stack or list `[data].path`."""
    learns = check_learning and config.algorithm.name != "none"
    problems = []
    for name in SECTIONS:
        context = CheckContext(given=frozenset(raw.get(name, {})), base=base, learns=learns)
        problems += getattr(config, name).check(context)
    return problems + cross_checks(config, learns)


def cross_checks(config: Config, learns: bool) -> list[str]:
    problems = _curve_checks(config) + _buffer_checks(config)
    problems += _capability_checks(config)
    algorithm, max_peers = config.algorithm, config.discovery.max_peers
    if learns and algorithm.start_peers > max_peers:
        problems.append(
            f"[algorithm].start_peers: must not exceed [discovery].max_peers ({max_peers}), "
            f"got {algorithm.start_peers}: the first round would wait start_timeout_s for peers the table cannot hold"
        )
    return problems


def _capability_checks(config: Config) -> list[str]:
    """HELLO carries 32 capability tokens: the configured ones and the node's own (discovery/hello.py)."""
    own = {
        "algorithm:<name>": config.algorithm.name != "none",
        "labels:<fingerprint>": config.data.path is not None,
        "client": config.node.client_mode,
        "relay": config.relay.enabled,
    }
    added = [token for token, adds in own.items() if adds]
    problems = []
    if len(config.node.capabilities) + len(added) > MAX_CAPABILITIES:
        problems.append(
            f"[node].capabilities: at most {MAX_CAPABILITIES - len(added)} here, got {len(config.node.capabilities)}: "
            f"HELLO carries {MAX_CAPABILITIES} and [algorithm].name, [data].path, [node].client_mode and "
            f"[relay].enabled add the node's own ({', '.join(added)})"
        )
    if config.relay.enabled and config.node.client_mode:
        problems.append("[relay].enabled: a client node ([node].client_mode) cannot be dialled: it relays for nobody")
    return problems


def _buffer_checks(config: Config) -> list[str]:
    """What ZeroMQ may hold per socket must leave room for the largest frames it takes."""
    t, limits = config.transport, config.limits
    problems = []
    if t.max_public_buffered_bytes < 2 * limits.max_public_frame_bytes:
        problems.append(
            "[transport].max_public_buffered_bytes: must be at least 2 × [limits].max_public_frame_bytes "
            f"({2 * limits.max_public_frame_bytes}), got {t.max_public_buffered_bytes}"
        )
    if t.max_peers_buffered_bytes < limits.max_frame_bytes:
        problems.append(
            "[transport].max_peers_buffered_bytes: must be at least [limits].max_frame_bytes "
            f"({limits.max_frame_bytes}): a frame that large would never get through, got {t.max_peers_buffered_bytes}"
        )
    return problems


def _curve_checks(config: Config) -> list[str]:
    """With CURVE a dial needs the peer's key: the server key is derived from it (whether a named
    key is one: `DiscoverySettings.check`)."""
    if not config.security.curve:
        return []
    problems = []
    for index, entry in enumerate(config.discovery.bootstrap, start=1):
        address, key = split_bootstrap(entry)
        if key is None:
            problems.append(
                f"[discovery].bootstrap: entry {index} ({address}) names no key: connections are encrypted "
                f'([security].curve, on by default), so it must be "KEY@{address}", KEY the public_key '
                "that `p2pnode keyinfo PEER_KEY_FILE` prints on that peer's host (or `p2pnode init` writes "
                "a fleet's configs with them); [security] curve = false goes without, for a closed network only"
            )
    return problems
