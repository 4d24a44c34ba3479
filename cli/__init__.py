"""The rmq command-line tool.

Shared by every part: `app.py` (the typer app), `errors.py` (the error policy), `render.py`
(plain output), `namesrv_address.py`. `main.py` is the console script and registers every
command. The commands and what they run live in one subpackage per concept: `servers/`,
`local/`, `runtime_info/`, `admin/`, `messages/`, `top/`, `dledger/`, `bench/`, `chaos/`
(docs/design.md, "The rmq command").
"""
