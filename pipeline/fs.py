"""Where a job's store and output are: a local path, or a URI of any file system Spark's Hadoop client
supports (``file://``, ``hdfs://``, ``s3a://``, ``abfs://``, ``gs://`` ...).

A local path or a ``file://`` URI is read as today: the driver lists the directory, executors ``mmap``
their split (on a cluster, every executor must see the path: a shared mount). Any other scheme is a
*remote* store:

* the driver lists the commitlog through Hadoop's FileSystem API (the JVM gateway of the driver's
  SparkSession, so ``spark.hadoop.*`` settings and the cluster's jars apply) and plans the splits;
* each executor reads its splits itself (never through the driver), with Arrow's file system for the
  scheme (``s3a`` is Arrow's ``s3``), into a copy of the file under the executor's Spark files
  directory, reused by every split of that file the executor gets and removed with the executor.

``PIPELINE_REMOTE_FILE_URIS=1`` makes ``file://`` URIs take the remote route, so the remote
code (JVM listing, executors fetching) is tested on any machine.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from services.store.formats.commitlog_walk import FILE_NAME_DIGITS, CommitLogError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REMOTE_FILE_URIS_ENV = "PIPELINE_REMOTE_FILE_URIS"  # not MQSTORE_*: those are store settings
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_COMMITLOG_NAME = re.compile(f"[0-9]{{{FILE_NAME_DIGITS}}}")
#: Arrow's name for a Hadoop scheme, where they differ.
_ARROW_SCHEMES = {"s3a": "s3", "s3n": "s3", "gs": "gs", "gcs": "gs", "abfs": "abfs", "abfss": "abfs"}
_COPY_CHUNK = 8 * 1024 * 1024


class LocationError(ValueError):
    """A store or output location that cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class Location:
    """A parsed location: ``local`` is the path for local paths and ``file://`` URIs (None for a remote
    store), ``uri`` what Hadoop is given."""

    text: str
    scheme: str
    uri: str
    local: Path | None

    @property
    def is_remote(self) -> bool:
        return self.local is None


def parse_location(text: str | os.PathLike[str], *, remote_file_uris: bool | None = None) -> Location:
    """Parse a job argument. A string is a URI only if it starts with ``scheme:`` followed by ``//``
    (or is ``file:/...``); anything else is a local path. LocationError for a URI that cannot name a
    file system path (``file://otherhost/x``, ``file:relative``, ``hdfs:x``, an empty path)."""
    if isinstance(text, Path) or not isinstance(text, str):
        path = Path(text)
        return Location(str(path), "", path.resolve().as_uri(), path)
    match = _SCHEME.match(text)
    if match is None or len(match.group(1)) == 1:  # C:\store is a path
        path = Path(text)
        return Location(text, "", path.resolve().as_uri() if text else "", path)
    scheme = match.group(1).lower()
    parts = urlsplit(text)
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise LocationError(f"{text}: a file URI names a path on this machine (file:///path), "
                                f"not on host {parts.netloc!r}")
        if not parts.path.startswith("/"):
            raise LocationError(f"{text}: a file URI needs an absolute path (file:///path)")
        if parts.query or parts.fragment:
            raise LocationError(f"{text}: a file URI takes no ?query or #fragment")
        if remote_file_uris is None:
            remote_file_uris = os.environ.get(REMOTE_FILE_URIS_ENV) == "1"
        path = Path(parts.path)
        return Location(text, scheme, f"file://{parts.path}", None if remote_file_uris else path)
    if not text[match.end():].startswith("//"):
        raise LocationError(f"{text}: not a URI Hadoop can open (expected {scheme}://authority/path) "
                            "and not a local path")
    if not parts.netloc and scheme not in ("hdfs", "viewfs"):
        raise LocationError(f"{text}: {scheme} URIs name a bucket or host ({scheme}://bucket/path)")
    if parts.query or parts.fragment:
        raise LocationError(f"{text}: a store or output URI takes no ?query or #fragment")
    return Location(text, scheme, text.rstrip("/") or text, None)


