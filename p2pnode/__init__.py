"""p2pnode: the daemon, its command line, and everything that does I/O."""

__version__ = "0.1.0"
