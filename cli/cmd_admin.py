"""mqadmin-style commands: cluster, broker status, topic, group, message, produce, consume.

Each command parses its options, runs one coroutine through `_run` (errors a user can cause
-> one `error:` line on stderr, exit 1) and hands the result to `cli/admin_render.py`, which
prints tables or, with `--json`, one JSON document on stdout. They live in one module per
area, sharing only `cli/admin_options.py`:

* `cli/cmd_cluster.py`: `rmq cluster [list]`, `rmq broker status ADDR`;
* `cli/cmd_topic.py`: `rmq topic create|update|delete|list|route|status`;
* `cli/cmd_group.py`: `rmq group list|progress`;
* `cli/cmd_message.py`: `rmq message query`;
* `cli/cmd_produce_consume.py`: `rmq produce`, `rmq consume`.

Importing this module registers them all on `app`. `rmq --help` lists commands and groups in
the order they were registered, and that order is the order of the import below (produce,
consume; then the cluster, broker, group and message groups, ahead of `cli/main.py`'s later
modules); tests/cli/test_help_order.py holds it.
"""

from __future__ import annotations

from cli import cmd_cluster, cmd_group, cmd_message, cmd_produce_consume, cmd_topic  # noqa: F401
