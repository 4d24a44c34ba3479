"""mqadmin-style commands: what the cluster, its topics, groups, messages and stores hold.

Each command parses its options, runs one coroutine through `_run` (errors a user can cause
-> one `error:` line on stderr, exit 1) and hands the result to `render.py`, which prints
tables or, with `--json`, one JSON document on stdout. One module per area, sharing only
`options.py` (the `--json` and `--cluster` options, the Admin client on `--namesrv`):

* `cluster.py`: `rmq cluster [list]`, `rmq broker status ADDR`;
* `topic.py`: `rmq topic create|update|delete|list|route|status`;
* `group.py`: `rmq group list|progress|create|delete|describe`;
* `broker_ops.py`: `rmq broker config get|set`, `rmq broker perm wipe|add`;
* `producer.py`: `rmq producer list`; `stats.py`: `rmq stats` (their output: `render_ops.py`);
* `message.py`: `rmq message query`;
* `store.py`: `rmq store verify`, offline, over `store_verify.py` (and `dledger_store_verify.py`
  for stores in RocketMQ's DLedger layout).
"""
