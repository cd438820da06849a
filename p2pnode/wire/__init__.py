"""The wire: ZeroMQ sockets under trio, the ingress processes that hold the inbound sockets, who may
connect (ZAP), the gate before the verify threads, the bound on buffered bytes, signing and keys."""
