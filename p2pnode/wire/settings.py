"""[security], [transport] and [limits]: who may connect, the sockets, and the bounds on frames."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from protocol import DEFAULT_LIMITS, Limits, MessageType

from ..options import CheckContext, Flag, FrameSizes, Integer, ListOf, Number, PublicKey, Section, option

# What a stranger may send (gate.py); the public socket must take the largest of them.
# What a key that is not an admitted peer may send: a HELLO, a challenge and its answer; asking
# for a dial-back and the dial-back itself (discovery/dial_back.py).
HANDSHAKE_KINDS = (
    MessageType.HELLO,
    MessageType.PING,
    MessageType.PONG,
    MessageType.DIAL_ME,
    MessageType.DIALED,
)


@dataclass(frozen=True, kw_only=True)
class SecuritySettings(Section):
    allowlist: tuple[bytes, ...] | None = option(
        ListOf(PublicKey(), 4096),
        None,
        "if set, only frames signed by these keys are accepted (others: `not_allowed`); omit to accept any key",
    )
    curve: bool = option(
        Flag(),
        True,
        "encrypt and authenticate every connection with ZeroMQ CURVE, under keys derived from the "
        "node keys; every `[discovery].bootstrap` entry then names its peer's key (KEY@ADDRESS: "
        "`p2pnode keyinfo` of that peer's key file). false: plaintext, for a closed network only "
        "(docs/security.md says what is then open)",
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
    max_connections_per_prefix: int = option(
        Integer(1, 1_000_000),
        128,
        "inbound connections held at once from one source prefix, /24 or /64 (`zap_denied_prefix_cap`), "
        "except, with `curve`, those of admitted peers: an attacker with many addresses in one "
        "network gets this share, not the node's whole `max_connections`. Never below "
        "`max_connections_per_address`",
    )
    silent_s: float = option(
        Number(0, 3600),
        10.0,
        "a connection to the public socket that sends nothing past its handshake within this long "
        "is shut (`shut_silent`): an honest node sends its HELLO at once. Linux only; 0: never",
    )
    abort_strikes: int = option(
        Integer(1, 1000),
        2,
        "a source address that reset a connection within `abort_suspect_s` before an inbound socket's "
        "process aborted, this many times (each within `abort_ban_s` of the last), is refused on both "
        "inbound sockets for `abort_ban_s` (`zap_denied_aborts`); with `curve` so is the key of the one "
        "admitted peer that connected from that address, whatever its timing; and a source prefix "
        "(/24, /64) this many aborts are traced to is throttled (`abort_prefix_interval_s`)",
    )
    abort_suspect_s: float = option(
        Number(0.1, 60),
        2.0,
        "how recent a connection's reset must be, when an inbound socket's process aborts, to be "
        "suspected of the abort (the attack resets its connection; honest peers end theirs with a FIN)",
    )
    abort_ban_s: float = option(
        Number(0, 86_400), 300.0, "how long a source address suspected of `abort_strikes` aborts is refused (0: never)"
    )
    abort_prefix_interval_s: float = option(
        Number(0, 86_400),
        10.0,
        "from a source prefix that `abort_strikes` aborts were traced to, for `abort_ban_s`, one "
        "connection of a stranger (not an admitted peer's key) per this many seconds "
        "(`zap_denied_prefix_throttled`): an attacker with many addresses gets a bounded share",
    )
    not_peer_race_s: float = option(
        Number(0, 3600),
        60.0,
        "a connection to the peers' socket refused because its key was not an admitted peer yet "
        "(`zap_denied_not_peer`), whose key this node then admits within this long, was the start-up "
        "race (two nodes admit each other a moment apart): counted in `not_peer_race_resolved` and "
        "shown apart by `p2pnode status`, not as a refusal (0: never)",
    )
    not_peer_race_keys: int = option(
        Integer(1, 1_000_000),
        1024,
        "keys refused as not yet peers remembered at once for `not_peer_race_s`; beyond it the oldest "
        "is forgotten and its refusals stay refusals, so a stranger with many keys costs no more",
    )

    def check(self, context: CheckContext) -> list[str]:
        if self.allowlist == ():
            return ["[security].allowlist: an empty list would refuse every peer; omit the key to accept any key"]
        return []


@dataclass(frozen=True, kw_only=True)
class TransportSettings(Section):
    send_hwm: int = option(
        Integer(1, 1_000_000),
        100,
        "frames queued per outbound peer socket, and per connection an inbound socket replies over; "
        "beyond it sends are dropped and counted",
    )
    max_routed_send_bytes: int = option(
        Integer(1 << 16, 1 << 40),
        256 << 20,
        "bytes an inbound socket's process may hold to send over the connections it holds: replies "
        "to nodes behind a NAT, which cannot be dialled back (and a client-mode node's own frames); "
        "beyond it frames are dropped and counted (`routed_send_over_bytes`). The public socket "
        "holds no more than a quarter of `max_public_buffered_bytes`",
    )
    max_routed_send_bytes_per_connection: int = option(
        Integer(1 << 16, 1 << 40),
        80 << 20,
        "of `max_routed_send_bytes` (and never more), what one connection may hold: a neighbour "
        "that stops reading takes no more (`routed_send_over_connection_bytes`); at least the "
        "largest frame sent (`[limits].max_frame_bytes`, 64 MiB by default)",
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
    redial_s: float = option(
        Number(0.1, 3600),
        2.0,
        "an outbound connection that took no frame offered to it for this long is opened anew: libzmq "
        "never reconnects one the other side's ZAP handler refused (a connection cap, a ban, a peer "
        "that had not admitted this node yet) or whose handshake failed; doubled after each reopen "
        "that did not help, up to `redial_max_s`",
    )
    redial_max_s: float = option(
        Number(0.1, 3600), 16.0, "the longest wait between two reopenings of an outbound connection (`redial_s`)"
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

    def check(self, context: CheckContext) -> list[str]:
        if 0 < self.reconnect_ivl_max_ms < self.reconnect_ivl_ms:
            return [  # ZeroMQ would ignore it silently
                "[transport].reconnect_ivl_max_ms: must be 0 (no backoff) or at least reconnect_ivl_ms "
                f"({self.reconnect_ivl_ms}), got {self.reconnect_ivl_max_ms}"
            ]
        return []


@dataclass(frozen=True, kw_only=True)
class LimitSettings(Section):
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

    def check(self, context: CheckContext) -> list[str]:
        problems = [
            f"[limits].frame_bytes: {kind.value} bound {size} exceeds max_frame_bytes {self.max_frame_bytes}"
            for kind, size in self.frame_bytes.items()
            if size > self.max_frame_bytes
        ]
        handshake_bytes = max(self.limits().max_frame_bytes_for(kind) for kind in HANDSHAKE_KINDS)
        if not handshake_bytes <= self.max_public_frame_bytes <= self.max_frame_bytes:
            problems.append(
                f"[limits].max_public_frame_bytes: must lie between the largest handshake frame "
                f"({handshake_bytes}) and max_frame_bytes ({self.max_frame_bytes})"
            )
        return problems

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
