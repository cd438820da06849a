"""`p2pnode bench protocol`: what the signed envelope costs over bare Ed25519.

For each payload size, one MODEL frame carrying a float32 tensor of that many bytes is timed
through the full send path (sequence number, validation, msgpack, signature) and receive path
(decode, signature check, tensor checks, replay guard), next to bare Ed25519 sign and verify of
the very bytes that frame signs. Overhead = (encode + decode) / (sign + verify) - 1.
"""

from __future__ import annotations

import os
import platform
import time

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from protocol import SIGNATURE_SIZE, Decoder, Encoder, Identity, Model, ReplayGuard, SequenceCounter
from tools.bench.timing import interleaved

DEFAULT_SIZES = (1024, 20 * 1024, 200 * 1024)
GOAL_OVERHEAD = 0.10
_NETWORK = "bench"


def _clock_us() -> int:
    return time.time_ns() // 1000


def measure_size(payload_bytes: int, *, trials: int, target_seconds: float, seed: int = 0) -> dict:
    identity = Identity.generate()
    public_key = Ed25519PublicKey.from_public_bytes(identity.public_key)
    rng = np.random.default_rng(seed)
    body = Model(kind="params", tensors={"weight": rng.standard_normal(payload_bytes // 4, dtype=np.float32)})
    now = _clock_us()
    counter = SequenceCounter(persisted=0, now_us=now, block=1 << 40)
    counter.confirm_reservation(counter.propose_reservation())
    encoder, decoder, guard = Encoder(identity, _NETWORK), Decoder(_NETWORK), ReplayGuard()
    guard.trust(identity.public_key, 0)  # an admitted peer: its window is checked, as in the daemon
    frame = encoder.encode(body, seq=counter.next(), timestamp_us=now, round=0)
    signed, signature = frame[:-SIGNATURE_SIZE], frame[-SIGNATURE_SIZE:]
    receive_seq = iter(range(1, 1 << 62))

    def encode() -> bytes:
        return encoder.encode(body, seq=counter.next(), timestamp_us=now, round=0)

    def decode() -> None:
        envelope = decoder.decode(frame)
        # Each call stands for a new frame: the guard sees a fresh sequence number.
        guard.admit(envelope.sender, next(receive_seq), envelope.timestamp_us, now)

    seconds = interleaved(
        {
            "encode": encode,
            "decode": decode,
            "sign": lambda: identity.sign(signed),
            "verify": lambda: public_key.verify(signature, signed),
        },
        trials=trials,
        target_seconds=target_seconds,
    )
    envelope_s = seconds["encode"] + seconds["decode"]
    bare_s = seconds["sign"] + seconds["verify"]
    return {
        "payload_bytes": payload_bytes,
        "frame_bytes": len(frame),
        **{f"{name}_per_s": round(1 / s, 1) for name, s in seconds.items()},
        **{f"{name}_us": round(s * 1e6, 2) for name, s in seconds.items()},
        "encode_overhead": round(seconds["encode"] / seconds["sign"] - 1, 4),
        "decode_overhead": round(seconds["decode"] / seconds["verify"] - 1, 4),
        "overhead": round(envelope_s / bare_s - 1, 4),
        "goal_met": envelope_s / bare_s - 1 <= GOAL_OVERHEAD,
    }


def run(sizes=DEFAULT_SIZES, *, trials: int = 9, seconds: float = 0.1) -> dict:
    return {
        "benchmark": "protocol",
        "goal": f"overhead = (encode + decode) / (sign + verify) - 1 <= {GOAL_OVERHEAD}",
        "method": (
            f"median of {trials} interleaved trials of ~{seconds} s each, one process, "
            "the garbage collector off inside the timed loops"
        ),
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "results": [measure_size(size, trials=trials, target_seconds=seconds) for size in sizes],
    }


def format_table(report: dict) -> str:
    lines = [
        f"{'payload':>9} {'frame':>8} {'encode/s':>10} {'sign/s':>10} {'decode/s':>10} {'verify/s':>10} "
        f"{'overhead':>9}  goal<=10%",
    ]
    for r in report["results"]:
        lines.append(
            f"{r['payload_bytes']:>9} {r['frame_bytes']:>8} {r['encode_per_s']:>10.0f} {r['sign_per_s']:>10.0f} "
            f"{r['decode_per_s']:>10.0f} {r['verify_per_s']:>10.0f} {r['overhead']:>+9.1%}  "
            f"{'yes' if r['goal_met'] else 'NO'}"
        )
    lines.append(report["method"] + "; overhead = (encode + decode) / (sign + verify) - 1")
    return "\n".join(lines)


def settings() -> dict:
    """What differs from a user's defaults: nothing (the frames are a node's own)."""
    return {}


def render(result: dict) -> str:
    """BENCHMARKS.md's table: the rates of the middle run, the overhead of every run."""
    runs = result["data"]["runs"]
    middle = runs[len(runs) // 2]
    rows = [
        "| payload | frame bytes | encode/s | sign/s | decode/s | verify/s | "
        f"overhead ({len(runs)} run{'s' if len(runs) > 1 else ''}) | goal ≤ {GOAL_OVERHEAD:.0%} |",
        "|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for index, row in enumerate(middle["results"]):
        overheads = [run["results"][index]["overhead"] for run in runs]
        rate = {
            name: f"{row[f'{name}_per_s']:,.0f}".replace(",", " ") for name in ("encode", "sign", "decode", "verify")
        }
        rows.append(
            f"| {_size(row['payload_bytes'])} | {row['frame_bytes']:,} ".replace(",", " ")
            + f"| {rate['encode']} | {rate['sign']} | {rate['decode']} | {rate['verify']} | "
            + ", ".join(f"{value:+.1%}" for value in overheads).replace("%", " %")
            + f" | {'met' if all(value <= GOAL_OVERHEAD for value in overheads) else 'not met'} |"
        )
    rows.append("")
    rows.append(f"Rates from the middle run; {middle['method']}.")
    return "\n".join(rows)


def _size(payload: int) -> str:
    return f"{payload // 1024} KiB" if payload % 1024 == 0 else f"{payload} B"
