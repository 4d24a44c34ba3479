"""One DLedgerEntry as DLedger's JSON writes it (fastjson: properties in alphabetical order,
the body in base64), kept for the next push of the same Entry.

Theory of operation: the leader pushes every entry to each follower, so the rendering is the
same bytes several times; the log hands out one Entry object per fresh entry (its cache of the
newest entries), so a small table keyed by the object's identity serves the second follower.
The table holds the entry too, so an id is never reused while its key is present; it is
bounded in entries and in bytes (oldest out first: an entry is one record, up to 4 MiB), and
``forget_renderings`` empties it when the log goes quiet (node_storage.py), so an idle leader holds
none of it.  Only the event loop's thread renders or forgets.
"""

from __future__ import annotations

import collections

import pybase64

from broker.dledger.raft.messages import ENTRY_HEADER_SIZE, Entry

__all__ = ["entry_json", "forget_renderings"]

# id(entry) -> (entry, its rendering); see the module doc
_RENDERED: collections.OrderedDict[int, tuple[Entry, bytes]] = collections.OrderedDict()
_RENDERED_MAX = 4096
_RENDERED_MAX_BYTES = 32 << 20
# the bodies and renderings held in _RENDERED
_held = 0


def entry_json(entry: Entry) -> bytes:
    """The fastjson rendering of one DLedgerEntry (kept for the next push of the object)."""
    hit = _RENDERED.get(id(entry))
    if hit is not None and hit[0] is entry:
        return hit[1]
    global _held
    text = _render_entry(entry)
    held = _held + len(entry.body) + len(text)
    while _RENDERED and (len(_RENDERED) >= _RENDERED_MAX or held > _RENDERED_MAX_BYTES):
        # the oldest (O(1), unlike deleting a plain dict's first)
        _, (old, old_text) = _RENDERED.popitem(last=False)
        held -= len(old.body) + len(old_text)
    _RENDERED[id(entry)] = (entry, text)
    _held = held
    return text


def forget_renderings() -> None:
    """Empty the table (the log went quiet: no push of a fresh entry is coming)."""
    global _held
    _RENDERED.clear()
    _held = 0


def _render_entry(entry: Entry) -> bytes:
    return (
        b'{"body":"%s","bodyCrc":0,"chainCrc":0,"channel":%d,"index":%d,"magic":%d,'
        b'"pos":%d,"size":%d,"term":%d}'
        % (
            pybase64.b64encode(entry.body),
            entry.channel,
            entry.index,
            entry.magic,
            entry.pos,
            ENTRY_HEADER_SIZE + len(entry.body),
            entry.term,
        )
    )
