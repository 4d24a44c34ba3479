"""`rmq bench produce|consume`: the load generator.

* `load.py`: the produce and consume loops over the `rmq` client, their results (msg/s,
  MB/s, latency percentiles) and summaries over several runs;
* `commands.py`: the typer commands, with a progress bar on stderr.
"""
