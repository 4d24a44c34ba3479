"""`rmq bench` (being built; commands are added here)."""
