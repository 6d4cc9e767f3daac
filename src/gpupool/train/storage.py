"""Object storage: every path the trainer and the job spec take, local or `s3://`, `gs://`,
`az://` and `file://` URLs, through fsspec (s3fs, gcsfs, adlfs: the `objstore` extra).

This is the one module that opens files by URL. Credentials are found the way each SDK finds
them (environment, profile, workload identity); none is ever passed through here. Failures
become one-line `StorageError`s naming the URL and the fix, with whatever secret a URL carries
(`user:password@`, a presigned URL's signature) written as *** (`redact`). fsspec is imported at
first use, so local paths never need it.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import uuid
from pathlib import Path
from typing import IO, Any, Callable, Iterator, List, Tuple, Union

from gpupool.core.errors import InvalidInput

PathLike = Union[str, Path]
# scheme -> the package that speaks it (the objstore extra installs all three)
BACKENDS = {
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "az": "adlfs",
    "abfs": "adlfs",
    "abfss": "adlfs",
    "file": "fsspec",
}
TMP_PREFIX = ".tmp-"  # objects being written; never taken as finished files
_CREDENTIALS = {
    "s3fs": "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or an instance/pod role",
    "gcsfs": "GOOGLE_APPLICATION_CREDENTIALS or workload identity",
    "adlfs": "AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_ACCOUNT_NAME with a key, or a managed identity",
    "fsspec": "file permissions",
}


# Query parameters that are a signature or a credential: a presigned S3 URL, a signed GCS URL, an
# Azure SAS, an OAuth token. Lower case; a URL's parameter names are compared in lower case.
SECRET_QUERY_KEYS = frozenset(
    {
        "x-amz-signature",
        "x-amz-credential",
        "x-amz-security-token",
        "awsaccesskeyid",
        "signature",
        "x-goog-signature",
        "x-goog-credential",
        "googleaccessid",
        "sig",
        "access_token",
    }
)
REDACTED = "***"
# scheme://USER:PASSWORD@ (the password up to the last '@' before a space or a quote: an AWS secret key
# has '/' in it, and people write a raw '@') or scheme://TOKEN@ (up to the path) ...
_USERINFO_RE = re.compile(r"(\b([A-Za-z][A-Za-z0-9+.-]*)://)(?:[^/\s'\"@:]*:[^\s'\"]*|[^/\s'\"@:]+)@")
# ... but for Azure's CONTAINER@ACCOUNT (adlfs' own form), which names no secret.
_CONTAINER_AT_ACCOUNT = frozenset({"az", "abfs", "abfss"})
_SECRET_QUERY_RE = re.compile(
    r"([?&](?:" + "|".join(re.escape(k) for k in sorted(SECRET_QUERY_KEYS)) + r")=)[^&#\s'\"]*", re.IGNORECASE
)


def _is_userinfo(match: re.Match[str]) -> bool:
    return ":" in match.group(0)[len(match.group(1)) :] or match.group(2).lower() not in _CONTAINER_AT_ACCOUNT


def redact(text: str) -> str:
    """`text` with each URL's user and password, and each signature or credential of a query, as ***:
    for any message or printout that may hold a URL someone wrote with a secret in it."""
    hidden = _USERINFO_RE.sub(lambda m: f"{m.group(1)}{REDACTED}@" if _is_userinfo(m) else m.group(0), text)
    return _SECRET_QUERY_RE.sub(rf"\g<1>{REDACTED}", hidden)


def has_userinfo(url: str) -> bool:
    """Whether `url` names a user, a password or a token before its host (what `redact` hides)."""
    match = _USERINFO_RE.match(url.strip())
    return match is not None and _is_userinfo(match)


def secret_query_keys(url: str) -> List[str]:
    """The query parameters of `url` that carry a signature or credential (SECRET_QUERY_KEYS)."""
    query = url.partition("?")[2].partition("#")[0]
    names = (part.partition("=")[0] for part in query.split("&") if part)
    return [name for name in names if name.lower() in SECRET_QUERY_KEYS]


class StorageError(InvalidInput):
    """A URL that cannot be read or written: missing bucket, refused credentials, bad scheme.
    Its message never shows a secret a URL carries (`redact`), whatever the backend said."""

    code = "storage"

    def __init__(self, message: str) -> None:
        super().__init__(redact(message))


def scheme(path: PathLike) -> str:
    """The URL's scheme in lower case, "" for a local path."""
    text = str(path)
    head, sep, _ = text.partition("://")
    return head.lower() if sep and head.replace("+", "").isalnum() else ""


def is_url(path: PathLike) -> bool:
    """Whether PATH is a URL (any scheme; an unknown one fails when used), not a local path."""
    return bool(scheme(path))


def is_remote(path: PathLike) -> bool:
    """A URL that is not on this machine's file system (`file://` is)."""
    return scheme(path) not in ("", "file")


