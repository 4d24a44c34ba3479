"""Message trace (RocketMQ 4.9's ``client/trace``): what a traced client records, how it is
written to the trace topic, and how traces are read back.

- ``encoder``: the trace records and ``TraceDataEncoder``'s text layout, both ways;
- ``dispatcher``: the bounded, batching writer that keeps tracing off the send path;
- ``hooks``: the send and consume records built from a client's sends and listener calls;
- ``view``: a message's timeline from the trace messages found by its msgId.
"""
