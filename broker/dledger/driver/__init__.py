"""The Trio driver of a DLedger member: the node that runs the Raft core on real time and I/O.

``run_dledger_node`` (node.py) owns the core, its timers and one ``PeerReplicator`` per peer;
the network is a seam (transport.py: remoting over TCP; memory_transport.py: in memory, with
faults, for tests) whose bodies are DLedger's JSON (wire.py, entry_json.py).  On disk: the log
in DLedger's format (mmap_file_store.py) and the ``currterm`` and ``checkpoint`` files
(state_files.py), both behind the node's storage seam (node_storage.py).  This layer may import
``broker.dledger.raft``, ``broker.store``'s file primitives and ``common``, never
``broker.dledger.broker`` (tests/test_layering.py checks).
"""