def local_argument(text: str | None) -> str | None:
    """A job argument with ``file://`` URIs turned into local paths (Spark and the local jobs both read
    those), other URIs kept. LocationError for a malformed URI."""
    if text is None:
        return None
    location = parse_location(text, remote_file_uris=False)
    return str(location.local) if location.local is not None else text


# -- the driver: listing through Hadoop's FileSystem --------------------------------------------------


@dataclass(frozen=True)
class RemoteFile:
    uri: str
    size: int
    start_offset: int


class HadoopFiles:
    """A Hadoop FileSystem (any scheme the driver's JVM supports) for the paths under ``uri``."""

    def __init__(self, spark: SparkSession, uri: str) -> None:
        sc = spark.sparkContext
        jvm = sc._jvm
        assert jvm is not None
        self._path_class: Any = jvm.org.apache.hadoop.fs.Path
        try:
            self.fs: Any = self._path_class(uri).getFileSystem(sc._jsc.hadoopConfiguration())
        except Exception as exc:  # noqa: BLE001 (py4j wraps Hadoop's IOException)
            raise LocationError(f"{uri}: {hadoop_message(exc)}") from None

    def path(self, text: str) -> Any:
        return self._path_class(text)

    def exists(self, text: str) -> bool:
        return bool(self.fs.exists(self.path(text)))

    def is_dir(self, text: str) -> bool:
        path = self.path(text)
        return bool(self.fs.exists(path) and self.fs.getFileStatus(path).isDirectory())

    def delete(self, text: str) -> None:
        self.fs.delete(self.path(text), True)

    def children(self, text: str) -> list[str]:
        """Names directly under ``text`` (none if it does not exist)."""
        path = self.path(text)
        if not self.fs.exists(path):
            return []
        return [str(status.getPath().getName()) for status in self.fs.listStatus(path)]

    def statuses(self, text: str) -> list[tuple[str, str, bool, int]]:
        """(name, full URI, is a file, length) of each entry under ``text``."""
        return [(str(s.getPath().getName()), str(s.getPath().toString()), bool(s.isFile()), int(s.getLen()))
                for s in self.fs.listStatus(self.path(text))]

    def read_text(self, text: str) -> str | None:
        path = self.path(text)
        if not self.fs.exists(path):
            return None
        stream = self.fs.open(path)
        try:
            jvm_bytes = stream.readAllBytes()
        finally:
            stream.close()
        return bytes(jvm_bytes).decode()

    def write_text(self, text: str, content: str) -> None:
        """Write ``content`` to a temporary sibling, then rename it over ``text`` (a reader sees the old
        or the new content; on object stores the rename is a copy, still never a partial file)."""
        path = self.path(text)
        tmp = self.path(text + ".tmp")
        stream = self.fs.create(tmp, True)
        try:
            stream.write(bytearray(content.encode()))
        finally:
            stream.close()
        if self.fs.exists(path):
            self.fs.delete(path, False)
        if not self.fs.rename(tmp, path):
            raise OSError(f"could not rename {tmp} to {path}")


