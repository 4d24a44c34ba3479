"""`rmq top`: the live view of a cluster.

* `model.py`: one snapshot of the cluster per refresh, as plain values (nodes, topics,
  groups, rates, replication lag), collected with every node bounded by a timeout;
* `screen.py`: a snapshot drawn as rich tables that fit the terminal, and the live loop
  that redraws them;
* `commands.py`: the typer command.
"""
