"""Node configuration: a TOML file, checked completely before anything starts.

Each setting is declared once, as a dataclass field with its kind, default and documentation;
loading, validation, error messages and docs/config.md all come from those declarations. Every
problem names its field (`[discovery].max_peers: ...`); all problems are reported at once.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Names only: the data modules import numpy (15 MB), which a node that learns nothing never needs.
from algorithms.catalog import (
    ALGORITHM_NAMES,
    BACKBONES,
    DATASET_FROM_PATH,
    DATASETS,
    DEVICE_FORMS,
    DEVICE_PATTERN,
    FLOAT32_ONLY_DEVICES,
    SCENARIOS,
)
from protocol import DEFAULT_LIMITS, Identity, Limits, MessageType, check_network_id
from protocol.curve import curve_public_from_ed25519

from .wire.keystore import KeyFileError, load_key

if TYPE_CHECKING:
    from algorithms.own_data import OwnDataSpec

# What a stranger may send (gate.py); the public socket must take the largest of them.
HANDSHAKE_KINDS = (MessageType.HELLO, MessageType.PING, MessageType.PONG)

__all__ = [
    "ConfigError",
    "Config",
    "NodeSettings",
    "DiscoverySettings",
    "BeaconSettings",
    "SecuritySettings",
    "TransportSettings",
    "LimitSettings",
    "LogSettings",
    "DataSettings",
    "ModelSettings",
    "AlgorithmSettings",
    "MetricsSettings",
    "load_config",
    "reference_markdown",
    "split_bootstrap",
    "CONTROL_SOCKET_NAME",
]

CONTROL_SOCKET_NAME = "control.sock"
_MAX_UNIX_SOCKET_PATH = 107  # sun_path is 108 bytes on Linux, one for the terminating NUL


class ConfigError(Exception):
    """The configuration cannot be used; `problems` holds one line per problem."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"invalid configuration {source}:\n" + "\n".join(f"  {p}" for p in problems))


class Invalid(ValueError):
    """Raised by a kind's parse(); the message completes "[section].key: ..."."""


# --- kinds of values ------------------------------------------------------------------------


class Kind:
    def parse(self, value: Any, base: Path) -> Any:
        raise NotImplementedError

    def resolve_default(self, default: Any, base: Path) -> Any:
        """The value a missing key takes (paths are made relative to the config file)."""
        return default

    def describe(self) -> str:
        raise NotImplementedError


def _type_name(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a table",
    }.get(type(value), type(value).__name__)


class Integer(Kind):
    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high

    def parse(self, value, base):
        if type(value) is not int:
            raise Invalid(f"expected an integer, got {_type_name(value)}")
        if not self.low <= value <= self.high:
            raise Invalid(f"must be between {self.low} and {self.high}, got {value}")
        return value

    def describe(self):
        return f"integer, {self.low} to {self.high}"


class Number(Kind):
    def __init__(self, low: float, high: float) -> None:
        self.low, self.high = low, high

    def parse(self, value, base):
        if type(value) not in (int, float):
            raise Invalid(f"expected a number, got {_type_name(value)}")
        if not (math.isfinite(value) and self.low <= value <= self.high):
            raise Invalid(f"must be between {self.low:g} and {self.high:g}, got {value}")
        return float(value)

    def describe(self):
        return f"number, {self.low:g} to {self.high:g}"


class IntegerChoice(Kind):
    def __init__(self, *choices: int) -> None:
        self.choices = choices

    def parse(self, value, base):
        if type(value) is not int:
            raise Invalid(f"expected an integer, got {_type_name(value)}")
        if value not in self.choices:
            raise Invalid(f"must be {' or '.join(map(str, self.choices))}, got {value}")
        return value

    def describe(self):
        return "integer, " + " or ".join(map(str, self.choices))


class Flag(Kind):
    def parse(self, value, base):
        if type(value) is not bool:
            raise Invalid(f"expected true or false, got {_type_name(value)}")
        return value

    def describe(self):
        return "true or false"


class Text(Kind):
    def __init__(self, pattern: str | None = None, choices: tuple[str, ...] = (), what: str = "string") -> None:
        self.pattern = re.compile(pattern) if pattern else None
        self.choices = choices
        self.what = what

    def parse(self, value, base):
        if type(value) is not str:
            raise Invalid(f"expected {self.what}, got {_type_name(value)}")
        if self.choices and value not in self.choices:
            raise Invalid(f"must be one of {', '.join(map(repr, self.choices))}, got {value!r}")
        if self.pattern and not self.pattern.fullmatch(value):
            raise Invalid(f"{value!r} is not {self.what}")
        return value

    def describe(self):
        if self.choices:
            return "one of " + ", ".join(f'`"{c}"`' for c in self.choices)
        return self.what


class FilePath(Kind):
    """A path; relative paths are taken from the directory of the config file."""

    def parse(self, value, base):
        if type(value) is not str or not value:
            raise Invalid(f"expected a path, got {_type_name(value)}")
        path = Path(value).expanduser()
        return path if path.is_absolute() else (base / path)

    def resolve_default(self, default, base):
        return None if default is None else self.parse(str(default), base)

    def describe(self):
        return "path (relative to the config file's directory)"


