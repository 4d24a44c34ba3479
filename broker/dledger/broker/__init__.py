"""The broker on DLedger: what makes a DLedger member a RocketMQ broker.

``DLedgerMessageStore`` (message_store.py, RocketMQ's ``DLedgerCommitLog``) puts messages
through the Raft log; the store's CommitLog is the log's data files (commitlog_view.py), read up
to the committed entries committed_dispatch.py makes visible and dispatches in place (the
in-memory stores of tests get copies instead: applier.py, apply_resume.py); log_retention.py
deletes old Raft log files, and the queues follow; roles.py (``DLedgerRoleChangeHandler``) makes the broker master or slave
as the member's Raft role changes.  This layer may import ``broker.dledger.raft``,
``broker.dledger.driver`` and the rest of ``broker``; nothing below imports it.
"""
