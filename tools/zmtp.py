"""ZMTP 3 spoken by hand over a plain TCP socket, NULL or CURVE: the bytes an attacker chooses,
malformed ones included, which libzmq itself would never send. tools/attack.py aims them at a node.

    connection = zmtp.connect("tcp://127.0.0.1:7000", server_key=curve_key)  # no key: NULL
    connection.send(b"part one", b"part two")                # one multipart message
    connection.send_command(zmtp.ping(ttl=10, context=b"ab"))
    connection.receive()                                      # Frame(flags, body), decrypted
    connection.reset()                                        # SO_LINGER 0: an RST, not a FIN

    with zmtp.Listener() as listener:                         # a node dials listener.address
        connection = listener.accept()

As libzmq 4.3.5 speaks it (RFC 23 ZMTP 3.1, RFC 26 CurveZMQ; src/curve_client_tools.hpp,
curve_server.cpp, curve_mechanism_base.cpp, zmtp_engine.cpp):
- a frame is a flags byte (MORE 0x01, LONG 0x02, COMMAND 0x04), its body's size (one byte, or eight
  big-endian with LONG), the body; a command's body is its name's length, its name, its data;
- a 64-byte greeting, then NULL's READY both ways, or CURVE's HELLO, WELCOME, INITIATE, READY;
- over CURVE every frame after the handshake is a MESSAGE command (sent in a frame with no flags)
  whose box holds a flags byte and the frame's body. That byte is libzmq's msg_t flags, not the
  frame's: MORE 0x01, COMMAND 0x02, and libzmq masks off every other bit (a 0x04 there makes no
  command: the PING would be a message). Each side numbers its boxes' nonces from 1 (the client's
  HELLO, INITIATE, then MESSAGEs; the server's READY, then MESSAGEs; WELCOME's nonce is random);
  a receiver refuses a MESSAGE whose nonce is not above the last;
- a libzmq CURVE server with no ZAP handler admits any client key (libzmq's "Stonehouse").

A test tool, not an implementation of ZMTP: it checks what it reads only as far as it needs to.
PyNaCl is imported only when CURVE is used (the project's `test` extra).
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass

__all__ = [
    "MORE",
    "LONG",
    "COMMAND",
    "BOXED_COMMAND",
    "ZmtpError",
    "Frame",
    "greeting",
    "frame",
    "command",
    "ping",
    "metadata",
    "open_socket",
    "read_frame",
    "expect_greeting",
    "expect_command",
    "CurveClient",
    "CurveServer",
    "Connection",
    "connect",
    "Listener",
]

MORE, LONG, COMMAND = 0x01, 0x02, 0x04
BOXED_COMMAND = 0x02  # COMMAND in a CURVE MESSAGE's boxed flags byte (libzmq's msg_t::command)
SIGNATURE = b"\xff" + bytes(8) + b"\x7f"
GREETING_SIZE = 64
MAX_FRAME = 64 << 20  # the largest frame this side reads: a bound of ours, not ZMTP's
_MESSAGE = b"\x07MESSAGE"


class ZmtpError(ConnectionError):
    """The other side refused the handshake (its ERROR command) or sent what this side cannot read."""


@dataclass(frozen=True)
class Frame:
    flags: int
    body: bytes

    @property
    def more(self) -> bool:
        return bool(self.flags & MORE)

    @property
    def name(self) -> bytes | None:
        """A command's name; None for a message frame."""
        return self.body[1 : 1 + self.body[0]] if self.flags & COMMAND and self.body else None


def greeting(mechanism: bytes = b"NULL", *, as_server: bool = False, version: tuple[int, int] = (3, 0)) -> bytes:
    """The 64-byte greeting: signature, version, mechanism name (up to 20 bytes), as-server, filler."""
    return SIGNATURE + bytes(version) + mechanism.ljust(20, b"\x00")[:20] + bytes((as_server,)) + bytes(31)


def frame(body: bytes, flags: int = 0) -> bytes:
    """One frame; past 255 bytes the LONG flag is set and the size takes eight bytes."""
    if len(body) > 255:
        return bytes((flags | LONG,)) + struct.pack(">Q", len(body)) + body
    return bytes((flags, len(body))) + body