class Endpoint(Kind):
    """A ZeroMQ TCP endpoint `tcp://HOST:PORT`."""

    _FORM = re.compile(r"tcp://(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):([0-9]{1,5})")

    def __init__(self, bind: bool) -> None:
        self.bind = bind  # binding allows "*" and port 0; advertising needs a reachable address

    def parse(self, value, base):
        if type(value) is not str:
            raise Invalid(f'expected an address like "tcp://127.0.0.1:7000", got {_type_name(value)}')
        match = self._FORM.fullmatch(value)
        if not match:
            raise Invalid(f"{value!r} is not an address of the form tcp://HOST:PORT")
        host, port = match.group(1), int(match.group(2))
        if port > 65535 or (port == 0 and not self.bind):
            raise Invalid(f"port {port} is not a usable port")
        if self.bind and host != "*":
            try:
                ipaddress.ip_address(host.strip("[]"))
            except ValueError:
                if host != "localhost":
                    raise Invalid(f'bind to an IP address or "*", not the host name {host!r}') from None
        if not self.bind and (host in ("*", "0.0.0.0", "[::]")):
            raise Invalid(f"{value!r} cannot be dialled by peers; give this node's reachable address")
        return value

    def describe(self):
        return (
            "`tcp://IP:PORT` to bind (`*` for all interfaces, port 0 for any)"
            if self.bind
            else "`tcp://HOST:PORT` peers can dial"
        )


class ListOf(Kind):
    def __init__(self, item: Kind, max_len: int, unique: bool = True) -> None:
        self.item, self.max_len, self.unique = item, max_len, unique

    def parse(self, value, base):
        if type(value) is not list:
            raise Invalid(f"expected a list, got {_type_name(value)}")
        if len(value) > self.max_len:
            raise Invalid(f"at most {self.max_len} entries, got {len(value)}")
        items = []
        for index, entry in enumerate(value):
            try:
                items.append(self.item.parse(entry, base))
            except Invalid as exc:
                raise Invalid(f"entry {index + 1}: {exc}") from None
        if self.unique and len(set(items)) != len(items):
            raise Invalid("entries repeat")
        return tuple(items)

    def describe(self):
        return f"list of at most {self.max_len} × {self.item.describe()}"


class BootstrapEntry(Kind):
    """A peer's address, optionally with its Ed25519 public key: `[KEY@]tcp://HOST:PORT`."""

    def parse(self, value, base):
        if type(value) is str and "@" in value and not value.startswith("tcp://"):
            key, address = value.split("@", 1)
            PublicKey().parse(key, base)
            return f"{key.lower()}@{Endpoint(bind=False).parse(address, base)}"
        return Endpoint(bind=False).parse(value, base)

    def describe(self):
        return "`tcp://HOST:PORT` peers can dial, or `KEY@tcp://HOST:PORT` with the peer's public key"


def split_bootstrap(entry: str) -> tuple[str, bytes | None]:
    """A bootstrap entry's address and the peer's Ed25519 key, if the entry names one."""
    if "@" not in entry or entry.startswith("tcp://"):
        return entry, None
    key, address = entry.split("@", 1)
    return address, bytes.fromhex(key)


class PublicKey(Kind):
    def parse(self, value, base):
        if type(value) is not str or not re.fullmatch(r"[0-9a-fA-F]{64}", value):
            raise Invalid(f"expected 64 hex digits of an Ed25519 public key (p2pnode keyinfo), got {value!r}")
        return bytes.fromhex(value)

    def describe(self):
        return "64 hex digits (an Ed25519 public key, as `p2pnode keyinfo` prints it)"


class Network(Kind):
    """An IP network in CIDR notation, e.g. `127.0.0.0/8`."""

    def parse(self, value, base):
        if type(value) is not str:
            raise Invalid(f'expected a network like "127.0.0.0/8", got {_type_name(value)}')
        try:
            return str(ipaddress.ip_network(value, strict=False))
        except ValueError:
            raise Invalid(f"{value!r} is not an IP network in CIDR notation") from None

    def describe(self):
        return "IP network, e.g. `10.0.0.0/8`"


class FrameSizes(Kind):
    """A table from message type to a size bound in bytes."""

    def parse(self, value, base):
        if type(value) is not dict:
            raise Invalid(f"expected a table like {{ MODEL = 67108864 }}, got {_type_name(value)}")
        sizes = {}
        for name, size in value.items():
            try:
                kind = MessageType(name)
            except ValueError:
                raise Invalid(
                    f"unknown message type {name!r} (known: {' '.join(t.value for t in MessageType)})"
                ) from None
            sizes[kind] = Integer(1, 1 << 40).parse(size, base)
        return sizes

    def describe(self):
        return "table of message type → bytes, e.g. `{ MODEL = 16777216 }`"


class Overrides(Kind):
    """A table of algorithm hyper-parameters, dotted keys for nested ones: `{ "graph.l2_weight" = 15 }`."""

    def parse(self, value, base):
        if type(value) is not dict:
            raise Invalid(f"expected a table like {{ warmup_rounds = 10 }}, got {_type_name(value)}")
        flat: dict[str, str] = {}

        def walk(table: dict, prefix: str) -> None:
            for key, entry in table.items():
                if type(entry) is dict:  # [algorithm.settings.graph] is the same as "graph.x" keys
                    walk(entry, f"{prefix}{key}.")
                elif type(entry) in (str, int, float, bool):
                    flat[prefix + key] = str(entry).lower() if type(entry) is bool else str(entry)
                else:
                    raise Invalid(f"{prefix}{key}: expected a string, number or boolean, got {_type_name(entry)}")

        walk(value, "")
        return flat

    def describe(self):
        return "table of hyper-parameter → value (docs/learning.md), e.g. `{ warmup_rounds = 10 }`"


_REQUIRED = dataclasses.MISSING


def option(kind: Kind, default: Any = _REQUIRED, doc: str = "") -> Any:
    """Declare a setting: its kind, its default (none: required) and one line of documentation."""
    if isinstance(default, dict):  # a fresh (empty) table per instance
        return field(default_factory=lambda: dict(default), metadata={"kind": kind, "doc": doc})
    return field(default=default, metadata={"kind": kind, "doc": doc})


