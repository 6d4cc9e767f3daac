"""Command line: one module per verb group, each thin (parse, call one function, print)."""
