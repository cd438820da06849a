"""A full or read-only data directory (issue #14, item 8): clear errors at start, and a running
node that keeps serving, never reuses a sequence number, keeps its last checkpoint valid and
says once that its log file is full.

The disk is real: a small tmpfs mounted for the test, filled to the last byte (tmpfs gives
ENOSPC exactly like a full disk, and can be remounted read-only). Mounting needs root (CI runs
as root); where it is refused these tests are skipped with the reason. Only what a tmpfs cannot
show, an fsync that reports the lost write, is injected at the OS-call boundary.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import trio

import p2pnode.wire.sequence
from p2pnode import files
from p2pnode.config import load_config
from p2pnode.data_dir import DataDir, DataDirError
from p2pnode.learning.checkpoint import CHECKPOINT_NAME, Checkpoint
from p2pnode.node import Node, NodeStartError
from p2pnode.operations.logs import LogFile
from p2pnode.operations.status import format_status
from p2pnode_cli import main as cli
from protocol import Ping, SequenceCounter

from .helpers import ANY_PORT, SmallDisk, learning_sections, scrape, start_node, wait_until, write_config

NO_SPACE = "no space left on device (errno 28): free space on its file system"


@pytest.fixture
def disk(tmp_path):
    """A 1 MiB file system: room for a node's state, none to spare once filled."""
    small = SmallDisk(tmp_path / "disk", 1 << 20)
    yield small
    small.unmount()


def leftovers(directory: Path) -> list[str]:
    """What a failed start must not leave: temporary files and the control socket."""
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp") or p.name == "control.sock")


