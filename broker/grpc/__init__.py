"""RocketMQ 5's gRPC MessagingService served by the broker itself (the proxy's "local" mode).

See ``broker/grpc/service.py`` for the theory of operation.
"""
