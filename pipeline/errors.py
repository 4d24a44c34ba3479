"""The pipeline's own errors, in a leaf module so every pipeline module can raise them.

`OptionError` is raised while options are parsed (`pipeline/options.py`) and while offsets in
them are read (`pipeline/source_offsets.py`), which options itself imports. `DataLossError` is
raised by the live source's driver (`pipeline/live_cluster.py`) when it plans a query and by its
executors (`pipeline/live_reader.py`) when they read.
"""


class OptionError(ValueError):
    """A reader option is missing, malformed, or contradicts another; the message names it."""


class DataLossError(RuntimeError):
    """Offsets a query planned to read are gone (retention) or never existed (store replaced)."""
