"""Client configuration: which pool servers to talk to, with which token and CA.

`GPUPOOL_CONFIG` or `~/.gpupool/client.yaml` holds
`{"servers": [{"url": ..., "token": ..., "ca": "ca.crt"}]}` written as JSON
(JSON is valid YAML, and the standard library can read it). `servers.conf`
beside it lists more server URLs, one a line, that share the first entry's
token and CA (the Bitfusion layout). `write_client_bundle` writes all three
files; `gpupool token create` calls it.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple

from ...core.errors import InvalidInput
from ...logs import get_logger

if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

log = get_logger(__name__)

CONFIG_ENV = "GPUPOOL_CONFIG"
TOKEN_ENV = "GPUPOOL_TOKEN"
CONFIG_NAME = "client.yaml"
SERVERS_NAME = "servers.conf"
CA_NAME = "ca.crt"
SCHEMES = ("http://", "https://")


class ServerEntry(NamedTuple):
    """One pool server: its URL, the bearer token, and a CA file for TLS (absolute path)."""

    url: str
    token: str = ""
    ca: str = ""


class ClientConfig(NamedTuple):
    """The servers a client knows, and the file they came from (for messages)."""

    servers: Tuple[ServerEntry, ...] = ()
    path: str = ""
    extra: Mapping[str, Any] = MappingProxyType({})  # the file's other keys

    def entry_for(self, url: str) -> Optional[ServerEntry]:
        """The configured entry of `url` (trailing slashes ignored), if any."""
        wanted = normalize_url(url)
        for entry in self.servers:
            if normalize_url(entry.url) == wanted:
                return entry
        return None


def normalize_url(url: str) -> str:
    """Check the scheme, host and port, and drop a trailing slash; raises InvalidInput otherwise."""
    text = str(url).strip()
    if not text.lower().startswith(SCHEMES):
        raise InvalidInput(f"server URL {url!r} has an unknown scheme: use http://HOST:PORT or https://HOST:PORT")
    text = text.rstrip("/")
    problem = _url_problem(text)
    if problem:
        raise InvalidInput(f"server URL {url!r} is malformed ({problem}): use http://HOST:PORT or https://HOST:PORT")
    return text


def _url_problem(text: str) -> str:
    """What is wrong with an http(s) URL (host, port, characters), or '' when nothing is."""
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in text):
        return "it holds a space or a control character"
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port  # raises ValueError for 'abc' and out-of-range numbers
    except ValueError as err:
        return str(err)
    if not parts.hostname:
        return "no host"
    if port == 0:
        return "port 0"
    return ""


def default_config_path() -> Path:
    """`$GPUPOOL_CONFIG`, else `~/.gpupool/client.yaml`."""
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".gpupool" / CONFIG_NAME


def load_client_config(path: Optional[Path] = None) -> ClientConfig:
    """Read client.yaml and servers.conf; missing files give an empty config."""
    config_path = Path(path) if path else default_config_path()
    servers: List[ServerEntry] = []
    extra: Dict[str, Any] = {}
    if config_path.is_file():
        data = _parse(config_path)
        extra = {k: v for k, v in data.items() if k != "servers"}
        raw = data.get("servers") or []
        if not isinstance(raw, list):
            raise InvalidInput(f"{config_path}: 'servers' must be a list of {{url, token, ca}} objects")
        for item in raw:
            servers.append(_entry(item, config_path))
    elif path is not None or os.environ.get(CONFIG_ENV):
        raise InvalidInput(f"client config {config_path} does not exist: check {CONFIG_ENV} or the path")
    servers_conf = config_path.parent / SERVERS_NAME
    if servers_conf.is_file():
        servers.extend(_servers_conf(servers_conf, servers))
    return ClientConfig(tuple(servers), str(config_path), extra)


def _parse(path: Path) -> Dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as json_err:
        # Hand-written YAML is fine too when PyYAML happens to be installed.
        try:
            import yaml
        except ImportError:
            raise InvalidInput(
                f"{path} is not JSON ({json_err}); write it as JSON, e.g. "
                '{"servers": [{"url": "https://host:8470", "token": "..."}]}'
            ) from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise InvalidInput(f"{path} is neither JSON nor YAML: {err}") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"{path} must hold an object with a 'servers' list")
    return data


def _entry(item: Any, config_path: Path) -> ServerEntry:
    if isinstance(item, str):
        item = {"url": item}
    if not isinstance(item, dict) or not item.get("url"):
        raise InvalidInput(f"{config_path}: each server needs a 'url', got {item!r}")
    ca = str(item.get("ca") or "")
    if ca:
        # The CA path is relative to the config file, so the bundle can move as one folder.
        ca = str((config_path.parent / Path(ca).expanduser()).resolve())
    return ServerEntry(normalize_url(str(item["url"])), str(item.get("token") or ""), ca)


def _servers_conf(path: Path, known: Sequence[ServerEntry]) -> List[ServerEntry]:
    """URLs of servers.conf not already in client.yaml; they borrow the first entry's token and CA."""
    first = known[0] if known else ServerEntry("")
    seen = {normalize_url(e.url) for e in known}
    found: List[ServerEntry] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        if "://" not in text:
            text = "http://" + text  # Bitfusion's servers.conf lists bare HOST:PORT
        try:
            url = normalize_url(text)
        except InvalidInput as err:
            raise InvalidInput(f"{path}:{lineno}: {err.message}") from None
        if url not in seen:
            seen.add(url)
            found.append(ServerEntry(url, first.token, first.ca))
    return found


def client_bundle(urls: Sequence[str], token: str, ca_pem: Optional[str] = None) -> Dict[str, str]:
    """The contents of client.yaml, servers.conf and (with TLS) ca.crt, by file name.

    Args:
        urls: the pool servers this token may use; the first is the default.
        token: the bearer token given to the user.
        ca_pem: PEM text of the CA that signed the servers' certificates.
    """
    if not urls:
        raise InvalidInput("a client bundle needs at least one server URL")
    clean = [normalize_url(u) for u in urls]
    entry: Dict[str, Any] = {"token": token}
    if ca_pem:
        entry["ca"] = CA_NAME
    config = {"servers": [dict(entry, url=u) for u in clean]}
    files = {
        CONFIG_NAME: json.dumps(config, indent=2) + "\n",
        SERVERS_NAME: "# gpupool servers, one URL a line\n" + "".join(u + "\n" for u in clean),
    }
    if ca_pem:
        files[CA_NAME] = ca_pem if ca_pem.endswith("\n") else ca_pem + "\n"
    return files


def write_client_bundle(directory: Path, urls: Sequence[str], token: str, ca_pem: Optional[str] = None) -> List[Path]:
    """Write `client_bundle(...)` into `directory` (created, files mode 0600); returns the paths."""
    target = Path(directory).expanduser()
    target.mkdir(parents=True, exist_ok=True)
    written: List[Path] = []
    for name, content in client_bundle(urls, token, ca_pem).items():
        path = target / name
        # Create with 0600 from the start: the token must never be world-readable, even briefly.
        fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(content)
        os.chmod(str(path), 0o600)
        written.append(path)
    log.info("wrote client bundle to %s", target)
    return written