def hadoop_message(exc: BaseException) -> str:
    """The Java exception's own message, not py4j's wrapping (``No FileSystem for scheme "x"``)."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            return str(java.getMessage() or java.toString())
        except Exception:  # noqa: BLE001 (the gateway is gone: fall back to the text)
            pass
    text = str(exc)
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(("java.", "org.apache.", "com.amazonaws.", "software.amazon.")) and ": " in line:
            return line.split(": ", 1)[1]
    return text.splitlines()[0] if text else type(exc).__name__


def list_remote_commitlog(spark: SparkSession, location: Location, file_size: int | None = None
                          ) -> tuple[str, list[RemoteFile]]:
    """(commitlog URI, its files in offset order) of a remote store root or commitlog directory, with
    the checks :func:`services.store.formats.commitlog_walk.list_commitlog_files` makes locally."""
    files = HadoopFiles(spark, location.uri)
    root = location.uri.rstrip("/")
    try:
        if not files.is_dir(root):
            raise CommitLogError(f"{location.text}: no such directory (pass a store root or its commitlog directory)")
        commitlog = root + "/commitlog" if files.is_dir(root + "/commitlog") else root
        entries = files.statuses(commitlog)
    except CommitLogError:
        raise
    except Exception as exc:  # noqa: BLE001 (py4j wraps Hadoop's IOException)
        raise LocationError(f"{location.text}: {hadoop_message(exc)}") from None
    starts: list[tuple[int, str, int]] = []
    for name, uri, is_file, length in entries:
        if not _COMMITLOG_NAME.fullmatch(name) or not is_file:
            if commitlog == root and not starts and name in ("consumequeue", "index", "indexer", "config"):
                raise CommitLogError(f"{location.text}: no commitlog directory; pass a store root or its commitlog")
            raise CommitLogError(f"{uri}: not a commitlog file (expected regular files named by a 20-digit offset)")
        starts.append((int(name), uri, length))
    starts.sort()
    result: list[RemoteFile] = []
    for start, uri, length in starts:
        expected = file_size if file_size is not None else starts[0][2]
        if length != expected:
            raise CommitLogError(f"{uri}: size {length} differs from the mapped file size {expected}")
        if start % expected:
            raise CommitLogError(f"{uri}: offset {start} is not a multiple of the file size {expected}")
        if result and start != result[-1].start_offset + result[-1].size:
            raise CommitLogError(f"{uri}: expected the next file at offset "
                                 f"{result[-1].start_offset + result[-1].size}, the log has a gap")
        result.append(RemoteFile(uri, length, start))
    return commitlog, result


# -- executors: their own copy of a remote file ------------------------------------------------------


def is_uri(path: str) -> bool:
    """Whether a split's path is a URI (Hadoop writes ``file:/x``, ``s3a://b/x``), not a local path."""
    match = _SCHEME.match(path)
    return match is not None and len(match.group(1)) > 1


def _cache_root() -> Path:
    """The executor's Spark files directory (removed with the executor), else a temporary directory."""
    try:
        from pyspark.core.files import SparkFiles

        root = SparkFiles._root_directory
    except ImportError:
        root = None
    base = Path(root) if root else Path(tempfile.gettempdir())
    directory = base / "mqstore-commitlog-copies"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def arrow_filesystem(uri: str) -> tuple[Any, str]:
    """(pyarrow file system, path in it) for a Hadoop URI."""
    from pyarrow import fs as pafs

    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "file":
        return pafs.LocalFileSystem(), parts.path
    arrow_uri = uri if scheme not in _ARROW_SCHEMES else _ARROW_SCHEMES[scheme] + uri[len(scheme):]
    try:
        filesystem, path = pafs.FileSystem.from_uri(arrow_uri)
    except (ValueError, OSError) as exc:
        raise LocationError(f"{uri}: executors cannot read it with Arrow ({exc}); see docs/pipeline.md") from None
    return filesystem, path


def local_path(path: str, size: int) -> str:
    """``path`` itself, or for a URI (a remote store's file) the local copy :func:`fetch` makes."""
    return str(fetch(path, size)) if is_uri(path) else path


def fetch(uri: str, size: int) -> Path:
    """A local copy of the remote file ``uri`` (``size`` bytes, as listed by the driver), fetched once per
    executor and version of the file (its modification time), written under a temporary name and
    renamed, so concurrent tasks never read a partial copy."""
    filesystem, path = arrow_filesystem(uri)
    info = filesystem.get_file_info(path)
    version = f"{uri}\0{info.size}\0{info.mtime_ns}"
    name = hashlib.sha1(version.encode()).hexdigest()[:20] + "-" + Path(path).name
    target = _cache_root() / name
    if target.exists() and target.stat().st_size == size:
        return target
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".fetch-")
    try:
        with os.fdopen(fd, "wb") as out, filesystem.open_input_stream(path) as source:
            shutil.copyfileobj(source, out, _COPY_CHUNK)
        if os.path.getsize(tmp) != size:
            raise CommitLogError(f"{uri}: read {os.path.getsize(tmp)} bytes, but the driver listed {size}")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
