"""Command line: one module per verb group, each thin (parse, call one function, print).

Owns: argument parsing, output formats and exit codes (from the error classes).
May import: every floor (4, the top); heavy imports inside handlers.
"""