def _is_required(spec: dataclasses.Field) -> bool:
    return spec.default is _REQUIRED and spec.default_factory is _REQUIRED


def _default(spec: dataclasses.Field) -> Any:
    return spec.default_factory() if spec.default_factory is not _REQUIRED else spec.default


# --- sections -------------------------------------------------------------------------------

_TOKEN = r"[a-z0-9][a-z0-9._:-]{0,63}"


@dataclass(frozen=True, kw_only=True)
class NodeSettings:
    key: Path = option(FilePath(), doc="Ed25519 key file of this node (`p2pnode keygen --out PATH`), mode 0600")
    data_dir: Path = option(
        FilePath(),
        Path("data"),
        "state, lock, checkpoint and control socket; mode 0700 and this user's: a looser "
        "mode is tightened at start, another owner stops it",
    )
    network: str = option(
        Text(r"[a-z0-9][a-z0-9._-]{0,63}", what="a network id ([a-z0-9._-], 1-64 characters)"),
        "p2pnode",
        "network id; frames of other networks are refused",
    )
    listen: str = option(Endpoint(bind=True), doc="address the inbound socket binds")
    advertise: str | None = option(
        Endpoint(bind=False),
        None,
        "address peers dial, sent in HELLO; default: the address "
        "`listen` bound (required when `listen` binds all interfaces)",
    )
    peer_listen: str | None = option(
        Endpoint(bind=True),
        None,
        "address the peers' socket binds: frames larger than `[limits].max_public_frame_bytes` "
        "arrive there, from admitted peers only; default: the host of `listen`, any port (give a "
        "fixed port where a firewall must let it through)",
    )
    peer_advertise_port: int | None = option(
        Integer(1, 65535),
        None,
        "the peers' port announced in HELLO (peers dial it on the host where they verified this "
        "node); default: the port `peer_listen` bound (set it behind a port-mapping NAT)",
    )
    capabilities: tuple[str, ...] = option(
        ListOf(Text(_TOKEN, what="a capability token"), 31),
        (),
        "capability tokens announced in HELLO; a learning node adds `algorithm:<name>` itself",
    )
    malloc_arenas: int = option(
        Integer(0, 1024),
        1,
        "glibc heap arenas the daemon's threads share; each keeps the pages its threads freed, so "
        "1 holds the least (12-39 MiB less on a learning node of a testnet); 0: glibc's default, 8 per core",
    )
    predict_max_images: int = option(
        Integer(1, 4096),
        8,
        "most images in one `predict` request on the control socket (`p2pnode predict` sends more in several)",
    )
    step_slowdown: float = option(
        Number(1, 1000),
        1.0,
        "emulate a slower device: each local step takes this many times as long (the daemon sleeps "
        "(slowdown − 1) × the step's time after it); 1 runs at the machine's own speed (`--slow` sets it in a testnet)",
    )
    predict_max_image_mb: float = option(
        Number(0.001, 1024),
        4.0,
        "largest image file `predict` takes (MB); `p2pnode predict` names a larger one and skips it",
    )


@dataclass(frozen=True, kw_only=True)
class DiscoverySettings:
    bootstrap: tuple[str, ...] = option(
        ListOf(BootstrapEntry(), 256),
        (),
        "peers to contact at start; retried with backoff until they answer, and again whenever they are "
        "lost; with `[security].curve` each entry names the peer's key (`p2pnode keyinfo`)",
    )
    max_peers: int = option(
        Integer(1, 4096),
        64,
        "peer table bound (the active view: connected and pinged peers); a verified newcomer beyond it "
        "is sent a sample of the peers and a BYE (`full`) instead",
    )
    active_view: int = option(
        Integer(1, 4096),
        64,
        "peers this node seeks: while it has fewer, it verifies addresses from its passive view "
        "(at most max_peers; for a large network set it below max_peers, e.g. 8 and 10: docs/daemon.md)",
    )
    passive_view: int = option(
        Integer(1, 4096),
        64,
        "signed HELLOs of nodes that are not peers, learned by peer exchange, kept to replace peers that leave",
    )
    ping_interval_s: float = option(
        Number(0.05, 3600), 1.0, "PING each peer this often; PONG gives the round-trip time"
    )
    peer_timeout_s: float = option(
        Number(0.2, 86400), 5.0, "a peer silent this long is evicted; must exceed 2 × ping_interval_s"
    )
    exchange_interval_s: float = option(
        Number(0.05, 3600), 2.0, "send PEERS (peer exchange) to `gossip_fanout` random peers this often"
    )
    gossip_fanout: int = option(Integer(1, 64), 2, "peers that get each periodic PEERS")
    hello_refresh_s: float = option(
        Number(1, 86400), 300.0, "re-sign this node's HELLO this often, so relayed copies stay fresh"
    )
    hello_max_age_s: float = option(
        Number(2, 86400 * 7), 900.0, "ignore relayed HELLOs older than this; must exceed hello_refresh_s"
    )
    dial_retry_initial_s: float = option(
        Number(0.01, 60), 0.05, "first retry of an unanswered HELLO; doubles per attempt"
    )
    dial_retry_max_s: float = option(Number(0.1, 3600), 5.0, "longest wait between HELLO retries")
    dial_attempts: int = option(
        Integer(1, 10_000),
        8,
        "give up verifying an address learned from a HELLO after this many unanswered "
        "challenges (bootstrap addresses are retried forever)",
    )
    max_dialing: int = option(
        Integer(1, 4096), 16, "addresses being verified at once (bootstrap addresses not counted)"
    )
    dialing_per_informant: int = option(
        Integer(1, 4096), 4, "addresses relayed by one peer that are being verified at once"
    )
    dialing_per_subnet: int = option(Integer(1, 4096), 4, "addresses in one subnet (/24 or /64) being verified at once")
    settled_after_s: float = option(
        Number(0, 86400 * 7),
        300.0,
        "a peer admitted this long ago is never displaced for a newcomer: neither from a full table "
        "by a newcomer from a less crowded subnet, nor, with a bounded view, for a newcomer that comes "
        "back after a redirect (the slack that lets the last nodes in: docs/daemon.md); 0: none ever is",
    )
    max_peers_per_subnet: int = option(
        Integer(1, 4096), 16, "peers admitted from one subnet (/24 for IPv4, /64 for IPv6)"
    )
    subnet_limits_exempt: tuple[str, ...] = option(
        ListOf(Network(), 256),
        ("127.0.0.0/8", "::1/128"),
        "networks the two subnet limits do not apply to (loopback: every node there is this host)",
    )

    def bootstrap_peers(self) -> tuple[tuple[str, bytes | None], ...]:
        """Each bootstrap entry's address, and its peer's Ed25519 key where the entry names one."""
        return tuple(split_bootstrap(entry) for entry in self.bootstrap)