def command(name: bytes, data: bytes = b"") -> bytes:
    """A command's body: its name's length, its name, its data."""
    return bytes((len(name),)) + name + data


def ping(ttl: int = 0, context: bytes = b"") -> bytes:
    """PING's body: the TTL in tenths of a second (16 bits), then a context the PONG echoes (libzmq
    keeps 16 bytes of it)."""
    return command(b"PING", struct.pack(">H", ttl) + context)


def metadata(properties: dict[bytes, bytes]) -> bytes:
    """READY's (and INITIATE's) properties: name length (1 byte), name, value length (4), value."""
    return b"".join(bytes((len(n),)) + n + struct.pack(">I", len(v)) + v for n, v in properties.items())


def open_socket(address: str, timeout: float = 5.0, source: str | None = None) -> socket.socket:
    """A TCP connection to `tcp://host:port`, without a word of ZMTP yet, from `source` (an
    address of this host; None: the system's choice)."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    bind = None if source is None else (source, 0)
    connection = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout, source_address=bind)
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return connection


def _read_exactly(connection: socket.socket, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = connection.recv(count - len(data))
        if not chunk:
            raise ZmtpError("the other side closed the connection")
        data += chunk
    return bytes(data)


def read_frame(connection: socket.socket, max_size: int = MAX_FRAME) -> Frame:
    flags, size = _read_exactly(connection, 2)
    if flags & LONG:
        (size,) = struct.unpack(">Q", bytes((size,)) + _read_exactly(connection, 7))
    if size > max_size:
        raise ZmtpError(f"a frame of {size} bytes, over this side's bound of {max_size}")
    return Frame(flags, _read_exactly(connection, size))


def expect_greeting(connection: socket.socket, mechanism: bytes) -> bytes:
    """The other side's greeting, if it is ZMTP 3 with `mechanism`."""
    received = _read_exactly(connection, GREETING_SIZE)
    if received[0] != 0xFF or not received[9] & 0x01 or received[10] < 3:
        raise ZmtpError(f"not a ZMTP 3 greeting: {received[:12].hex()}")
    if received[12:32].rstrip(b"\x00") != mechanism:
        raise ZmtpError(f"the other side speaks {received[12:32].rstrip(bytes(1))!r}, not {mechanism!r}")
    return received


def expect_command(connection: socket.socket, name: bytes) -> bytes:
    """The body of the next frame, if it is the command `name`; ZmtpError with its reason on ERROR."""
    received = read_frame(connection)
    if received.name == b"ERROR":
        reason = received.body[7 : 7 + received.body[6]] if len(received.body) > 6 else b""
        raise ZmtpError(f"refused with ERROR {reason.decode(errors='replace')!r}")
    if received.name != name:
        raise ZmtpError(f"expected {name.decode()}, got flags {received.flags:#x} body {received.body[:16]!r}")
    return received.body


class _CurveSession:
    """One side's MESSAGE boxes once CURVE's handshake is over: the box of the two short-term keys
    and the nonces (prefixes "CurveZMQMESSAGEC" client to server, "CurveZMQMESSAGES" back)."""

    def __init__(self, box, send_prefix: bytes, receive_prefix: bytes, next_nonce: int) -> None:
        self.box, self.send_prefix, self.receive_prefix, self.next_nonce = box, send_prefix, receive_prefix, next_nonce

    def seal(self, flags: int, body: bytes) -> bytes:
        """A MESSAGE command's body, boxing a frame's `flags` (MORE and COMMAND as libzmq boxes
        them, the bits above LONG as given) and `body`."""
        boxed = (flags & MORE) | (BOXED_COMMAND if flags & COMMAND else 0) | (flags & 0xF8)
        short_nonce = struct.pack(">Q", self.next_nonce)
        self.next_nonce += 1
        sealed = self.box.encrypt(bytes((boxed,)) + body, self.send_prefix + short_nonce).ciphertext
        return _MESSAGE + short_nonce + sealed

    def open(self, body: bytes) -> Frame:
        from nacl.exceptions import CryptoError

        if not body.startswith(_MESSAGE) or len(body) < len(_MESSAGE) + 8 + 16 + 1:
            raise ZmtpError(f"not a CURVE MESSAGE: {body[:16]!r}")
        short_nonce = body[8:16]
        try:
            plain = self.box.decrypt(body[16:], self.receive_prefix + short_nonce)
        except CryptoError:
            raise ZmtpError("a MESSAGE box that does not open") from None
        return Frame((plain[0] & MORE) | (COMMAND if plain[0] & BOXED_COMMAND else 0), plain[1:])


