"""The chaos harness behind `rmq chaos`: seeded fault schedules against real server processes,
and a checker of the history they leave.

* `schedule.py`: which faults strike which nodes when, drawn from a seed (pure);
* `cluster.py`: the nameserver and brokers as processes, every replication link through a
  `link_proxy.py` proxy that can be cut, delayed or made lossy;
* `disk.py` with `disk_shim.c`: slow and full disks through an LD_PRELOAD shim compiled
  from the C source shipped beside it, and torn segment tails;
* `run.py`: one run (cluster, workload with unique ids, faults, read-back) and
  `checker.py`, which judges its history (lost, duplicated, out of order, recovery times);
* `queue_readback.py`: one queue of a broker read back record by record;
* `port_blocks.py`: blocks of loopback ports for processes that bind fixed ports;
* `commands.py`: the typer command.

`port_blocks.py`, `link_proxy.py` and `queue_readback.py` are shipped with the harness and
used by the tests that start real processes as well.
"""
