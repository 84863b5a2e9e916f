"""Reading files whose path someone else chose (a model directory named in a setting, a config file).

A FIFO blocks `open()` until a writer appears and `/dev/zero` never ends: either one used to hang the
model worker for good. Only regular files are read here, opened without blocking, and their size is
checked before a byte is read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class FileRefused(OSError):
    """Not a regular file, or larger than its cap; the message says which and why."""


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def _check(path: Path, st: os.stat_result, cap: int | None) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(f"{path} is {_kind(st.st_mode)}, not a regular file")
    if cap is not None and st.st_size > cap:
        raise FileRefused(f"{path} is {st.st_size:,} bytes, over the {cap:,}-byte limit for this file")


def check_regular_file(path: Path, cap: int | None = None) -> None:
    """Raise `FileRefused` unless `path` (after symlinks) is a regular file of at most `cap` bytes."""
    _check(path, os.stat(path), cap)


def read_regular_file(path: Path, cap: int) -> bytes:
    """The bytes of a regular file of at most `cap` bytes; never blocks on a FIFO or device."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _check(path, os.fstat(fd), cap)  # fstat: the file checked is the file read
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(cap + 1)
    finally:
        os.close(fd)
    if len(data) > cap:  # it grew after the check
        raise FileRefused(f"{path} grew past the {cap:,}-byte limit for this file")
    return data
