"""Simulating: every node of a run in this process or in a few hosts (worker processes, Ray
actors), exchanging real signed frames on a simulated clock, without sockets (`p2pnode simulate`)."""
