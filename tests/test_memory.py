"""The process's memory as status reports it, and what a daemon keeps after setting up."""

import os
import subprocess
import sys

import numpy as np
import pytest

from p2pnode.memory import MIB, process_memory, resident_bytes

from .helpers import ANY_PORT, learning_sections, write_config


def test_resident_memory_follows_what_the_process_touches():
    before = process_memory()
    assert before["rss_mb"] == pytest.approx(resident_bytes() / MIB, abs=2)  # the same, from /proc/self/statm
    block = np.ones(64 * MIB // 8)  # 64 MiB, every page written
    grown = process_memory()
    assert grown["rss_mb"] - before["rss_mb"] > 60
    assert grown["peak_rss_mb"] >= grown["rss_mb"] - 1  # the kernel's counters differ by a few pages
    del block  # a block this large is its own mapping: freeing it unmaps it
    after = process_memory()
    assert after["rss_mb"] < grown["rss_mb"] - 60 and after["peak_rss_mb"] >= grown["rss_mb"] - 1


def test_status_is_read_in_kib_and_a_missing_one_is_unknown(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t  409600 kB\nVmRSS:\t  358400 kB\nThreads:\t4\n")
    assert process_memory(str(status)) == {"rss_mb": 350.0, "peak_rss_mb": 400.0}
    assert process_memory(str(tmp_path / "absent")) == {"rss_mb": None, "peak_rss_mb": None}


def test_the_peak_is_this_process_s_own_not_its_parent_s():
    """getrusage's ru_maxrss survives exec: a child of a large parent would report the parent's."""
    block = np.ones(128 * MIB // 8)
    code = "from p2pnode.memory import process_memory; print(process_memory()['peak_rss_mb'])"
    child_peak = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert child_peak < process_memory()["peak_rss_mb"] - 100 and block.sum() == len(block)


def test_another_process_s_size_by_its_pid():
    sleeper = "import time; print('up', flush=True); time.sleep(30)"
    with subprocess.Popen([sys.executable, "-c", sleeper], stdout=subprocess.PIPE, text=True) as child:
        try:  # once it runs Python
            assert child.stdout.readline() == "up\n" and 1 < resident_bytes(child.pid) / MIB < 100
        finally:
            child.kill()
    assert resident_bytes(child.pid) == 0  # gone


def test_a_built_node_keeps_its_shard_not_the_dataset(tmp_path):
    """The daemon's build drops the cached dataset and partition once its shard is cut."""
    from algorithms.data.datasets import _load_cached
    from algorithms.data.setup import load_scenario
    from p2pnode.config import load_config
    from p2pnode.learning.algorithm import build_algorithm

    config = load_config(write_config(tmp_path / "n", ANY_PORT, **learning_sections(1, 4)))
    algorithm = build_algorithm(config, "n1")
    assert load_scenario.cache_info().currsize == 0 and _load_cached.cache_info().currsize == 0
    counts = algorithm.setup.data.class_counts
    assert set(counts[counts > 0]) == {10}  # its shard: 10 images of each of its classes


ARENAS = """
import ctypes, sys, threading
from p2pnode.memory import limit_arenas
if int(sys.argv[1]):
    assert limit_arenas(int(sys.argv[1]))
together = threading.Barrier(4)
def allocate():
    blocks = [bytearray(1000) for _ in range(1000)]  # above pymalloc's 512 bytes: glibc's malloc
    together.wait()  # all four alive at once: none hands its arena on to another
threads = [threading.Thread(target=allocate) for _ in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
ctypes.CDLL(None).malloc_stats()  # one "Arena N:" paragraph per arena, on stderr
"""


@pytest.mark.parametrize("limit, arenas", [(0, 5), (1, 1), (2, 2)])
def test_threads_share_as_many_heap_arenas_as_allowed(limit, arenas):
    """Without a limit each new thread that allocates gets its own arena (up to 8 per core)."""
    run = subprocess.run([sys.executable, "-c", ARENAS, str(limit)], capture_output=True, text=True, check=True)
    assert run.stderr.count("Arena ") == min(arenas, 8 * os.cpu_count()), run.stderr
