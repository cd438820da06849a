"""The data directory is the node's user's alone (issue #27): it holds the sequence reservation,
the checkpoints and the control socket that stops the node. A looser one this user owns is made
0700 at start, and said so; one of another user, or one whose mode cannot be changed, stops the
start with exit status 1 and a one-line reason.

Giving a directory to another user and mounting a read-only file system need root (CI runs as
root); where they are refused these tests are skipped with the reason."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys

import pytest
import trio

from p2pnode.config import load_config
from p2pnode.data_dir import DataDir, DataDirError
from p2pnode.node import Node, NodeStartError

from .helpers import ANY_PORT, SmallDisk, start_node, write_config

NOBODY = 65534


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


async def test_a_loose_data_directory_is_made_0700_at_start_and_the_log_says_so(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="p2pnode")
    data = tmp_path / "n" / "data"
    data.mkdir(parents=True)
    os.chmod(data, 0o777)  # mkdir's mode goes through the umask
    state = data / DataDir.STATE
    state.write_text(json.dumps({"seq_reserved": 1}))
    os.chmod(state, 0o666)  # written by hand, or by an older version
    async with trio.open_nursery() as nursery:
        node = await start_node(nursery, tmp_path / "n")
        assert mode_of(data) == 0o700
        assert mode_of(state) == 0o600  # replaced by the node's first reservation
        assert mode_of(node.config.control_socket) == 0o600
        node.request_stop()
    said = [record.getMessage() for record in caplog.records if record.name == "p2pnode.state"]
    assert said == [f"data directory {data} had mode 0777: made it 0700, for this user only"]


def test_p2pnode_start_refuses_a_data_directory_of_another_user(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    path = write_config(tmp_path / "n", ANY_PORT)
    data = tmp_path / "n" / "data"
    data.mkdir(mode=0o755)
    os.chown(data, NOBODY, NOBODY)
    done = subprocess.run(
        [sys.executable, "-m", "p2pnode_cli", "start", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"p2pnode: error: [node].data_dir: data directory {data} belongs to uid {NOBODY}, not to this user "
        "(uid 0): chown it to this user, or point [node].data_dir elsewhere"
    )
    assert os.stat(data).st_uid == NOBODY and mode_of(data) == 0o755  # not someone else's to change
    assert os.listdir(data) == []  # nothing written there: no lock, no state


async def test_a_loose_data_directory_whose_mode_cannot_be_changed_stops_the_start(tmp_path):
    disk = SmallDisk(tmp_path / "disk", 1 << 20)
    try:
        data = disk.path / "data"
        data.mkdir()
        os.chmod(data, 0o755)
        disk.read_only()
        config = load_config(write_config(tmp_path / "n", ANY_PORT, node={"data_dir": str(data)}))
        with trio.fail_after(30), pytest.raises(NodeStartError) as caught:
            await Node(config).run()
    finally:
        disk.unmount()
    assert caught.value.problems == (
        f"[node].data_dir: cannot make data directory {data} private (mode 0700, it is 0755): read-only file "
        "system (errno 30): remount its file system read-write, or point [node].data_dir elsewhere",
    )


def test_a_file_system_that_ignores_chmod_stops_the_start(tmp_path, monkeypatch):
    """Injected: FAT and some network mounts accept chmod and keep their mode; a tmpfs cannot."""
    data = tmp_path / "data"
    data.mkdir()
    os.chmod(data, 0o755)
    monkeypatch.setattr(os, "chmod", lambda path, mode: None)
    with pytest.raises(DataDirError) as caught:
        DataDir(data).__enter__()
    assert str(caught.value) == (
        f"data directory {data} stays mode 0755 after chmod 0700: its file system ignores modes; "
        "use one with Unix permissions"
    )
    assert not (data / DataDir.LOCK).exists()
