"""The compiled part of the product; everything else is declared in pyproject.toml.

``broker.store._record_check`` is the record check crash recovery runs over the CommitLog
(broker/store/_record_check.c, linked against the system zlib). It is optional: where it
cannot be built (no compiler, no zlib headers) the install still succeeds and the store checks
the same records the same way with numpy, slower (broker/store/commitlog_scan.py).

``common.remoting._json_header`` reads and writes the usual JSON remoting header
(common/remoting/_json_header.c). It is optional too: without it common/remoting/codec.py does
the same in Python, slower.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "broker.store._record_check",
            ["broker/store/_record_check.c"],
            libraries=["z"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "common.remoting._json_header",
            ["common/remoting/_json_header.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
