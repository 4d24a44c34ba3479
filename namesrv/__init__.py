"""The nameserver: broker liveness and topic routes."""