class CurveClient:
    """The client's side of CURVE's handshake. `server_key`: the server's long-term X25519 public
    key; `secret_key`: ours (32 bytes), fresh when None. Each call boxes with the next nonce."""

    def __init__(self, server_key: bytes, secret_key: bytes | None = None) -> None:
        from nacl.public import PrivateKey, PublicKey

        self.server_key = PublicKey(server_key)
        self.long_term = PrivateKey(secret_key) if secret_key is not None else PrivateKey.generate()
        self.short_term = PrivateKey.generate()
        self.nonce = 1
        self.session = None  # the box of both short-term keys, once WELCOME has named the server's

    def _next_nonce(self) -> bytes:
        self.nonce += 1
        return struct.pack(">Q", self.nonce - 1)

    def hello(self, box: bytes | None = None) -> bytes:
        """HELLO: version 1.0, 72 bytes of padding, our short-term key, the nonce, and the box of 64
        zero bytes for the server's long-term key (`box` sends those 80 bytes instead)."""
        from nacl.public import Box

        short_nonce = self._next_nonce()
        if box is None:
            box = Box(self.short_term, self.server_key).encrypt(bytes(64), b"CurveZMQHELLO---" + short_nonce).ciphertext
        return command(b"HELLO", b"\x01\x00" + bytes(72) + bytes(self.short_term.public_key) + short_nonce + box)

    def initiate(self, welcome: bytes, properties: bytes, vouch_key: bytes | None = None) -> bytes:
        """INITIATE, from WELCOME's body: the cookie, then boxed for the server's short-term key our
        long-term key, the vouch (our short-term key and the server's, boxed with our long-term
        key for its short-term one) and `properties`. `vouch_key`: box the vouch with this secret
        key instead, a vouch the server must refuse."""
        from nacl.exceptions import CryptoError
        from nacl.public import Box, PrivateKey, PublicKey

        if len(welcome) != 168 or not welcome.startswith(b"\x07WELCOME"):
            raise ZmtpError(f"a malformed WELCOME of {len(welcome)} bytes")
        try:
            plain = Box(self.short_term, self.server_key).decrypt(welcome[24:], b"WELCOME-" + welcome[8:24])
        except CryptoError:
            raise ZmtpError("a WELCOME box that does not open: not the server's key") from None
        server_short, cookie = PublicKey(plain[:32]), plain[32:128]
        vouch_nonce = os.urandom(16)
        voucher = PrivateKey(vouch_key) if vouch_key is not None else self.long_term
        vouched = bytes(self.short_term.public_key) + bytes(self.server_key)
        vouch = Box(voucher, server_short).encrypt(vouched, b"VOUCH---" + vouch_nonce).ciphertext
        self.session = Box(self.short_term, server_short)
        short_nonce = self._next_nonce()
        content = bytes(self.long_term.public_key) + vouch_nonce + vouch + properties
        sealed = self.session.encrypt(content, b"CurveZMQINITIATE" + short_nonce).ciphertext
        return command(b"INITIATE", cookie + short_nonce + sealed)

    def ready(self, ready: bytes) -> _CurveSession:
        """The session, once the server's READY opens (its properties are not read)."""
        from nacl.exceptions import CryptoError

        if len(ready) < 30 or not ready.startswith(b"\x05READY"):
            raise ZmtpError(f"a malformed READY of {len(ready)} bytes")
        try:
            self.session.decrypt(ready[14:], b"CurveZMQREADY---" + ready[6:14])
        except CryptoError:
            raise ZmtpError("a READY box that does not open") from None
        return _CurveSession(self.session, b"CurveZMQMESSAGEC", b"CurveZMQMESSAGES", self.nonce)