@dataclass(frozen=True, kw_only=True)
class BeaconSettings:
    enabled: bool = option(
        Flag(), False, "announce and discover nodes on the LAN by UDP multicast (for nodes without bootstrap peers)"
    )
    group: str = option(Text(what="an IPv4 multicast address"), "239.255.70.70", "multicast group")
    port: int = option(Integer(1, 65535), 47474, "UDP port of the beacon")
    interface: str = option(
        Text(what="an IPv4 address"), "0.0.0.0", "local interface address for multicast (0.0.0.0: the system's choice)"
    )
    interval_s: float = option(Number(0.1, 3600), 5.0, "send a beacon this often")
    ttl: int = option(Integer(0, 255), 1, "multicast TTL; 1 keeps beacons on the local network")


@dataclass(frozen=True, kw_only=True)
class SecuritySettings:
    allowlist: tuple[bytes, ...] | None = option(
        ListOf(PublicKey(), 4096),
        None,
        "if set, only frames signed by these keys are accepted (others: `not_allowed`); omit to accept any key",
    )
    curve: bool = option(
        Flag(),
        False,
        "encrypt and authenticate every connection with ZeroMQ CURVE, under keys derived from the "
        "node keys; every `[discovery].bootstrap` entry must then name its peer's key",
    )
    max_connections: int = option(
        Integer(1, 1_000_000),
        1024,
        "inbound connections held at once; beyond it new ones are refused in their handshake "
        "(`zap_denied_total_cap`), except, with `curve`, those of admitted peers",
    )
    max_connections_per_address: int = option(
        Integer(1, 1_000_000),
        32,
        "inbound connections held at once from one source IP address (`zap_denied_address_cap`); "
        "a testnet on one host needs more than its node count",
    )
    abort_strikes: int = option(
        Integer(1, 1000),
        2,
        "a source address with a connection accepted within `abort_suspect_s` before an inbound "
        "socket's process aborted, this many aborts in a row (each within `abort_ban_s` of the "
        "last), is refused on both inbound sockets for `abort_ban_s` (`zap_denied_aborts`), except, "
        "with `curve`, admitted peers' keys",
    )
    abort_suspect_s: float = option(
        Number(0.1, 60),
        2.0,
        "how recent a connection must be, when an inbound socket's process aborts, to be suspected "
        "of the abort (the attack takes a fresh connection each time; honest peers hold theirs)",
    )
    abort_ban_s: float = option(
        Number(0, 86_400), 300.0, "how long a source address suspected of `abort_strikes` aborts is refused (0: never)"
    )


