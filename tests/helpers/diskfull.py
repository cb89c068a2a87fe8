"""Run the rlbatch CLI with a simulated full disk or read-only folder under one folder.

    python diskfull.py ROOT MODE [rlbatch arguments ...]

MODE `full:<name>:<n>:<k>`: the n-th write call to a file under ROOT whose name contains
<name> (an atomic write's `.summary.json.tmp123` contains `summary.json`) writes only its
first k bytes, as a disk that fills part-way through a write does; from then on the disk
is full: every write and every new folder under ROOT fails with ENOSPC (errno 28).
Shrinking a file, renaming and deleting still work, as they do on a full disk.

MODE `readonly`: ROOT is a read-only folder: opening a file for writing, making, renaming or
deleting anything under it fails with EACCES (errno 13).

Python-level writes are covered: `open()` / `Path.open` (the buffered file's raw writes),
`os.write`, `os.open`, `os.mkdir`, `os.replace`, `os.rename`, `os.unlink`. Writes made by
native code (safetensors writes its files in Rust) bypass the simulation; a real small
tmpfs covers those (tests/test_disk.py). In-process, `hooks(root, mode)` gives the same
patches for pytest's monkeypatch. Nothing here is used outside the tests.
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import sys

ROOT, MODE = "", ""
_state = {"calls": 0, "full": False}
_real = {name: getattr(os, name) for name in ("write", "open", "mkdir", "replace", "rename",
                                               "unlink", "truncate")}
_real_open = io.open


def _under(path) -> bool:
    if not ROOT:
        return False
    try:
        p = os.path.realpath(os.fspath(path))
    except TypeError:  # a file descriptor
        return False
    return p == ROOT or p.startswith(ROOT + os.sep)


def _fail(code: int, path=None):
    raise OSError(code, os.strerror(code), None if path is None else os.fspath(path))


def _allowed(path: str, size: int) -> int:
    """How many of `size` bytes a write to `path` may write (raises once the disk is full)."""
    if not MODE.startswith("full:") or not _under(path):
        return size
    if _state["full"]:
        _fail(errno.ENOSPC)
    _, name, n, k = MODE.split(":")
    if name in os.path.basename(path):
        _state["calls"] += 1
        if _state["calls"] == int(n):
            _state["full"] = True
            return min(int(k), size)
    return size


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


class _FileIO(io.FileIO):
    def write(self, data) -> int:
        data = memoryview(data).cast("B")
        k = _allowed(self.name if isinstance(self.name, str) else _fd_path(self.fileno()),
                     len(data))
        return super().write(data[:k])


def _write(fd, data):
    data = memoryview(data).cast("B")
    return _real["write"](fd, data[:_allowed(_fd_path(fd), len(data))])


def _readonly(path) -> bool:
    return MODE == "readonly" and _under(path)


def _open(file, mode="r", buffering=-1, encoding=None, errors=None, newline=None,
          closefd=True, opener=None):
    writing = any(c in mode for c in "wax+")
    if not writing or isinstance(file, int) or not _under(file):
        return _real_open(file, mode, buffering, encoding, errors, newline, closefd, opener)
    if _readonly(file):
        _fail(errno.EACCES, file)
    raw = _FileIO(file, mode.replace("b", "").replace("t", ""), closefd, opener=opener)
    if buffering == 0:
        return raw
    buffered = (io.BufferedRandom if "+" in mode else io.BufferedWriter)(raw)
    if "b" in mode:
        return buffered
    text = io.TextIOWrapper(buffered, encoding or "utf-8", errors, newline,
                            line_buffering=buffering == 1)
    text.mode = mode
    return text


def _os_open(path, flags, mode=0o777, *, dir_fd=None):
    if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and dir_fd is None and _readonly(path):
        _fail(errno.EACCES, path)
    return _real["open"](path, flags, mode, dir_fd=dir_fd)


def _mkdir(path, mode=0o777, *, dir_fd=None):
    if dir_fd is None and _readonly(path):
        _fail(errno.EACCES, path)
    if dir_fd is None and _state["full"] and _under(path):
        _fail(errno.ENOSPC, path)
    return _real["mkdir"](path, mode, dir_fd=dir_fd)


def _guard(name: str):
    def call(*args, **kwargs):
        paths = [a for a in args if isinstance(a, (str, bytes, os.PathLike))]
        if any(_readonly(a) for a in paths):
            _fail(errno.EACCES, paths[-1])
        return _real[name](*args, **kwargs)
    return call


def hooks(root, mode: str) -> list[tuple[object, str, object]]:
    """Set the simulation up for `root` and `mode`; return (object, attribute, replacement)
    for every function it replaces."""
    global ROOT, MODE
    ROOT, MODE = os.path.realpath(root), mode
    _state.update(calls=0, full=False)
    out = [(builtins, "open", _open), (io, "open", _open), (os, "write", _write),
           (os, "open", _os_open), (os, "mkdir", _mkdir)]
    out += [(os, name, _guard(name)) for name in ("replace", "rename", "unlink", "truncate")]
    return out + [(os, "remove", _guard("unlink"))]


if __name__ == "__main__":
    for obj, name, value in hooks(sys.argv[1], sys.argv[2]):
        setattr(obj, name, value)
    from rlbatch.cli.main import main

    main(sys.argv[3:])