class CurveServer:
    """The server's side of CURVE's handshake, for one client, with the long-term `secret_key`. Its
    cookie is 96 random bytes kept here (opaque to the client, which only echoes it)."""

    def __init__(self, secret_key: bytes) -> None:
        from nacl.public import PrivateKey

        self.long_term = PrivateKey(secret_key)
        self.short_term = PrivateKey.generate()
        self.client_short = self.client_key = None
        self.cookie = os.urandom(96)

    def welcome(self, hello: bytes) -> bytes:
        """WELCOME, once HELLO's box opens: a random nonce, then our short-term key and the cookie
        boxed for the client's short-term key."""
        from nacl.exceptions import CryptoError
        from nacl.public import Box, PublicKey

        if len(hello) != 200 or not hello.startswith(b"\x05HELLO\x01\x00"):
            raise ZmtpError(f"a malformed HELLO of {len(hello)} bytes")
        self.client_short = PublicKey(hello[80:112])
        box = Box(self.long_term, self.client_short)
        try:
            box.decrypt(hello[120:200], b"CurveZMQHELLO---" + hello[112:120])
        except CryptoError:
            raise ZmtpError("a HELLO box that does not open") from None
        nonce = os.urandom(16)
        return command(
            b"WELCOME",
            nonce + box.encrypt(bytes(self.short_term.public_key) + self.cookie, b"WELCOME-" + nonce).ciphertext,
        )

    def ready(self, initiate: bytes, properties: bytes) -> tuple[bytes, _CurveSession]:
        """READY (our `properties`, boxed) and the session, once INITIATE's cookie and vouch check."""
        from nacl.exceptions import CryptoError
        from nacl.public import Box, PublicKey

        if len(initiate) < 257 or not initiate.startswith(b"\x08INITIATE") or initiate[9:105] != self.cookie:
            raise ZmtpError(f"a malformed INITIATE of {len(initiate)} bytes")
        session = Box(self.short_term, self.client_short)
        try:
            plain = session.decrypt(initiate[113:], b"CurveZMQINITIATE" + initiate[105:113])
            client_key = PublicKey(plain[:32])
            vouch = Box(self.short_term, client_key).decrypt(plain[48:128], b"VOUCH---" + plain[32:48])
        except CryptoError:
            raise ZmtpError("an INITIATE or vouch box that does not open") from None
        if vouch[:32] != bytes(self.client_short) or vouch[32:] != bytes(self.long_term.public_key):
            raise ZmtpError("a vouch for other keys")
        self.client_key = bytes(client_key)
        short_nonce = struct.pack(">Q", 1)
        ready = command(
            b"READY", short_nonce + session.encrypt(properties, b"CurveZMQREADY---" + short_nonce).ciphertext
        )
        return ready, _CurveSession(session, b"CurveZMQMESSAGES", b"CurveZMQMESSAGEC", 2)


class Connection:
    """A connection whose handshake is over. The send_* methods write at once; the *_bytes ones
    give the bytes instead, to put several frames in one segment (over CURVE they use up nonces
    all the same: send them in the order they were made)."""

    def __init__(self, connection: socket.socket, curve: _CurveSession | None = None) -> None:
        self.socket, self.curve = connection, curve

    def frame_bytes(self, body: bytes, flags: int = 0) -> bytes:
        """One frame as it goes on the wire: over CURVE, a MESSAGE whose box holds `flags` and `body`."""
        return frame(body, flags) if self.curve is None else frame(self.curve.seal(flags, body))

    def message_bytes(self, *parts: bytes) -> bytes:
        return b"".join(self.frame_bytes(part, MORE if i < len(parts) - 1 else 0) for i, part in enumerate(parts))

    def command_bytes(self, body: bytes) -> bytes:
        """A command frame; `body` as `command` or `ping` make it, or malformed as you like."""
        return self.frame_bytes(body, COMMAND)

    def send(self, *parts: bytes) -> None:
        """One message of one or several parts."""
        self.socket.sendall(self.message_bytes(*parts))

    def send_command(self, body: bytes) -> None:
        self.socket.sendall(self.command_bytes(body))

    def send_raw(self, data: bytes) -> None:
        self.socket.sendall(data)

    def receive(self) -> Frame:
        """The next frame (over CURVE, opened: its flags are the boxed ones)."""
        received = read_frame(self.socket)
        return received if self.curve is None else self.curve.open(received.body)

    def reset(self) -> None:
        """Close with SO_LINGER 0: the other side gets an RST, not a FIN."""
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass  # the other side broke it already
        self.socket.close()

    def close(self) -> None:
        self.socket.close()


