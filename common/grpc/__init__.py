"""gRPC over HTTP/2 on Trio (``h2`` sans-I/O, one Trio task per connection); see server.py."""
