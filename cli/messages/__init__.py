"""`rmq produce` and `rmq consume`: sending messages and reading a topic from the command line.

* `produce.py`: stdin lines (or arguments) sent as they arrive, in batches, keeping the order
  of the lines within a queue; `produce_display.py`: what `rmq produce` shows meanwhile (a
  line per message, a progress bar, or one JSON document);
* `consume.py`: every queue of a topic long-polled concurrently from the group's offset (or
  the start), offsets committed on the way out;
* `commands.py`: the two typer commands.
"""
