"""The checks across sections of a configuration, run once every section has loaded on its own
(a problem here names every field it involves)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

# Names only: the data modules import numpy (15 MB), which a node that learns nothing never needs.
from algorithms.catalog import (
    DATASET_FROM_PATH,
    FLOAT32_ONLY_DEVICES,
)
from protocol import check_network_id
from protocol.curve import curve_public_from_ed25519

from ..options import split_bootstrap
from ..wire.settings import HANDSHAKE_KINDS, LimitSettings, TransportSettings

if TYPE_CHECKING:
    from .sections import Config


_MAX_UNIX_SOCKET_PATH = 107  # sun_path is 108 bytes on Linux, one for the terminating NUL


def cross_checks(config: Config, check_learning: bool = True) -> list[str]:
    problems = []
    d = config.discovery
    if d.peer_timeout_s <= 2 * d.ping_interval_s:
        problems.append(
            "[discovery].peer_timeout_s: must exceed 2 × ping_interval_s "
            f"({2 * d.ping_interval_s:g}), got {d.peer_timeout_s:g}"
        )
    if d.hello_max_age_s <= d.hello_refresh_s:
        problems.append(
            "[discovery].hello_max_age_s: must exceed hello_refresh_s "
            f"({d.hello_refresh_s:g}), got {d.hello_max_age_s:g}"
        )
    if d.dial_retry_max_s < d.dial_retry_initial_s:
        problems.append("[discovery].dial_retry_max_s: must not be below dial_retry_initial_s")
    node = config.node
    wildcard = node.listen.startswith(("tcp://*:", "tcp://0.0.0.0:", "tcp://[::]:"))
    if node.advertise is None and wildcard:
        problems.append(
            "[node].advertise: required when listen binds all "
            f"interfaces ({node.listen}): say how peers reach this node"
        )
    socket_path = str(config.control_socket)
    if len(socket_path.encode()) > _MAX_UNIX_SOCKET_PATH:
        problems.append(
            "[node].data_dir: path too long for the control socket "
            f"({socket_path!r} has more than {_MAX_UNIX_SOCKET_PATH} bytes)"
        )
    beacon = config.beacon
    try:
        if not ipaddress.IPv4Address(beacon.group).is_multicast:
            problems.append(f"[beacon].group: {beacon.group} is not a multicast address (224.0.0.0/4)")
    except ValueError:
        problems.append(f"[beacon].group: {beacon.group!r} is not an IPv4 address")
    try:
        ipaddress.IPv4Address(beacon.interface)
    except ValueError:
        problems.append(f"[beacon].interface: {beacon.interface!r} is not an IPv4 address")
    if config.metrics.host_port is not None and config.metrics.host_port[1] > 65535:
        problems.append(f"[metrics].listen: port {config.metrics.host_port[1]} is not a usable port")
    problems += _curve_checks(config)
    if config.security.allowlist == ():
        problems.append("[security].allowlist: an empty list would refuse every peer; omit the key to accept any key")
    try:
        check_network_id(node.network)
    except ValueError as exc:
        problems.append(f"[node].network: {exc}")
    problems += _limit_checks(config.limits) + _transport_checks(config.transport) + _buffer_checks(config)
    return problems + (_learning_checks(config) + _model_checks(config) if check_learning else [])


def _limit_checks(limits: LimitSettings) -> list[str]:
    problems = []
    for kind, size in limits.frame_bytes.items():
        if size > limits.max_frame_bytes:
            problems.append(
                f"[limits].frame_bytes: {kind.value} bound {size} exceeds max_frame_bytes {limits.max_frame_bytes}"
            )
    handshake_bytes = max(limits.limits().max_frame_bytes_for(kind) for kind in HANDSHAKE_KINDS)
    if not handshake_bytes <= limits.max_public_frame_bytes <= limits.max_frame_bytes:
        problems.append(
            f"[limits].max_public_frame_bytes: must lie between the largest handshake frame "
            f"({handshake_bytes}) and max_frame_bytes ({limits.max_frame_bytes})"
        )
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


def _transport_checks(t: TransportSettings) -> list[str]:
    problems = []
    if 0 < t.reconnect_ivl_max_ms < t.reconnect_ivl_ms:
        problems.append(  # ZeroMQ would ignore it silently
            "[transport].reconnect_ivl_max_ms: must be 0 (no backoff) or at least reconnect_ivl_ms "
            f"({t.reconnect_ivl_ms}), got {t.reconnect_ivl_max_ms}"
        )
    return problems


def _curve_checks(config: Config) -> list[str]:
    """With CURVE a dial needs the peer's key: the server key is derived from it."""
    problems = []
    for index, entry in enumerate(config.discovery.bootstrap, start=1):
        address, key = split_bootstrap(entry)
        if key is None:
            if config.security.curve:
                problems.append(
                    f"[discovery].bootstrap: entry {index} ({address}) names no key: connections are encrypted "
                    f'([security].curve, on by default), so it must be "KEY@{address}", KEY the public_key '
                    "that `p2pnode keyinfo PEER_KEY_FILE` prints on that peer's host (or `p2pnode init` writes "
                    "a fleet's configs with them); [security] curve = false goes without, for a closed network only"
                )
            continue
        try:
            curve_public_from_ed25519(key)
        except ValueError as exc:
            problems.append(f"[discovery].bootstrap: entry {index}: {exc}")
    return problems


