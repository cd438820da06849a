"""A stand-in daemon for tests/test_forkserver.py, run as `python -m tests.forked_program` or
forked by testnet/launch/warm_parent.py: prints its argv, its pid, session, random draws and whether torch
is imported, then exits
with `--exit CODE`, raises with `--raise`, or sleeps with `--sleep S` until signalled."""

import os
import random
import signal
import sys
import time

import numpy as np


def main() -> int:
    arguments = sys.argv[1:]
    print("argv", arguments)
    print("group", os.getpgid(0) == os.getpid(), "stdin", os.read(0, 1) == b"")
    print("draws", random.random(), float(np.random.random()))
    print("handlers", signal.getsignal(signal.SIGINT) is signal.default_int_handler, signal.getsignal(signal.SIGTERM))
    print("torch", "torch" in sys.modules)
    sys.stdout.flush()
    if "--raise" in arguments:
        raise RuntimeError("failed on purpose")
    if "--sleep" in arguments:
        time.sleep(float(arguments[arguments.index("--sleep") + 1]))
    return int(arguments[arguments.index("--exit") + 1]) if "--exit" in arguments else 0


if __name__ == "__main__":
    sys.exit(main())
