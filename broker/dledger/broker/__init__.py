"""The broker on DLedger: what makes a DLedger member a RocketMQ broker.

``DLedgerMessageStore`` (message_store.py, RocketMQ's ``DLedgerCommitLog``) puts messages
through the Raft log; the applier (applier.py, restart point in apply_resume.py) writes
committed entries into the classic store, which serves every read; log_retention.py deletes
old Raft log files; roles.py (``DLedgerRoleChangeHandler``) makes the broker master or slave
as the member's Raft role changes.  This layer may import ``broker.dledger.raft``,
``broker.dledger.driver`` and the rest of ``broker``; nothing below imports it.
"""
