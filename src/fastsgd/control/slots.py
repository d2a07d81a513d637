"""What `fastsgd run`'s launcher shares with its workers (interrupt.Stop), as one block of
int64 slots: in anonymous memory that forked workers inherit, or, when the run takes
workers from outside (run.join, door.py), in a file of the run directory that any process
of the machine can map. Aligned int64 reads and writes are atomic on the machines torch
supports; what must be read together is read under Stop's lock."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from fastsgd.errors import UserError

MAGIC = 0x3264_6773_7473_6166  # b"fastsgd2", little-endian
OLD_MAGIC = 0x3164_6773_7473_6166  # b"fastsgd1": a door without "started"
# one slot each: the launcher's pid and rendezvous port, the workers and steps of the run,
# the step to stop after (Ctrl-C), the door's state and the launcher's start time (door.py)
HEADER = ("magic", "pid", "port", "workers", "steps", "stop_at", "closed", "request", "answer",
          "since", "started")
# one slot per worker (see Stop); `ended`: how a process from outside ended (door.py)
ARRAYS = ("progress", "ready", "joined_at", "donor", "left_after", "ended")


def _size(workers: int) -> int:
    """The bytes of the block for `workers` workers."""
    return 8 * (len(HEADER) + len(ARRAYS) * workers)


class Cell:
    """One slot, with the `.value` of a multiprocessing Value."""

    def __init__(self, words: memoryview, index: int):
        self._words, self._index = words, index

    @property
    def value(self) -> int:
        return self._words[self._index]

    @value.setter
    def value(self, value: int) -> None:
        self._words[self._index] = value


class Slots:
    """The block for `workers` workers; `path`: in that file (created, or opened with
    `attach`), else in anonymous shared memory. `fd` is the file's descriptor (None without
    one), on which Stop takes its lock."""

    def __init__(self, workers: int, path: Path | None = None, fd: int | None = None):
        size = _size(workers)
        making = None if path is None or fd is not None else f"{path}.{os.getpid()}"
        if making:  # under another name until it is whole: a joiner may be waiting for `path`
            fd = os.open(making, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            os.ftruncate(fd, size)
        self.fd = fd
        self._map = mmap.mmap(-1 if fd is None else fd, size)
        words = memoryview(self._map).cast("q")
        self.header = words[:len(HEADER)]
        self.arrays = {name: words[len(HEADER) + i * workers:len(HEADER) + (i + 1) * workers]
                       for i, name in enumerate(ARRAYS)}
        if making:
            self["workers"] = workers
            self["magic"] = MAGIC
            os.replace(making, path)

    @classmethod
    def attach(cls, path: Path) -> Slots:
        """The block in `path`, which a launcher made (UserError naming it if not)."""
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            if not path.parent.exists():
                raise UserError(f"{path.parent}: no such run directory") from None
            raise UserError(f"{path.parent}: no run there takes new workers now (no "
                            f"{path.name}): fastsgd join needs a running `fastsgd run` with "
                            "run.join = true") from None
        except NotADirectoryError:
            raise UserError(f"{path.parent}: not a run directory (not a folder): fastsgd join "
                            "takes the folder of a running `fastsgd run`") from None
        except OSError as e:  # another user's, say
            raise UserError(f"{path}: cannot open the run's door ({e.strerror})") from None
        with open(path, "rb") as f:
            head = f.read(8 * len(HEADER))
        words = memoryview(head).cast("q") if len(head) == 8 * len(HEADER) else None
        workers = words[HEADER.index("workers")] if words is not None else 0
        whole = 0 < workers and _size(workers) <= os.fstat(fd).st_size  # mmap needs it all
        if words is None or words[0] != MAGIC or not whole:
            os.close(fd)
            why = ("a run of an older fastsgd made it: join with that version"
                   if words is not None and words[0] == OLD_MAGIC else "wrong size or magic")
            raise UserError(f"{path} is not the door of a fastsgd run ({why})")
        return cls(workers, path, fd)

    def __getitem__(self, name: str) -> int:
        return self.header[HEADER.index(name)]

    def __setitem__(self, name: str, value: int) -> None:
        self.header[HEADER.index(name)] = value

    def cell(self, name: str) -> Cell:
        return Cell(self.header, HEADER.index(name))