def local_path(path: PathLike) -> Path:
    """A local path or `file://` URL as a Path."""
    text = str(path)
    return Path(text[len("file://") :]) if scheme(text) == "file" else Path(text)


def join(base: PathLike, *parts: str) -> str:
    """BASE/part/...: posix joining for URLs, os.path for local paths."""
    text = str(base)
    if is_url(text):
        return posixpath.join(text.rstrip("/") or text, *parts)
    return os.path.join(text, *parts)


def name(path: PathLike) -> str:
    """The last component of a path or URL."""
    return posixpath.basename(str(path).rstrip("/"))


def _backend(url: str) -> str:
    proto = scheme(url)
    if proto not in BACKENDS:
        raise StorageError(
            f"{url}: unknown scheme {proto!r}; use a local path or an s3://, gs://, az:// or file:// URL"
        )
    return BACKENDS[proto]


def filesystem(path: PathLike) -> Tuple[Any, str]:
    """(fsspec filesystem, path inside it) for a URL or local path."""
    text = str(path)
    if not is_url(text):
        text = "file://" + os.path.abspath(text)
    package = _backend(text)
    try:
        import fsspec
    except ImportError:
        raise StorageError(f"{text}: fsspec is not installed; pip install 'gpupool[objstore]'") from None
    try:
        fs, inner = fsspec.core.url_to_fs(text)
    except ImportError:
        raise StorageError(f"{text} needs {package}, which is not installed; pip install 'gpupool[objstore]'") from None
    except (ValueError, OSError) as err:
        raise StorageError(f"{text}: {_first_line(err)}; check the URL") from None
    return fs, inner


def _first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0]


@contextlib.contextmanager
def errors(url: PathLike, missing_ok: bool = False) -> Iterator[None]:
    """Turn a backend's failure on URL into a one-line StorageError naming the fix."""
    text = str(url)
    try:
        yield
    except StorageError:
        raise
    except FileNotFoundError:
        if missing_ok:
            return
        # The backends' messages differ (and may hold the bucket's own name): ask the store.
        if _bucket_missing(text):
            raise StorageError(f"{text}: the bucket does not exist; create it or fix the URL") from None
        raise StorageError(f"{text} does not exist; check the URL") from None
    except PermissionError:
        creds = _CREDENTIALS.get(BACKENDS.get(scheme(text) or "file", "fsspec"), "")
        raise StorageError(
            f"{text}: access refused; give credentials the SDK finds ({creds}) with rights on this path"
        ) from None
    except IsADirectoryError:
        raise StorageError(f"{text} is a folder; give a file") from None
    except (OSError, ValueError) as err:
        raise StorageError(f"{text}: {_first_line(err)}; check the URL, the endpoint and the credentials") from None
    except Exception as err:  # botocore/google/azure exceptions are not OSErrors everywhere
        if type(err).__module__.split(".")[0] in ("botocore", "aiobotocore", "google", "azure", "aiohttp"):
            raise StorageError(
                f"{text}: {type(err).__name__}: {_first_line(err)}; check the endpoint and the credentials"
            ) from None
        raise


def _bucket_missing(url: str) -> bool:
    """Whether URL's bucket (container) is absent; asked only once a path was not found, since
    not every store says which of the two was missing."""
    if not is_remote(url):
        return False
    try:
        fs, inner = filesystem(url)
        return not fs.exists(inner.split("/", 1)[0])
    except Exception:  # the question is only for a better message
        return False


def exists(path: PathLike) -> bool:
    """Whether a file or folder is at PATH (a missing bucket reads as False)."""
    fs, inner = filesystem(path)
    with errors(path, missing_ok=True):
        fs.invalidate_cache()
        return bool(fs.exists(inner))
    return False


def require_bucket(url: PathLike) -> None:
    """Fail now, naming the fix, when URL's bucket is missing or refused (before any work is done
    that would only find out at its first save)."""
    if not is_remote(url):
        return
    fs, inner = filesystem(url)
    bucket = inner.split("/", 1)[0]
    with errors(url):
        fs.invalidate_cache()
        if not fs.exists(bucket):
            raise FileNotFoundError("bucket does not exist")


def read_bytes(path: PathLike) -> bytes:
    """The whole file."""
    fs, inner = filesystem(path)
    with errors(path):
        data: bytes = fs.cat_file(inner)
        return data
    raise AssertionError("unreachable")  # errors() re-raises everything but missing_ok


def read_text(path: PathLike) -> str:
    """The whole file as UTF-8 text."""
    return read_bytes(path).decode()


@contextlib.contextmanager
def open_file(path: PathLike, mode: str = "rb") -> Iterator[IO[Any]]:
    """An open file object, errors mapped as everywhere here (writes are not atomic: see put)."""
    fs, inner = filesystem(path)
    with errors(path):
        if "w" in mode and fs.protocol in ("file", ("file", "local")):
            fs.makedirs(posixpath.dirname(inner), exist_ok=True)
        with fs.open(inner, mode) as f:
            yield f


