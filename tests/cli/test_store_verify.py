"""`rmq store verify` on hand-built master/slave stores."""

from __future__ import annotations

import json
import shutil

from typer.testing import CliRunner

from cli.main import app
from common.message import BLANK_MAGIC_CODE, MessageExtBrokerInner
from common.message_encoder import encode_record

SEG = 2048


def write_log(root, n, *, torn_at=None):
    d = root / "commitlog"
    d.mkdir(parents=True)
    phys, segs, buf, base = 0, {}, bytearray(), 0
    for i in range(n):
        rec = encode_record(
            MessageExtBrokerInner(topic="T", queue_id=0, body=b"m%d" % i), i, phys, 1
        )
        if len(buf) + len(rec) + 8 > SEG:
            rem = SEG - len(buf)
            buf += (
                rem.to_bytes(4, "big")
                + BLANK_MAGIC_CODE.to_bytes(4, "big", signed=True)
                + bytes(rem - 8)
            )
            segs[base] = buf
            base += SEG
            phys = base
            buf = bytearray()
            rec = encode_record(
                MessageExtBrokerInner(topic="T", queue_id=0, body=b"m%d" % i), i, phys, 1
            )
        buf += rec
        phys += len(rec)
    segs[base] = buf + bytes(SEG - len(buf))
    for off, data in segs.items():
        (d / f"{off:020d}").write_bytes(bytes(data))
    return d


def run(*args):
    return CliRunner().invoke(app, ["store", "verify", *map(str, args)])


def test_slave_prefix_is_ok_and_json_says_who_is_ahead(tmp_path):
    write_log(tmp_path / "m", 60)
    write_log(tmp_path / "s", 45)
    r = run(tmp_path / "m", tmp_path / "s")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("OK: slave is a byte-identical prefix of master (45 records")
    doc = json.loads(run(tmp_path / "m", tmp_path / "s", "--json").output)
    assert doc["ok"] and doc["ahead"] == "master" and doc["commonRecords"] == 45
    assert doc["master"]["records"] == 60


def test_identical_logs(tmp_path):
    write_log(tmp_path / "m", 30)
    shutil.copytree(tmp_path / "m", tmp_path / "s")
    r = run(tmp_path / "m", tmp_path / "s")
    assert r.exit_code == 0 and "0 bytes behind" in r.output


def test_a_flipped_byte_is_reported_at_its_offset(tmp_path):
    write_log(tmp_path / "m", 60)
    d = write_log(tmp_path / "s", 60)
    seg = d / f"{SEG:020d}"
    data = bytearray(seg.read_bytes())
    size = int.from_bytes(data[0:4], "big")
    data[size + 88] ^= 0x01  # the body of the segment's second record
    seg.write_bytes(bytes(data))
    r = run(tmp_path / "m", tmp_path / "s")
    assert r.exit_code == 2
    assert r.output.strip() == (
        f"DIFFERENT at offset {SEG + size + 88}: bytes differ inside the record at {SEG + size}"
    )
    data[size + 88] ^= 0x01
    data[size + 4] ^= 0x01  # its magic: the slave's log is torn in the middle
    seg.write_bytes(bytes(data))
    r = run(tmp_path / "m", tmp_path / "s")
    assert r.exit_code == 2
    assert r.output.startswith(f"DIFFERENT at offset {SEG + size}: slave's log is torn there")


def test_slave_ahead_fails(tmp_path):
    write_log(tmp_path / "m", 20)
    write_log(tmp_path / "s", 25)
    r = run(tmp_path / "m", tmp_path / "s")
    assert r.exit_code == 2 and r.output.startswith("slave is AHEAD of master")


def test_not_a_store(tmp_path):
    write_log(tmp_path / "m", 1)
    r = run(tmp_path / "m", tmp_path / "missing")
    assert r.exit_code == 1 and "is not a store directory" in r.output
