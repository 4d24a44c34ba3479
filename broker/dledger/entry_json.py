"""One DLedgerEntry as DLedger's JSON writes it (fastjson: properties in alphabetical order,
the body in base64), kept for the next push of the same Entry.

Theory of operation: the leader pushes every entry to each follower, so the rendering is the
same bytes several times; the log hands out one Entry object per fresh entry (its cache of the
newest entries), so a small table keyed by the object's identity serves the second follower.
The table holds the entry too, so an id is never reused while its key is present; it is
bounded (oldest out first).  Only the event loop's thread renders.
"""

from __future__ import annotations

import collections

import pybase64

from broker.dledger.messages import ENTRY_HEADER_SIZE, Entry

__all__ = ["entry_json"]

# id(entry) -> (entry, its rendering); see the module doc
_RENDERED: collections.OrderedDict[int, tuple[Entry, bytes]] = collections.OrderedDict()
_RENDERED_MAX = 4096


def entry_json(entry: Entry) -> bytes:
    """The fastjson rendering of one DLedgerEntry (kept for the next push of the object)."""
    hit = _RENDERED.get(id(entry))
    if hit is not None and hit[0] is entry:
        return hit[1]
    text = _render_entry(entry)
    if len(_RENDERED) >= _RENDERED_MAX:
        _RENDERED.popitem(last=False)  # the oldest (O(1), unlike deleting a plain dict's first)
    _RENDERED[id(entry)] = (entry, text)
    return text


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
