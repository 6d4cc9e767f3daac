"""A loopback server without auth answers local callers only: the browser on this machine is not one.

Any web page the user opens can send requests to 127.0.0.1. Two rules keep them out:

- the Host header must name this server: its listen address, localhost, 127.0.0.1 or
  [::1] (any port), or a name given with `--allow-host` (a local proxy's). A page that
  rebinds its own DNS name to 127.0.0.1 still sends its own name: 421;
- a state-changing request (POST, PUT, PATCH, DELETE) must say
  `Content-Type: application/json`: 415. A cross-origin page can send only text/plain,
  form or multipart bodies without asking first, and the server never answers CORS
  (no Access-Control-* headers), so it never gets to ask.
"""

from __future__ import annotations

from typing import Callable, FrozenSet, Iterable, Optional

from .bounds import send_error
from .listener import ASGIApp, Receive, Scope, Send

LOCAL_NAMES = ("localhost", "127.0.0.1", "[::1]", "::1")
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
JSON = "application/json"


def host_name(host: str) -> str:
    """A Host header's name without its port, lower case: '[::1]:80' -> '[::1]', 'a:1' -> 'a'."""
    host = host.strip().lower()
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def allowed_names(listen_host: str, extra: Iterable[str] = ()) -> FrozenSet[str]:
    """The Host names a loopback server answers: its own, the local ones and `extra`."""
    names = {n.lower() for n in LOCAL_NAMES}
    own = listen_host.lower()
    names.add(f"[{own}]" if ":" in own else own)
    names.update(host_name(n) for n in extra if n.strip())
    return frozenset(names)


class LocalOnly:
    """Wraps the app of a loopback server without auth: the Host and Content-Type rules above.

    `served(method, path)` says whether the app has that operation: one it has not is left
    to the app's 404/405, which name what there is.
    """

    def __init__(self, app: ASGIApp, names: FrozenSet[str], served: Callable[[str, str], bool]) -> None:
        self.app = app
        self.names = names
        self.served = served

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host: Optional[str] = None
            content_type = ""
            for name, value in scope["headers"]:
                if name == b"host":
                    host = value.decode("latin-1")
                elif name == b"content-type":
                    content_type = value.decode("latin-1")
            # HTTP/1.1 requires Host (h11 refuses a request without one); an HTTP/1.0 tool may omit it,
            # and no browser does.
            if host is not None and host_name(host) not in self.names:
                shown = host_name(host)[:100]
                await send_error(
                    send,
                    421,
                    "wrong_host",
                    f"this server answers local callers only, not Host {shown!r}: behind a proxy, "
                    f"start it with --allow-host {shown}",
                )
                return
            if (
                scope["method"] in STATE_CHANGING
                and content_type.split(";", 1)[0].strip().lower() != JSON
                and self.served(scope["method"], scope["path"])
            ):
                shown = content_type[:100] or "none"
                await send_error(
                    send,
                    415,
                    "unsupported_media_type",
                    f"{scope['method']} needs Content-Type: {JSON} (got {shown})",
                )
                return
        await self.app(scope, receive, send)