@dataclass(frozen=True, kw_only=True)
class TransportSettings:
    send_hwm: int = option(
        Integer(1, 1_000_000), 100, "frames queued per outbound peer socket; beyond it sends are dropped and counted"
    )
    recv_hwm: int = option(
        Integer(1, 1_000_000), 1000, "frames queued per connection on the peers' socket before ZeroMQ pushes back"
    )
    public_recv_hwm: int = option(
        Integer(1, 1_000_000),
        4,
        "the same on the public socket, which is read no faster than `stranger_rate`: a stranger "
        "sending faster fills this queue, then TCP's buffers, and then waits. Small, for ZeroMQ "
        "may hold a whole receive buffer (8 KiB) for each queued frame, however small",
    )
    max_public_buffered_bytes: int = option(
        Integer(1 << 16, 1 << 40),
        16 << 20,
        "bytes ZeroMQ may hold for the public socket's connections (frames arriving or unread, and "
        "parts of a multipart message never finished); above it the connection that sent the most "
        "lately is shut down (`shed_buffered`). Linux only",
    )
    max_peers_buffered_bytes: int = option(
        Integer(1 << 20, 1 << 40),
        256 << 20,
        "the same for the peers' socket (models arrive there: at least max_frame_bytes, and room "
        "for several neighbours sending at once)",
    )
    buffer_check_ms: int = option(
        Integer(10, 60_000), 250, "how often the bytes ZeroMQ holds are estimated (`max_public_buffered_bytes`, ...)"
    )
    growth_check_ms: int = option(
        Integer(1, 60_000),
        20,
        "how often the process's size is looked at, to estimate at once when it grows fast; longer "
        "costs less CPU (20 ms: about 1 % of a core on a busy 2-core machine) and lets a pump get further",
    )
    linger_ms: int = option(
        Integer(0, 60_000), 500, "on shutdown, wait at most this long to flush BYE and other queued frames"
    )
    keepalive_s: int = option(
        Integer(0, 86_400),
        10,
        "TCP keepalive: a connection idle this long is probed, and cut after 3 probes "
        "`keepalive_s` / 3 apart go unanswered (a dead host or a lost route; 0: the system's default)",
    )
    connect_wait_s: float = option(
        Number(0, 3600),
        5.0,
        "a frame too large for the public socket, for a peer whose peers' connection is still opening "
        "(just admitted, or reopened), waits up to this long for it instead of being dropped "
        "(at most `send_hwm` frames a peer; 0: dropped at once)",
    )
    reconnect_ivl_ms: int = option(Integer(1, 3_600_000), 100, "first reconnect delay of an outbound socket")
    reconnect_ivl_max_ms: int = option(
        Integer(0, 3_600_000), 5000, "reconnect delay cap (exponential backoff); 0 or at least reconnect_ivl_ms"
    )
    handshake_ivl_ms: int = option(Integer(0, 3_600_000), 5000, "abandon a ZMTP handshake after this long")
    verify_threads: int = option(Integer(1, 64), 2, "worker threads that check signatures (Ed25519 releases the GIL)")
    sign_in_thread_bytes: int = option(
        Integer(0, 1 << 40),
        65536,
        "payloads at least this large are signed in a worker thread; smaller ones "
        "on the event loop, where a thread hand-off would cost more than it saves",
    )
    verify_batch: int = option(Integer(1, 4096), 64, "frames handed to a verify thread at once")
    verify_batch_bytes: int = option(
        Integer(1024, 1 << 31),
        262144,
        "a batch closes once it holds this many bytes (a single larger frame "
        "still forms a batch); bounds memory and keeps large frames fast",
    )
    verify_queue: int = option(
        Integer(1, 4096),
        16,
        "batches waiting for a verify thread; when full, the node stops reading and ZeroMQ pushes back",
    )
    rate_per_connection: float = option(
        Number(1, 1e9),
        5000.0,
        "inbound frames per second allowed per connection; excess is dropped and counted (`rate_limited`)",
    )
    burst_per_connection: int = option(Integer(1, 1_000_000), 1000, "token-bucket burst for the rate above")
    stranger_rate: float = option(
        Number(1, 1e9),
        500.0,
        "frames per second, node-wide, that connections no admitted peer proved may send to be "
        "verified (handshakes, reconnections); excess is dropped and counted (`stranger_rate_limited`). "
        "The public socket is read no faster than this (bursts of `stranger_burst` aside)",
    )
    stranger_rate_per_subnet: float = option(
        Number(1, 1e9), 100.0, "the same, per source subnet (/24 for IPv4, /64 for IPv6)"
    )
    stranger_burst: int = option(Integer(1, 1_000_000), 200, "token-bucket burst for `stranger_rate`")
    stranger_burst_per_subnet: int = option(
        Integer(1, 1_000_000), 50, "token-bucket burst for `stranger_rate_per_subnet`"
    )
    max_stranger_connections: int = option(
        Integer(1, 1_000_000),
        1024,
        "connections without a proven admitted peer whose handshake claim is remembered; the least "
        "recently used beyond it must start over with a HELLO",
    )
    max_clock_skew_s: float = option(
        Number(0.1, 86400), 60.0, "frames whose timestamp is further from this node's clock are `stale`"
    )
    replay_window: int = option(
        Integer(1, 1 << 20), 1024, "sequence numbers remembered per sender for replay detection"
    )


@dataclass(frozen=True, kw_only=True)
class LimitSettings:
    max_frame_bytes: int = option(
        Integer(1024, 1 << 31), DEFAULT_LIMITS.max_frame_bytes, "largest frame of any type (also ZMQ_MAXMSGSIZE)"
    )
    max_public_frame_bytes: int = option(
        Integer(1024, 1 << 31),
        64 << 10,
        "largest frame accepted on the public socket (`[node].listen`, where strangers connect; "
        "ZMQ_MAXMSGSIZE); larger frames travel between admitted peers on the peers' socket",
    )
    frame_bytes: Mapping[MessageType, int] = option(
        FrameSizes(), {}, "per-type bounds overriding the defaults of docs/protocol.md §6"
    )
    max_str_len: int = option(Integer(1, 1 << 20), DEFAULT_LIMITS.max_str_len, "longest msgpack string")
    max_array_len: int = option(Integer(1, 1 << 24), DEFAULT_LIMITS.max_array_len, "longest msgpack array")
    max_map_len: int = option(Integer(1, 1 << 24), DEFAULT_LIMITS.max_map_len, "largest msgpack map")
    max_tensor_rank: int = option(Integer(1, 32), DEFAULT_LIMITS.max_tensor_rank, "most tensor dimensions")
    max_tensor_elements: int = option(
        Integer(1, 1 << 34), DEFAULT_LIMITS.max_tensor_elements, "most elements in one tensor"
    )
    max_tensor_norm: float = option(
        Number(1e-9, 1e300), DEFAULT_LIMITS.max_tensor_norm, "largest L2 norm of one received tensor"
    )

    def limits(self) -> Limits:
        by_type = dict(DEFAULT_LIMITS.frame_bytes_by_type)
        by_type.update(self.frame_bytes)
        return Limits(
            max_frame_bytes=self.max_frame_bytes,
            frame_bytes_by_type=by_type,
            max_str_len=self.max_str_len,
            max_array_len=self.max_array_len,
            max_map_len=self.max_map_len,
            max_tensor_rank=self.max_tensor_rank,
            max_tensor_elements=self.max_tensor_elements,
            max_tensor_norm=self.max_tensor_norm,
        )


