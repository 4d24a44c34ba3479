"""`rmq dledger`: acting on DLedger groups on purpose.

* `transfer.py`: `leadership-transfer` moves a group's leadership to a chosen member
  (find the group and its leader, DLedger's LEADERSHIP_TRANSFER, wait for the new leader);
* `commands.py`: the typer command and the line it prints.

The members' Raft state is read in `cli/runtime_info/raft.py` and shown by `rmq cluster` and
`rmq top`; `rmq up --dledger N` plans groups in `cli/local/dledger_plan.py`.
"""
