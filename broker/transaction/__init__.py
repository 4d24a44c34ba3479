"""Transactional messages (RocketMQ ``broker/.../transaction``, apache/rocketmq 4.9), split as
RocketMQ splits them: ``bridge`` (the half and op topics in the store), ``check`` (the
decisions, sans-I/O), ``service`` (prepare, end, one check round), ``check_listener`` (the
check sent to a producer, CHECK_TRANSACTION_STATE) and ``check_service`` (the periodic task of
a master).  END_TRANSACTION is ``broker/processor/end_transaction.py``; the send path stores a
TRAN_MSG=true send as a half message (``broker/processor/send.py``)."""
