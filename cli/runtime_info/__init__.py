"""What running brokers say about themselves, read for every part of `rmq` that asks.

A broker answers GET_BROKER_RUNTIME_INFO with a table of strings and GET_BROKER_CONFIG with
its properties. `status.py` reads them into a `BrokerStatus` (role, CommitLog offsets,
replication, asked of one broker or of a whole cluster) and `raft.py` reads a DLedger
member's Raft state (role, term, log indexes, lag behind its leader). `rmq cluster`,
`rmq top`, `rmq dledger` and the `rmq up` readiness probe all read brokers this way, so the
room is their common ground and imports none of them.
"""
