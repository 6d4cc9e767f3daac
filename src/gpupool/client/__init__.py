"""Talks to a pool: the HTTP client and the embedded (in-process, SQLite) client, behind one interface."""