def _learning_checks(config: Config) -> list[str]:
    data, algorithm = config.data, config.algorithm
    if algorithm.name == "none":
        return []
    problems = []
    own_alone = data.path is not None and data.dataset != DATASET_FROM_PATH  # no partition: any number
    if (data.node_index or 0) >= data.nodes and not own_alone:
        problems.append(f"[data].node_index: must be below [data].nodes ({data.nodes}), got {data.node_index}")
    if config.model.mixed_precision and config.model.device in FLOAT32_ONLY_DEVICES:
        problems.append(
            f'[model].mixed_precision: needs a CUDA device, not "{config.model.device}"; set it false '
            'or [model].device = "cuda" (or "auto")'
        )
    if algorithm.name == "oracle":
        problems.append(
            "[algorithm].name: `oracle` trains on its whole cluster's data, which no P2P node has; "
            "it exists in `p2pnode simulate` only"
        )
    if data.clusters > data.nodes:
        problems.append(f"[data].clusters: cannot exceed [data].nodes ({data.nodes}), got {data.clusters}")
    from algorithms.data.datasets import missing_files

    missing = missing_files(data.dataset, data.root)
    if missing is not None:
        problems.append(f"[data].root: {missing}")
    if algorithm.async_gather_s > algorithm.round_deadline_s:
        problems.append(
            f"[algorithm].async_gather_s: must not exceed [algorithm].round_deadline_s ({algorithm.round_deadline_s}), "
            f"got {algorithm.async_gather_s}"
        )
    if algorithm.peer_inbox_frames > algorithm.inbox_frames:
        problems.append(
            f"[algorithm].peer_inbox_frames: must not exceed [algorithm].inbox_frames ({algorithm.inbox_frames}), "
            f"got {algorithm.peer_inbox_frames}: it is one peer's share of that queue"
        )
    if algorithm.start_peers > config.discovery.max_peers:
        problems.append(
            f"[algorithm].start_peers: must not exceed [discovery].max_peers ({config.discovery.max_peers}), "
            f"got {algorithm.start_peers}: the first round would wait start_timeout_s for peers the table cannot hold"
        )
    from algorithms.registry import ConfigOverrideError, checked_config

    try:
        checked_config(algorithm.name, dict(algorithm.settings), algorithm.rounds, "[algorithm].rounds")
    except ConfigOverrideError as exc:
        problems.append(f"[algorithm].settings: {exc}")
    return problems


def _model_checks(config: Config) -> list[str]:
    """A user backbone's module and callable, found (not yet called: that builds it, at start);
    `[model].weights` a file. Whether they fit the node's images is known when its model is built."""
    model = config.model
    if config.algorithm.name == "none":
        return []
    problems = []
    if model.weights is not None and not model.weights.is_file():
        problems.append(f"[model].weights: {model.weights} is not a file")
    if ":" in model.backbone:
        from algorithms.models.user_backbone import BackboneError, user_builder

        try:
            user_builder(model.backbone, model.code or config.source.resolve().parent)
        except BackboneError as exc:
            problems.append(f"[model].backbone: {exc}")
    if model.code is not None and not model.code.is_dir():
        problems.append(f"[model].code: {model.code} is not a folder")
    return problems


# What cuts a benchmark's partition, and what describes a device's own data: never both, except
# that `dataset = "path"` deals out the images at `path` by a partition, and `node_index` numbers
# a device with its own data (it seeds its model).
_BENCHMARK_KEYS = (
    "dataset",
    "root",
    "scenario",
    "nodes",
    "node_index",
    "classes",
    "clusters",
    "samples_per_class",
    "test_per_class",
)
_OWN_DATA_KEYS = ("class_names", "image_size", "channels", "test_fraction", "max_memory_mb", "skip_damaged")
_NOT_WITH_PATH_DATASET = ("root", "classes", "test_fraction")


def own_data_checks(config: Config, given: Mapping[str, Any], inspect: bool) -> list[str]:
    """`[data].path` against the benchmark options (by the keys the file gives), then the data
    itself as far as it can be checked without decoding it (algorithms/data/own_data.py)."""
    data = config.data
    if data.path is None:
        problems = [
            f"[data].{key}: applies only with [data].path (a device's own data)"
            for key in _OWN_DATA_KEYS
            if key in given
        ]
        if data.dataset == DATASET_FROM_PATH:
            problems.append('[data].dataset: "path" deals out the images at [data].path: set [data].path')
        return problems
    if data.dataset == DATASET_FROM_PATH:
        problems = [
            f'[data].{key}: does not apply with [data].dataset = "path" (the partition holds out '
            "test_per_class images of each own class)"
            for key in _NOT_WITH_PATH_DATASET
            if key in given
        ]
    else:
        problems = [
            f"[data].{key}: a benchmark option, but [data].path gives this node its own data: remove one of them"
            for key in _BENCHMARK_KEYS
            if key in given and key != "node_index"
        ]
    return problems + _own_data_problems(config, given, inspect)


def _own_data_problems(config: Config, given: Mapping[str, Any], inspect: bool) -> list[str]:
    """What `[data].path` needs whether a partition deals it out or not: class names, settings
    that fit the kind of data, and the data itself."""
    data, problems = config.data, []
    if len(data.class_names) < 2:
        problems.append(
            "[data].class_names: required with [data].path: the network's classes, at least 2, "
            "the same list on every node"
        )
    if data.path.suffix.lower() == ".npz":
        problems += [
            f"[data].{key}: applies to an image folder only; a .npz's images keep their shape"
            for key in ("image_size", "channels")
            if key in given
        ]
    if len(config.node.capabilities) > 30:
        problems.append("[node].capabilities: at most 30 with [data].path (HELLO carries 32, two are the node's own)")
    if len(data.class_names) < 2 or not inspect or config.algorithm.name == "none":
        return problems
    from algorithms.data.own_data import OwnDataError, inspect_own_data

    try:
        inspect_own_data(data.own_data())
    except OwnDataError as exc:
        problems.append(f"[data].{exc.field}: {exc}")
    return problems