def _client_handshake(
    connection: socket.socket,
    server_key: bytes | None,
    secret_key: bytes | None,
    properties: bytes,
    version: tuple[int, int],
) -> Connection:
    if server_key is None:
        connection.sendall(greeting(b"NULL", version=version) + frame(command(b"READY", properties), COMMAND))
        expect_greeting(connection, b"NULL")
        # The server's READY comes once its ZAP handler has answered: a message before it would
        # be a protocol error.
        expect_command(connection, b"READY")
        return Connection(connection)
    curve = CurveClient(server_key, secret_key)
    connection.sendall(greeting(b"CURVE", version=version) + frame(curve.hello(), COMMAND))
    expect_greeting(connection, b"CURVE")
    connection.sendall(frame(curve.initiate(expect_command(connection, b"WELCOME"), properties), COMMAND))
    return Connection(connection, curve.ready(expect_command(connection, b"READY")))


def connect(
    address: str,
    *,
    server_key: bytes | None = None,
    secret_key: bytes | None = None,
    socket_type: bytes = b"DEALER",
    version: tuple[int, int] = (3, 0),
    timeout: float = 5.0,
    source: str | None = None,
) -> Connection:
    """A client connection whose handshake is over: NULL, or CURVE for the server's long-term
    X25519 `server_key` with our `secret_key` (fresh when None), from `source` (open_socket).
    `socket_type` is what READY (or INITIATE) says we are: the server refuses a type that cannot
    talk to its own."""
    connection = open_socket(address, timeout, source)
    try:
        return _client_handshake(connection, server_key, secret_key, metadata({b"Socket-Type": socket_type}), version)
    except BaseException:
        connection.close()
        raise


class Listener:
    """A listening TCP socket doing the server's side of the handshake, for a node that dials us:
    NULL, or CURVE with our long-term X25519 `secret_key`."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        secret_key: bytes | None = None,
        socket_type: bytes = b"ROUTER",
        timeout: float = 5.0,
    ) -> None:
        self.socket = socket.create_server((host, port))
        self.socket.settimeout(timeout)
        self.secret_key, self.socket_type, self.timeout = secret_key, socket_type, timeout
        self.client_key: bytes | None = None  # over CURVE, the long-term key of the last client accepted

    @property
    def address(self) -> str:
        host, port = self.socket.getsockname()[:2]
        return f"tcp://{host}:{port}"

    def accept(self) -> Connection:
        connection, _ = self.socket.accept()
        connection.settimeout(self.timeout)
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            return self._handshake(connection, metadata({b"Socket-Type": self.socket_type}))
        except BaseException:
            connection.close()
            raise

    def _handshake(self, connection: socket.socket, properties: bytes) -> Connection:
        if self.secret_key is None:
            connection.sendall(greeting(b"NULL", as_server=True) + frame(command(b"READY", properties), COMMAND))
            expect_greeting(connection, b"NULL")
            expect_command(connection, b"READY")
            return Connection(connection)
        curve = CurveServer(self.secret_key)
        connection.sendall(greeting(b"CURVE", as_server=True))
        expect_greeting(connection, b"CURVE")
        connection.sendall(frame(curve.welcome(expect_command(connection, b"HELLO")), COMMAND))
        ready, session = curve.ready(expect_command(connection, b"INITIATE"), properties)
        connection.sendall(frame(ready, COMMAND))
        self.client_key = curve.client_key
        return Connection(connection, session)

    def close(self) -> None:
        self.socket.close()

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
