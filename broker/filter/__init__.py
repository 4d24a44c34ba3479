"""SQL92 message filters (RocketMQ's ``filter`` module and ``broker/filter``).

``tokens`` (the lexer) -> ``selector_parser`` (RocketMQ's ``SelectorParser.jj`` grammar, building an
``expression`` tree with the same construction checks) -> ``evaluation`` (RocketMQ's typing and
null rules, compiled to closures) -> ``message_filter`` (what a pull filters records with) and
``consumer_filter_manager`` (the compiled expressions of the groups, bounded).  All sans-I/O.
The grammar with an example per construct: docs/sql92.md.
"""
