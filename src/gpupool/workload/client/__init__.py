"""Talks to a pool: the HTTP client and the embedded (in-process, SQLite) client, behind one interface.

Owns: `PoolClient` (base), `HttpPoolClient` (HTTP/1.1 on a stdlib socket), `EmbeddedClient`, the client
config file, and `connect` / `choose_and_claim` (which pool to use).
May import: core, pooling/ (floor 1) and workload/, not the servers beside it; the standard
library only, because it runs inside the user's container and ships in gpupool-run.pyz.
"""
