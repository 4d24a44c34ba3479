"""Coverage-guided fuzzing of the decoders that read bytes from sockets and files (atheris).

Not part of `make test` (it runs until stopped); the hypothesis suite next to it is.  Run:

    .venv/bin/pip install atheris
    .venv/bin/python tests/fuzz/atheris_remoting.py -atheris_runs=2000000

Each input is split by its first byte among the targets: remoting frames (fed in pieces to a
FrameDecoder with a small maximum), a JSON header, a binary header, CommitLog records, the HA
transfer stream and a DLedger body.  Each target may return or raise its declared decode error;
anything else is reported by atheris as a crash with the input that caused it.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import atheris

with atheris.instrument_imports():
    from broker.dledger.driver import wire
    from broker.ha.protocol import HAProtocolError, TransferDecoder
    from common.errors import ProtocolError
    from common.message import RecordDecodeError, decode_records
    from common.remoting.codec import FrameDecoder, decode_binary_header, decode_json_header
    from common.remoting.codes import DLedgerRequestCode

_DLEDGER_CODES = [int(c) for c in DLedgerRequestCode]


def one_input(data: bytes) -> None:
    if not data:
        return
    target, rest = data[0] % 6, data[1:]
    try:
        if target == 0:
            decoder = FrameDecoder(max_frame_length=1 << 16)
            step = max(1, data[0] // 6)
            for i in range(0, len(rest), step):
                decoder.feed(rest[i : i + step])
        elif target == 1:
            decode_json_header(rest)
        elif target == 2:
            decode_binary_header(rest)
        elif target == 3:
            decode_records(rest, check_crc=True)
        elif target == 4:
            TransferDecoder(max_body_size=1 << 16).feed(rest)
        else:
            code = _DLEDGER_CODES[data[0] % len(_DLEDGER_CODES)]
            wire.decode_request(code, rest)
            wire.decode_response(code, rest)
    except (ProtocolError, RecordDecodeError, HAProtocolError, wire.WireError):
        pass


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
