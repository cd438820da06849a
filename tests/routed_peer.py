"""Either end of a routed exchange, run by tests/test_nat.py inside a NAT testbed's host: the
node's own ingress processes (p2pnode/wire/inbound/), not a probe of the testbed.

    python tests/routed_peer.py serve tcp://ADDRESS:PORT   the peers' socket, bound there: every
        frame is answered over the connection it came on, b"back:" + frame
    python tests/routed_peer.py dial tcp://ADDRESS:PORT    a client ingress dialled there: each
        line "go N" on stdin sends b"ping N" and prints "ok" once the answer came (within 2 s),
        else "none"
"""

import sys
from collections import Counter

import trio

from p2pnode.wire.inbound.supervisor import Ingress
from p2pnode.wire.settings import SecuritySettings, TransportSettings
from p2pnode.wire.zap import Connections
from p2pnode.wire.zmqsetup import CLIENT, PEERS


def _ingress(name: str) -> Ingress:
    counts = Counter()
    return Ingress(name, TransportSettings(), 1 << 20, None, Connections(SecuritySettings(), counts, bool), counts)


async def serve(endpoint: str) -> None:
    server = _ingress(PEERS)
    await server.start(endpoint)
    print("listening", flush=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.supervise)
        while True:
            for routing_id, frame, *_ in await server.receive(16, 1 << 20):
                server.reply(routing_id, b"back:" + frame.bytes)


async def dial(endpoint: str) -> None:
    client = _ingress(CLIENT)
    await client.start(None)
    client.connect(endpoint, b"server")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.supervise)
        stdin = trio.wrap_file(sys.stdin)
        while line := (await stdin.readline()).split():
            ping = f"ping {line[1]}".encode()
            client.send(b"server", ping)
            said = "none"
            with trio.move_on_after(2):
                while said == "none":
                    for _, frame, *_ in await client.receive(16, 1 << 20):
                        if frame.bytes == b"back:" + ping:
                            said = "ok"
            print(said, flush=True)
        nursery.cancel_scope.cancel()
    await client.close()


if __name__ == "__main__":
    trio.run({"serve": serve, "dial": dial}[sys.argv[1]], sys.argv[2])