def _tmp_name(inner: str) -> str:
    head, tail = posixpath.split(inner)
    return posixpath.join(head, f"{TMP_PREFIX}{tail}.{os.getpid()}.{uuid.uuid4().hex[:8]}")


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocol


def put_file(local: PathLike, path: PathLike) -> None:
    """Copy a local file to PATH atomically: written under a temporary name beside it, then
    renamed (a local rename, or the store's server-side copy), so a kill at any instant
    leaves the old file or the new one, never a torn one under PATH's name."""

    def copy(dst: IO[bytes]) -> None:
        with open(local, "rb") as src:
            while chunk := src.read(1 << 22):
                dst.write(chunk)

    _atomic_write(path, copy, lambda fs, tmp: fs.put_file(str(local), tmp))


def write_bytes(path: PathLike, data: bytes) -> None:
    """Write DATA to PATH atomically (see put_file)."""
    _atomic_write(path, lambda dst: dst.write(data), lambda fs, tmp: fs.pipe_file(tmp, data))


def _atomic_write(
    path: PathLike, write_local: Callable[[IO[bytes]], object], write_remote: Callable[[Any, str], object]
) -> None:
    """PATH's content written under a temporary name beside it, then renamed over PATH (put_file)."""
    fs, inner = filesystem(path)
    tmp = _tmp_name(inner)
    with errors(path):
        if _is_local(fs):
            os.makedirs(posixpath.dirname(inner), exist_ok=True)
            with open(tmp, "wb") as dst:
                write_local(dst)
                dst.flush()
                os.fsync(dst.fileno())
            os.replace(tmp, inner)
            return
        try:
            write_remote(fs, tmp)
            fs.mv(tmp, inner)
        except BaseException:
            with contextlib.suppress(Exception):
                fs.rm_file(tmp)
            raise
        finally:
            fs.invalidate_cache(posixpath.dirname(inner))


def get_file(path: PathLike, local: PathLike) -> None:
    """Copy PATH to a local file atomically (temporary name, then rename)."""
    fs, inner = filesystem(path)
    dest = Path(local)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f"{TMP_PREFIX}{dest.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    with errors(path):
        try:
            fs.get_file(inner, str(tmp))
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)


def rename(src: PathLike, dst: PathLike) -> None:
    """Move SRC to DST within one store."""
    fs, inner_src = filesystem(src)
    _, inner_dst = filesystem(dst)
    with errors(src):
        fs.mv(inner_src, inner_dst)
        fs.invalidate_cache()


def remove(path: PathLike) -> None:
    """Delete one file; a missing one is fine."""
    fs, inner = filesystem(path)
    with errors(path, missing_ok=True):
        fs.rm_file(inner)
        fs.invalidate_cache(posixpath.dirname(inner))


def listdir(path: PathLike) -> List[str]:
    """Names directly under PATH (files and folders), sorted; [] when there is none."""
    fs, inner = filesystem(path)
    with errors(path, missing_ok=True):
        fs.invalidate_cache(inner)
        entries = fs.ls(inner, detail=False)
        return sorted(posixpath.basename(str(e).rstrip("/")) for e in entries)
    return []


def find(path: PathLike) -> List[str]:
    """Every file under PATH as a posix path relative to it, sorted, in one listing.

    Raises StorageError when PATH or its bucket does not exist."""
    fs, inner = filesystem(path)
    with errors(path):
        fs.invalidate_cache(inner)
        if not fs.exists(inner):
            raise FileNotFoundError(inner)
        root = inner.rstrip("/")
        files = fs.find(root)
        return sorted(posixpath.relpath(str(f), root) for f in files if str(f).rstrip("/") != root)
    raise AssertionError("unreachable")


def put_tree(local: PathLike, path: PathLike) -> None:
    """Copy every file under a local folder to PATH: to a bucket in one concurrent batch (each
    object appears whole: a PUT is all or nothing), to a folder one atomic file at a time."""
    base = Path(local)
    files = [f for f in sorted(base.rglob("*")) if f.is_file() and not f.name.startswith(TMP_PREFIX)]
    if not is_remote(path):
        for f in files:
            put_file(f, join(path, f.relative_to(base).as_posix()))
        return
    fs, inner = filesystem(path)
    with errors(path):
        fs.put([str(f) for f in files], [posixpath.join(inner, f.relative_to(base).as_posix()) for f in files])
        fs.invalidate_cache()


def get_tree(path: PathLike, local: PathLike) -> None:
    """Copy every file under PATH into a local folder."""
    for rel in find(path):
        if not name(rel).startswith(TMP_PREFIX):
            get_file(join(path, rel), Path(local) / rel)