@dataclass(frozen=True, kw_only=True)
class LogSettings:
    level: str = option(Text(choices=("debug", "info", "warning", "error")), "info", "least severe level written")
    format: str = option(Text(choices=("text", "json")), "text", "`json`: one JSON object per line")
    file: Path | None = option(FilePath(), None, "append logs to this file instead of standard error")


# The learning sections. Their names come from modules that import no torch, so a config loads
# fast; the hyper-parameters are checked against the algorithm's own dataclass, and that one
# import of torch happens only for a node that learns.


@dataclass(frozen=True, kw_only=True)
class DataSettings:
    dataset: str = option(
        Text(choices=(*DATASETS, DATASET_FROM_PATH)),
        "mnist5k",
        "dataset; `mnist5k` and `digits` ship with Python packages, the others are read from `root`; "
        '`"path"`: the images at `path`, dealt out by the partition like a benchmark\'s (every node '
        "holds them all under the same folder or file name, which keys the partition's draws)",
    )
    root: Path | None = option(
        FilePath(),
        None,
        "local root of the torchvision datasets (never downloaded: the config check wants its files there)",
    )
    scenario: str = option(Text(choices=SCENARIOS), "1", "non-IID partition of the network (docs/learning.md)")
    nodes: int = option(
        Integer(1, 100_000), 1, "nodes the partition is cut for; every node of one network uses the same value"
    )
    node_index: int | None = option(
        Integer(0, 99_999),
        None,
        "this node's shard of the partition, 0 ≤ node_index < nodes (unset: 0); with `path` alone: the "
        "device's number, which seeds its model as that node of a simulation (unset: its node id does)",
    )
    classes: tuple[int, ...] = option(
        ListOf(Integer(0, 4095), 4096),
        (),
        "instead of a shard: train on these classes (`samples_per_class` images of "
        "each, drawn with `seed` and the node index); such nodes may share images",
    )
    clusters: int = option(Integer(0, 100_000), 0, "ground-truth clusters (0: the scenario's default), at most `nodes`")
    samples_per_class: int = option(Integer(1, 1_000_000), 25, "training samples per class of this node")
    test_per_class: int = option(Integer(1, 1_000_000), 15, "test samples per own class of this node")
    seed: int = option(
        Integer(0, 2**31 - 1), 0, "seed of the partition and of the models; the same on every node of a network"
    )
    # A device's own data ("Your own data" in docs/config.md) instead of a benchmark's shard.
    path: Path | None = option(
        FilePath(),
        None,
        "this device's own data: a folder with one sub-folder of images per class, or a `.npz` "
        '(x, y, optionally x_test, y_test); replaces `dataset` and its partition, unless `dataset = "path"`',
    )
    class_names: tuple[str, ...] = option(
        ListOf(Text(r"[^./\x00][^/\x00]{0,254}", what="a class name (no '/', not starting with '.')"), 4096),
        (),
        "with `path`, required: the network's classes, the same list on every node; a class's id is "
        "its position (folders are named after classes; .npz labels are ids)",
    )
    image_size: int | None = option(
        Integer(8, 1024), None, "with an image folder: images are resized to this side (default 28)"
    )
    channels: int | None = option(
        IntegerChoice(1, 3), None, "with an image folder: 1 (grayscale, the default) or 3 (RGB)"
    )
    test_fraction: float | None = option(
        Number(0.01, 0.9),
        None,
        "with `path`: the share of each class held out for testing, chosen with `seed` "
        "(default 0.2; not with a .npz that has x_test)",
    )
    max_memory_mb: int = option(
        Integer(1, 1 << 20), 1024, "with `path`: bound on the images in memory (float32); more is a config error"
    )
    skip_damaged: bool = option(
        Flag(),
        False,
        "with an image folder: an image that cannot be read or decoded is skipped, and the skipped ones "
        "counted and named in the log, instead of stopping the node",
    )

    def own_data(self) -> OwnDataSpec | None:
        """The own-data settings, defaults filled in; None for a benchmark dataset."""
        if self.path is None:
            return None
        from algorithms.own_data import OwnDataSpec

        given = {"image_size": self.image_size, "channels": self.channels}
        return OwnDataSpec(
            path=self.path,
            class_names=self.class_names,
            test_fraction=self.test_fraction,
            max_memory_mb=self.max_memory_mb,
            skip_damaged=self.skip_damaged,
            seed=self.seed,
            node=None if self.dataset == DATASET_FROM_PATH else self.node_index,
            **{key: value for key, value in given.items() if value is not None},
        )


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    backbone: str = option(
        Text(choices=BACKBONES),
        "convnet",
        "this node's backbone; nodes may differ, except under mapl+, dfedavgm, scool-* and sfmtl",
    )
    device: str = option(
        Text(DEVICE_PATTERN, what=DEVICE_FORMS),
        "auto",
        "where the model trains: `auto` is CUDA if torch sees a GPU, else Apple's MPS, else the CPU; "
        "a named device that this machine lacks stops the node at start (exit 1)",
    )
    mixed_precision: bool = option(
        Flag(),
        False,
        "CUDA only: local steps under float16 autocast with a gradient scaler; refused with `cpu` or `mps`, "
        "ignored with a warning where `auto` finds no GPU",
    )
    threads: int = option(
        Integer(0, 1024), 1, "torch CPU threads (0: torch's default); several daemons on one machine want 1"
    )


