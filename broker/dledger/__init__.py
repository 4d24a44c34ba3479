"""RocketMQ's DLedger mode: a broker group whose members share one Raft-replicated log.

Three layers, each a subpackage, imports pointing down only (tests/test_layering.py checks):

* ``raft/``: the sans-I/O Raft core (DLedger's protocol): messages, the log Protocol and the
  in-memory log, the member state, election, the leader's entry pusher, the follower's entry
  handler.  Calls in, actions out; no Trio, no clock, no files.
* ``driver/``: the Trio node that runs the core: timers, the network (remoting wire, in-memory
  network), the log and state files on disk, proposals.
* ``broker/``: the broker on DLedger: the message store whose writes go through the Raft log,
  the apply into the classic store, the log's retention and the broker's role changes.

broker/dledger/README.md is the theory of operation.
"""
