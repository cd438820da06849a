"""The sections of a configuration put together: `[node]`, declared here with its rules, and the
others from the parts they configure; `Config`, what a loaded file gives."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from protocol import Identity, check_network_id

from ..discovery.settings import BeaconSettings, DiscoverySettings
from ..learning.settings import AlgorithmSettings, DataSettings, ModelSettings
from ..operations.settings import LogSettings, MetricsSettings
from ..options import (
    CheckContext,
    Endpoint,
    FilePath,
    Flag,
    Integer,
    ListOf,
    Number,
    Section,
    Text,
    option,
)
from ..relay.settings import RelaySettings
from ..wire.settings import LimitSettings, SecuritySettings, TransportSettings

CONTROL_SOCKET_NAME = "control.sock"
_MAX_UNIX_SOCKET_PATH = 107  # sun_path is 108 bytes on Linux, one for the terminating NUL


# --- sections -------------------------------------------------------------------------------

_TOKEN = r"[a-z0-9][a-z0-9._:-]{0,63}"


@dataclass(frozen=True, kw_only=True)
class NodeSettings(Section):
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
    listen: str | None = option(
        Endpoint(bind=True), None, "address the inbound socket binds (required unless `client_mode`)"
    )
    client_mode: bool = option(
        Flag(),
        False,
        "bind nothing and accept no connection: dial the bootstrap nodes and the peers they name, and be "
        "reached over those connections only (a device behind a NAT that forwards nothing; docs/deploy.md)",
    )
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
    slowdown: float = option(
        Number(1, 1000),
        1.0,
        "emulate a device this many times slower than one core of this machine: each local step and each end of "
        "round (graph step, evaluation) lasts slowdown × the CPU time the daemon spent on it (it sleeps for the "
        "rest), so daemons sharing cores do not change each other's emulated speed; 1 runs at the machine's own "
        "speed (a testnet's `--pace` and `--slow` set it)",
    )
    predict_max_image_mb: float = option(
        Number(0.001, 1024),
        4.0,
        "largest image file `predict` takes (MB); `p2pnode predict` names a larger one and skips it",
    )
    predict_unknown_quantile: float = option(
        Number(0, 0.5),
        0.05,
        "`predict` calls an image not one of the node's classes below this quantile of the own-class probability "
        "its held-out images get (about this fraction of its own images are then called unknown; 0: only an image "
        "given another class is)",
    )
    ask_max_peers: int = option(
        Integer(1, 64), 8, "learning peers `predict --ask-peers` asks about the images the node calls not its own"
    )
    ask_timeout_s: float = option(Number(0.1, 600), 10.0, "how long `predict --ask-peers` waits for the peers' answers")
    ask_queue: int = option(
        Integer(1, 64),
        4,
        "peers' asks waiting to be answered (one at a time; a full queue refuses, counted `ask_busy`), and this "
        "node's own asks waiting for answers",
    )
    ask_per_minute: float = option(
        Number(0.1, 6000), 12.0, "asks each learning peer may put to this node a minute (more: `ask_rate_limited`)"
    )
    ask_max_image_side: int = option(
        Integer(8, 4096), 512, "largest width or height of an image a peer asks about (a PNG; larger: `ask_bad_image`)"
    )

    @property
    def control_socket(self) -> Path:
        return self.data_dir / CONTROL_SOCKET_NAME

    def check(self, context: CheckContext) -> list[str]:
        problems = []
        if self.listen is None and not self.client_mode:
            problems.append("[node].listen: required (or client_mode = true: a node nobody can dial)")
        listen = self.listen or ""
        if self.advertise is None and listen.startswith(("tcp://*:", "tcp://0.0.0.0:", "tcp://[::]:")):
            problems.append(
                "[node].advertise: required when listen binds all "
                f"interfaces ({self.listen}): say how peers reach this node"
            )
        socket_path = str(self.control_socket)
        if len(socket_path.encode()) > _MAX_UNIX_SOCKET_PATH:
            problems.append(
                "[node].data_dir: path too long for the control socket "
                f"({socket_path!r} has more than {_MAX_UNIX_SOCKET_PATH} bytes)"
            )
        try:
            check_network_id(self.network)
        except ValueError as exc:
            problems.append(f"[node].network: {exc}")
        return problems


SECTIONS: dict[str, type[Section]] = {
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
    "relay": RelaySettings,
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
    relay: RelaySettings = RelaySettings()
    identity: Identity | None = None  # loaded from node.key by load_config

    @property
    def control_socket(self) -> Path:
        return self.node.control_socket
