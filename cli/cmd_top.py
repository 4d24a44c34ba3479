"""`rmq top` (being built; commands are added here)."""