@dataclass(frozen=True, kw_only=True)
class AlgorithmSettings:
    name: str = option(
        Text(choices=("none", *ALGORITHM_NAMES)), "none", "learning algorithm; `none` runs discovery only"
    )
    rounds: int = option(Integer(1, 10_000_000), 60, "rounds to run; afterwards the node keeps serving until stopped")
    start_peers: int = option(
        Integer(0, 4096), 0, "wait for this many admitted peers (at most `[discovery].max_peers`) before round 0 ..."
    )
    start_timeout_s: float = option(
        Number(0, 86400),
        60.0,
        "... or this long, whichever comes first; until then the first round waits for its peers' payloads "
        "(they may still be loading), even past `round_deadline_s`",
    )
    round_deadline_s: float = option(
        Number(0.01, 86400), 30.0, "after publishing, wait at most this long for the neighbours' payloads of the round"
    )
    quorum: float = option(Number(0, 1), 1.0, "once this fraction of the expected neighbours' payloads has arrived ...")
    straggler_grace_s: float = option(
        Number(0, 86400),
        2.0,
        "... wait at most this much longer for the rest (late payloads "
        "still count next round); 1.0 waits for all, up to the deadline",
    )
    deadline: str = option(
        Text(choices=("fixed", "adaptive")),
        "fixed",
        "sync: `fixed` waits up to `round_deadline_s`; `adaptive` up to the largest, over the expected neighbours, "
        "of median + `deadline_mads` × MAD of each one's arrival delays in its last `deadline_window` rounds "
        "(at least `deadline_min_s`, at most `round_deadline_s`; fixed until a neighbour has 3)",
    )
    deadline_mads: float = option(Number(0, 100), 4.0, "`deadline = adaptive`: MADs above the median delay")
    deadline_window: int = option(Integer(3, 10_000), 20, "`deadline = adaptive`: rounds of delays kept per neighbour")
    deadline_min_s: float = option(Number(0.001, 86400), 0.5, "`deadline = adaptive`: the shortest deadline")
    schedule: str = option(
        Text(choices=("sync", "async")),
        "sync",
        "`sync`: each round waits for the neighbours' payloads of that round (quorum, grace, deadline); "
        "`async`: a round waits at most `async_gather_s`, then mixes the latest payload of each neighbour, "
        "of any round, weighted by its age (docs/learning.md); no catch-up, every node at its own pace",
    )
    async_gather_s: float = option(
        Number(0.001, 60), 0.05, "`schedule = async`: the longest a round waits for its neighbours' payloads"
    )
    staleness_decay: float = option(
        Number(0.001, 1),
        0.5,
        "`schedule = async`: λ; a neighbour's weight w_ij is multiplied by λ^age (age: this round − the "
        "payload's round, 0 if ahead), then the row is renormalised",
    )
    max_staleness: int = option(
        Integer(0, 1000), 10, "`schedule = async`: payloads more than this many rounds old are not used"
    )
    max_rounds_ahead: int = option(
        Integer(0, 1000),
        2,
        "payloads for up to this many rounds ahead of ours are buffered; "
        "further ones count as `round_ahead` and may make a lagging node catch up ...",
    )
    catch_up_quorum: float = option(
        Number(0, 1),
        0.5,
        "... once this fraction of the peers it learns from, and at least 2 of them, are further ahead; "
        "it then goes as far as that many have all reached (one peer never moves it)",
    )
    inbox_frames: int = option(
        Integer(1, 1_000_000),
        4096,
        "payloads held between rounds; beyond it they are dropped and counted (`inbox_full`) ...",
    )
    peer_inbox_frames: int = option(
        Integer(1, 1_000_000),
        64,
        "... and at most this many for any one peer (`peer_inbox_full`), so no peer crowds out the others' "
        "(at most `inbox_frames`; with `[discovery].max_peers` × this within it, every peer always has room)",
    )
    checkpoint: bool = option(
        Flag(), True, "save the learning state after every round (atomically) and resume from it on start"
    )
    history_rounds: int = option(
        Integer(1, 1_000_000), 10_000, "per-round records kept for `status` (accuracy, weights, traffic)"
    )
    history_max_bytes: int = option(
        Integer(4096, 1 << 40),
        64 << 20,
        "`[node].data_dir`/history.jsonl, one line per round for `p2pnode report`, grows to this size; "
        "then it is renamed history.jsonl.1 (replacing the older one) and a new one begins, so the "
        "latest rounds are always kept in at most twice this",
    )
    local_baseline: bool = option(
        Flag(),
        False,
        "also train the `local` algorithm's model (no communication) on the same data and split, "
        "evaluated every round and checkpointed: the report says what collaboration gained over it "
        "(about doubles the local training time)",
    )
    settings: Mapping[str, str] = option(Overrides(), {}, "hyper-parameters overriding the algorithm's defaults")


@dataclass(frozen=True, kw_only=True)
class MetricsSettings:
    listen: str | None = option(
        Text(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}", what="HOST:PORT"),
        None,
        "serve Prometheus metrics at `http://HOST:PORT/metrics` (port 0: any); unset: off",
    )
    max_connections: int = option(
        Integer(1, 100_000),
        16,
        "connections served at once; a newcomer beyond it takes the place of the oldest one still "
        "sending its request, which is closed, or is closed itself if all are being answered "
        "(counted in `p2pnode_metrics_connections_closed_total`)",
    )
    request_timeout_s: float = option(
        Number(0.1, 3600), 5.0, "a connection's request and answer must be done within this; slower ones are closed"
    )
    max_request_bytes: int = option(
        Integer(256, 1 << 20),
        8192,
        "bytes of a request read at most (a scrape's is a few hundred); the rest is ignored",
    )

    @property
    def host_port(self) -> tuple[str, int] | None:
        if self.listen is None:
            return None
        host, port = self.listen.rsplit(":", 1)
        return host.strip("[]"), int(port)


