"""HTTP API over the pool (FastAPI): auth, TLS, metrics, OpenAPI.

`create_app(pool, auth=...)` builds the ASGI app; `serve(ServerConfig(...))`
runs it with uvicorn (the kube node agent reuses both). FastAPI is imported
by `app` and `serve` only; `auth` and `tls` helpers stay light.

Owns: routes and handlers of /v1, tokens (`auth`: the one door to the token table),
TLS, metrics, serving and the node's enforcement services.
May import: core, floor 1 (pool, store, devices, isolation) and floor 2 (enforcement ...);
FastAPI and uvicorn only in the modules that serve.
"""

from typing import TYPE_CHECKING

from .serve import Prepared, ServerConfig, prepare, run, serve

if TYPE_CHECKING:  # its real signature for type checkers; at run time __getattr__ below loads it
    from .app import create_app as create_app

__all__ = ["ServerConfig", "Prepared", "prepare", "run", "serve"]


def __getattr__(name: str) -> object:
    # create_app pulls in FastAPI: load it only when asked for.
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(name)
