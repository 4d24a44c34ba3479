"""The pipeline's own errors, in a leaf module so every pipeline module can raise them.

`OptionError` is raised while options are parsed (`pipeline/options.py`) and while offsets in
them are read (`pipeline/offsets.py`), which options itself imports.
"""


class OptionError(ValueError):
    """A reader option is missing, malformed, or contradicts another; the message names it."""