_SECTIONS: dict[str, type] = {
    "node": NodeSettings,
    "discovery": DiscoverySettings,
    "beacon": BeaconSettings,
    "security": SecuritySettings,
    "transport": TransportSettings,
    "limits": LimitSettings,
    "log": LogSettings,
    "data": DataSettings,
    "model": ModelSettings,
    "algorithm": AlgorithmSettings,
    "metrics": MetricsSettings,
}


@dataclass(frozen=True)
class Config:
    source: Path
    node: NodeSettings
    discovery: DiscoverySettings
    beacon: BeaconSettings
    security: SecuritySettings
    transport: TransportSettings
    limits: LimitSettings
    log: LogSettings
    data: DataSettings = DataSettings()
    model: ModelSettings = ModelSettings()
    algorithm: AlgorithmSettings = AlgorithmSettings()
    metrics: MetricsSettings = MetricsSettings()
    identity: Identity | None = None  # loaded from node.key by load_config

    @property
    def control_socket(self) -> Path:
        return self.node.data_dir / CONTROL_SOCKET_NAME


# --- loading --------------------------------------------------------------------------------


# Settings that existed once, and why they do not any more: a config naming one is told so.
REMOVED = {
    ("transport", "heartbeat_ivl_ms"): "removed: ZMTP heartbeats made libzmq abort the daemon when a "
    "connection whose queue was full (recv_hwm) broke (libzmq issues 3937, 4364, 4767); see keepalive_s",
    ("transport", "heartbeat_timeout_ms"): "removed with heartbeat_ivl_ms; see keepalive_s",
}


def _unknown(key: str, known: list[str], what: str = "key") -> str:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(known)})"
    return f"unknown {what}{hint}"


def _parse_section(name: str, cls: type, table: Any, base: Path, problems: list[str]) -> Any:
    if not isinstance(table, dict):
        problems.append(f"[{name}]: expected a table, got {_type_name(table)}")
        table = {}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in table:
        if key not in fields:
            problems.append(f"[{name}].{key}: {REMOVED.get((name, key)) or _unknown(key, list(fields))}")
    values = {}
    for key, spec in fields.items():
        if key not in table:
            if _is_required(spec):
                problems.append(f"[{name}].{key}: required ({spec.metadata['kind'].describe()})")
            else:
                values[key] = spec.metadata["kind"].resolve_default(_default(spec), base)
            continue
        try:
            values[key] = spec.metadata["kind"].parse(table[key], base)
        except Invalid as exc:
            problems.append(f"[{name}].{key}: {exc}")
    try:
        return cls(**values)
    except TypeError:
        return None  # a required value is missing; already reported


def _cross_checks(config: Config, check_learning: bool = True) -> list[str]:
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
    return problems + (_learning_checks(config) if check_learning else [])


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
                    f"[discovery].bootstrap: entry {index}: with [security].curve = true it must name the "
                    f'peer\'s public key: "KEY@{address}" (KEY: `p2pnode keyinfo` of that peer)'
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
    from algorithms.datasets import missing_files

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


def _own_data_checks(config: Config, given: Mapping[str, Any], inspect: bool) -> list[str]:
    """`[data].path` against the benchmark options (by the keys the file gives), then the data
    itself as far as it can be checked without decoding it (algorithms/own_data.py)."""
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
    from algorithms.own_data import OwnDataError, inspect_own_data

    try:
        inspect_own_data(data.own_data())
    except OwnDataError as exc:
        problems.append(f"[data].{exc.field}: {exc}")
    return problems


def load_config(path: str | Path, *, load_identity: bool = True, check_learning: bool = True) -> Config:
    """Read, check and return a node configuration; ConfigError lists every problem found.
    `check_learning=False` skips the checks that import the learning stack (torch, seconds of
    CPU) or list `[data].path`: enough for `status` and `stop`, which only look for the running
    node."""
    path = Path(path)
    source = str(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(source, ["file not found"]) from None
    except OSError as exc:
        raise ConfigError(source, [f"cannot read: {exc.strerror or exc}"]) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(source, [f"not valid TOML: {exc}"]) from None

    base = path.resolve().parent
    problems: list[str] = []
    for name in raw:
        if name not in _SECTIONS:
            problems.append(f"[{name}]: {_unknown(name, list(_SECTIONS), 'section')}")
    sections = {name: _parse_section(name, cls, raw.get(name, {}), base, problems) for name, cls in _SECTIONS.items()}
    if problems:
        raise ConfigError(source, problems)
    config = Config(source=path, **sections)
    problems = _cross_checks(config, check_learning) + _own_data_checks(config, raw.get("data", {}), check_learning)
    identity = None
    if load_identity:
        try:
            identity = load_key(config.node.key)
        except KeyFileError as exc:
            problems.append(f"[node].key: {exc}")
    if problems:
        raise ConfigError(source, problems)
    return dataclasses.replace(config, identity=identity)


def reference_markdown() -> str:
    """The settings reference of docs/config.md, generated from the declarations above."""
    lines = []
    for name, cls in _SECTIONS.items():
        lines += [f"### [{name}]", "", "| key | value | default | meaning |", "|---|---|---|---|"]
        for spec in dataclasses.fields(cls):
            default = "*required*" if _is_required(spec) else _toml_literal(_default(spec))
            lines.append(f"| `{spec.name}` | {spec.metadata['kind'].describe()} | {default} | {spec.metadata['doc']} |")
        lines.append("")
    return "\n".join(lines)


def _toml_literal(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (str, Path)):
        return f'`"{value}"`'
    if isinstance(value, (tuple, Mapping)) and not value:
        return "`[]`" if isinstance(value, tuple) else "`{}`"
    return f"`{value}`"
