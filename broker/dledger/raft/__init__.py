"""The sans-I/O Raft core of a DLedger member (openmessaging/dledger 0.3.1.2's protocol).

``RaftCore`` (core.py) is called with what happened and the current time and returns actions
for the driver to run in order; it owns no socket, timer, clock or file.  The log it writes is
injected (log.py: the ``RaftLog`` Protocol and ``MemoryLog``).  This layer may import only
itself, the standard library, attrs and ``common.remoting.codes``: no Trio, no I/O, nothing of
``broker.dledger.driver`` or ``broker.dledger.broker`` (tests/test_layering.py checks), so the
same code runs under the Trio driver and in the seeded simulator
(tests/broker/dledger/simulator.py).
"""
