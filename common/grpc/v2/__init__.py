"""RocketMQ 5's gRPC messages (apache/rocketmq-apis ``apache/rocketmq/v2``), generated.

``definition_pb2`` and ``service_pb2`` (with their ``.pyi`` stubs for mypy) are protoc's output,
committed rather than built at install time: installing trio-rmq then needs no protoc and no
grpcio-tools, only the ``protobuf`` runtime. Regenerate them with ``generate.py`` in this package
(its docstring says how, and which protobuf runtime the result needs). Do not edit them by hand.

Generated from apache/rocketmq-apis commit 3e60073c6dab3430feaec443824802e23ecda681.
"""

SERVICE = "apache.rocketmq.v2.MessagingService"


def method_path(name: str) -> str:
    """The HTTP/2 ``:path`` of a MessagingService method, e.g. ``/apache...Service/SendMessage``."""
    return f"/{SERVICE}/{name}"
