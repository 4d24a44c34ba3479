"""The rmq command-line tool."""