def lock_is_free(directory: Path) -> bool:
    fd = os.open(directory / DataDir.LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def node_config(tmp_path: Path, data_dir: Path, **sections):
    return load_config(write_config(tmp_path / "n", ANY_PORT, node={"data_dir": str(data_dir)}, **sections))


async def test_a_full_disk_stops_a_fresh_start_naming_the_setting_and_the_lock_file(tmp_path, disk):
    """The finding behind the item: the pid written into node.lock hit ENOSPC and the node died
    with a traceback. Now: one NodeStartError that says what, where and what to do."""
    config = node_config(tmp_path, disk.path / "data")
    disk.fill()
    with trio.fail_after(30), pytest.raises(NodeStartError) as caught:
        await Node(config).run()
    lock = disk.path / "data" / "node.lock"
    assert caught.value.problems == (
        f"[node].data_dir: cannot write the lock file {lock}: {NO_SPACE}, or point [node].data_dir elsewhere",
    )
    assert leftovers(disk.path / "data") == [] and lock_is_free(disk.path / "data")


async def test_a_full_disk_stops_a_restart_and_the_old_state_stays(tmp_path, disk):
    """A data directory used before: the lock file's page is reused, so the state file's
    sequence reservation is the write that fails; the old state.json is untouched, its
    temporary file gone, the lock released, and once there is room the node starts."""
    config = node_config(tmp_path, disk.path / "data")
    async with trio.open_nursery() as nursery:
        (await nursery.start(Node(config).run)).request_stop()
    state = disk.path / "data" / "state.json"
    before = state.read_bytes()
    disk.fill()
    with trio.fail_after(30), pytest.raises(NodeStartError) as caught:
        await Node(config).run()
    assert caught.value.problems == (
        f"[node].data_dir: cannot write the state file {state}: {NO_SPACE}, or point [node].data_dir elsewhere",
    )
    assert state.read_bytes() == before and json.loads(before)["seq_reserved"] > 0
    assert leftovers(disk.path / "data") == [] and lock_is_free(disk.path / "data")
    disk.free()
    async with trio.open_nursery() as nursery:
        (await nursery.start(Node(config).run)).request_stop()
    assert json.loads(state.read_bytes())["seq_reserved"] > json.loads(before)["seq_reserved"]


async def test_a_read_only_data_directory_stops_the_start_with_the_reason(tmp_path, disk):
    config = node_config(tmp_path, disk.path / "data")
    (disk.path / "data").mkdir(mode=0o700)
    disk.read_only()
    with trio.fail_after(30), pytest.raises(NodeStartError) as caught:
        await Node(config).run()
    assert caught.value.problems == (
        f"[node].data_dir: data directory {disk.path / 'data'} is on a read-only file system: "
        "remount it read-write, or point [node].data_dir elsewhere",
    )


def test_p2pnode_start_on_a_full_disk_exits_1_with_the_message_and_no_traceback(tmp_path, disk):
    path = write_config(tmp_path / "n", ANY_PORT, node={"data_dir": str(disk.path / "data")})
    disk.fill()
    done = subprocess.run(
        [sys.executable, "-m", "p2pnode_cli", "start", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lock = disk.path / "data" / "node.lock"
    assert done.stderr.splitlines()[-1] == (
        f"p2pnode: error: [node].data_dir: cannot write the lock file {lock}: {NO_SPACE}, "
        "or point [node].data_dir elsewhere"
    )


def test_an_fsync_that_reports_a_lost_write_leaves_the_old_state_and_no_temporary_file(tmp_path, monkeypatch):
    """Injected: tmpfs never fails fsync, but a thin-provisioned or network disk reports the
    lost write there (ENOSPC on fsync). The old file stays and the temporary file is removed."""
    with DataDir(tmp_path / "data") as data_dir:
        data_dir.save_state({"seq_reserved": 1})

        def fsync(fd: int) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(files.os, "fsync", fsync)
        with pytest.raises(DataDirError) as caught:
            data_dir.save_state({"seq_reserved": 2})
        monkeypatch.undo()
        assert str(caught.value) == f"cannot write the state file {tmp_path / 'data' / 'state.json'}: {NO_SPACE}"
        assert caught.value.unwritable
        assert data_dir.load_state() == {"seq_reserved": 1}
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["node.lock", "state.json"]


async def test_a_reservation_that_cannot_be_saved_stops_sends_without_reusing_a_number(
    tmp_path, disk, monkeypatch, caplog
):
    """Blocks of 16 numbers, so the reservation runs out after a few sends. On a full disk the
    node signs with what is reserved, then refuses (counted, logged once) and keeps serving;
    with room again it saves a new reservation and sends with numbers never used before."""
    monkeypatch.setattr(p2pnode.wire.sequence, "SequenceCounter", functools.partial(SequenceCounter, block=16))
    monkeypatch.setattr(p2pnode.wire.sequence, "RESERVATION_RETRY_S", 0.1)
    state = disk.path / "data" / "state.json"
    async with trio.open_nursery() as nursery:
        node = await start_node(nursery, tmp_path / "n", node={"data_dir": str(disk.path / "data")})
        reserved = json.loads(state.read_text())["seq_reserved"]
        disk.fill()
        used = []
        while (seq := await node.send_payload((), Ping(nonce=len(used)))) is not None:
            used.append(seq)
        for nonce in range(3):  # refused again, and logged only the first time
            assert await node.send_payload((), Ping(nonce=nonce)) is None
        await wait_until(lambda: node.metrics.state_write_failures >= 1, timeout=10)
        assert used and len(set(used)) == len(used) and max(used) < reserved  # only reserved numbers
        assert json.loads(state.read_text())["seq_reserved"] == reserved
        assert leftovers(disk.path / "data") == ["control.sock"]
        status = json.loads(await trio.to_thread.run_sync(status_json, node))
        assert status["traffic"]["send_refused"] == {"PING": 4} and status["state_write_failures"] >= 1
        assert "sends refused (no sequence number reserved): PING 4" in format_status(status)
        refusals = [r.getMessage() for r in caplog.records if r.getMessage().startswith("not sending PING")]
        assert len(refusals) == 1 and "until the sequence reservation is saved" in refusals[0], refusals
        saving = [r.getMessage() for r in caplog.records if "reservation was not extended" in r.getMessage()]
        assert NO_SPACE in saving[0], saving
        disk.free()
        with trio.fail_after(10):
            while (seq := await node.send_payload((), Ping(nonce=0))) is None:
                await trio.sleep(0.05)
        assert seq > max(used) and json.loads(state.read_text())["seq_reserved"] > seq
        node.request_stop()


def status_json(node: Node) -> str:
    """`p2pnode status --json` for `node`, as a shell user would run it."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(["status", "--json", "--config", str(node.config.source)]) == 0
    return out.getvalue()


async def test_a_checkpoint_that_cannot_be_saved_keeps_the_previous_one_and_learning_goes_on(tmp_path, caplog):
    """A learning node whose disk fills between rounds: each failed save is logged and counted
    (status, Prometheus), the checkpoint on disk still loads, rounds go on, and once there is
    room again the next round's checkpoint is saved."""
    disk = SmallDisk(tmp_path / "disk", 32 << 20)
    caplog.set_level(logging.ERROR, logger="p2pnode")
    sections = learning_sections(0, 1, rounds=100_000, start_peers=0)
    path = disk.path / "data" / CHECKPOINT_NAME
    try:
        async with trio.open_nursery() as nursery:
            node = await start_node(
                nursery,
                tmp_path / "n",
                node={"data_dir": str(disk.path / "data")},
                metrics={"listen": "127.0.0.1:0"},
                **sections,
            )
            await wait_until(lambda: node.driver and node.driver.checkpoint_round is not None, timeout=120)
            driver = node.driver
            # Filled again while waiting: a save in progress frees its temporary file on failure.
            await wait_until(lambda: disk.fill() or driver.checkpoint_failures >= 2, timeout=60)
            on_disk = Checkpoint.load(path, "mapl")  # a valid checkpoint, as a restart would read it
            assert on_disk.round == driver.checkpoint_round < driver.state.completed - 1  # not the last round's
            assert leftovers(disk.path / "data") == ["control.sock"]
            status = json.loads(await trio.to_thread.run_sync(status_json, node))["learning"]
            assert not status["phase"].startswith("failed") and status["checkpoint_failures"] >= 2
            assert NO_SPACE in status["checkpoint_error"] and status["checkpoint_round"] == on_disk.round
            assert f"(on disk: round {on_disk.round}; last error: round" in format_status(node.status())
            scraped = (await scrape(node.metrics_port, b"GET /metrics HTTP/1.1\r\n\r\n")).decode()
            (failures,) = re.findall(r"^p2pnode_checkpoint_failures_total (\S+)$", scraped, flags=re.M)
            assert float(failures) >= 2
            logged = [r.getMessage() for r in caplog.records if "not saved to" in r.getMessage()]
            assert NO_SPACE in logged[0] and "on disk stays valid" in logged[-1], logged
            disk.free()
            await wait_until(lambda: driver.checkpoint_round > on_disk.round, timeout=60)
            assert Checkpoint.load(path, "mapl").round >= driver.checkpoint_round > on_disk.round
            node.request_stop()
    finally:
        disk.unmount()


def test_a_log_file_on_a_full_disk_says_so_once_and_no_traceback(disk, capsys):
    handler = LogFile(str(disk.path / "node.log"))
    record = logging.LogRecord("p2pnode.node", logging.INFO, __file__, 1, "round %d done", (1,), None)
    try:
        disk.fill()
        for _ in range(3):
            handler.handle(record)
        err = capsys.readouterr().err
        assert err == (
            f"p2pnode: [log].file: cannot write {disk.path / 'node.log'}: {NO_SPACE}; "
            "log records are lost until it can\n"
        )
        disk.free()
        handler.handle(record)  # written, with what the buffer still held
        assert "round 1 done" in (disk.path / "node.log").read_text() and capsys.readouterr().err == ""
    finally:
        handler.close()


def test_p2pnode_start_with_a_log_file_it_cannot_open_exits_1_naming_the_setting(tmp_path, disk):
    disk.read_only()
    log = disk.path / "node.log"
    path = write_config(tmp_path / "n", ANY_PORT, log={"file": str(log)})
    done = subprocess.run(
        [sys.executable, "-m", "p2pnode_cli", "start", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr == (
        f"p2pnode: error: [log].file: cannot open {log}: read-only file system (errno 30): "
        "remount its file system read-write\n"
    )


def test_temporary_files_a_killed_node_left_are_removed_once_the_lock_is_held(tmp_path):
    """A node killed during a checkpoint leaves a temporary file as large as the model, one per
    kill; a restart in a container may even reuse the pid in its name. The next start removes them."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    orphans = [data / ".checkpoint.pt.4242.tmp", data / f".state.json.{os.getpid()}.tmp"]
    for orphan in orphans:
        orphan.write_bytes(bytes(4096))
    with DataDir(data) as data_dir:
        assert not any(orphan.exists() for orphan in orphans)
        data_dir.save_state({"seq_reserved": 1})
    assert sorted(p.name for p in data.iterdir()) == ["node.lock", "state.json"]
