"""The receive side of the wire: each inbound ROUTER in a process of its own, and what the node
does with what those processes pass up.

- supervisor.py: the node's side of each inbound socket's process (`Ingress`): starts it (forked
  by the node's fork server, p2pnode/forkserver.py), relays its events and ZAP requests, takes
  its frames, starts another when libzmq aborts it;
- process.py: that process (`python -m p2pnode.wire.inbound.process`: the fork server, and each
  child it forks): the ROUTER, its ZAP hook, monitor and buffer bound;
- pipes.py: the messages between the two;
- buffers.py, silence.py, resets.py: in the process, the bound on what libzmq holds, connections
  that never speak, connections reset by their other end;
- reader.py: what the node does with the frames (`Inbound`): header check and gate (../gate.py),
  signature checks in worker threads, replay guard, in order to the node.

Nothing is imported here: the process imports only what it needs, and starts fast.
"""
