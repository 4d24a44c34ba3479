"""trio-rmq against Redis and NATS JetStream: `python -m bench.peers` (see __main__)."""
