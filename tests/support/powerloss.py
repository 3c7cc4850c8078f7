"""Record and replay of file operations, to build what a power loss would leave on disk.

`compile_shim` builds ``powerloss_shim.c`` (an ``LD_PRELOAD`` library) with gcc into a temporary
folder. A process started with `shim_env` appends every mutating file operation under the given
roots (and every line it writes to stdout: the crash writer's acknowledgements) to one log, in
the order the operations took effect. `read_log` parses a slice of that log, and `Replay` plays
it forward from a snapshot of the roots (`Replay.snapshot`, taken before the recording), so that
one recording serves any number of cut points: `Replay.advance(cut)` applies the records before
`cut`, and `Replay.materialize` writes the folders as a power loss at that moment leaves them.

The model (that of ALICE and CrashMonkey, and of SQLite's own crash VFS):

* a *lossy* root is the disk that loses power. A file's bytes and size survive as of its last
  ``fsync``/``fdatasync``; a directory's names (create, rename, unlink, mkdir) as of the last
  ``fsync`` of that directory. A ``fsync`` of a file does not make its name durable.
  With ``torn=True`` each unsynced write survives page by page (4 KiB, each page kept or not at
  random, in order) and each directory keeps a random prefix of its unsynced name changes.
* a *kept* root (the central SQLite DB, standing for a server that did not lose power) keeps
  every operation up to the cut, as a SIGKILL would.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CheckpointWatch", "Dir", "File", "Record", "Replay", "Root", "compile_shim",
           "ends_whole", "phases", "read_log", "remove", "scratch", "shim_env"]

SHIM_SOURCE = Path(__file__).with_name("powerloss_shim.c")
PAGE = 4096

OPEN, WRITE, TRUNC, SYNC, RENAME, UNLINK, MKDIR, RMDIR, CLOSE, MARK = range(1, 11)
_HEADER = struct.Struct("<IBBHiiqII")
_MAGIC = 0x504C5231
_END = struct.Struct("<I")
_END_MAGIC = 0x45524C50
_O_CREAT, _O_TRUNC = os.O_CREAT, os.O_TRUNC


def compile_shim(folder: Path) -> Path:
    """gcc the shim into `folder`; the path of the shared library."""
    out = folder / "powerloss_shim.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O2", "-U_FORTIFY_SOURCE", "-o", str(out), str(SHIM_SOURCE),
         "-ldl", "-lpthread"],
        check=True, capture_output=True,
    )
    return out


def shim_env(shim: Path, log: Path, roots: list[Path], mark_fd: int = 1) -> dict[str, str]:
    """The environment that makes a process (and its forks) record into `log`."""
    preload = " ".join(p for p in (str(shim), os.environ.get("LD_PRELOAD", "")) if p)
    return {"LD_PRELOAD": preload, "POWERLOSS_LOG": str(log),
            "POWERLOSS_ROOTS": ":".join(str(r) for r in roots), "POWERLOSS_MARK_FD": str(mark_fd)}


@dataclass(frozen=True)
class Record:
    op: int
    flag: int  # OPEN: a folder; SYNC: fdatasync rather than fsync
    pid: int
    fd: int
    arg: int  # OPEN: flags; WRITE: offset (-1: append); TRUNC: length
    path: str  # RENAME: "from\0to" ("" for a side outside the roots)
    data: bytes


def read_log(log: Path, start: int = 0, end: int | None = None) -> list[Record]:
    """The records in bytes [start, end) of `log`; a record cut short at the end is dropped."""
    with open(log, "rb") as f:
        f.seek(start)
        raw = f.read() if end is None else f.read(end - start)
    return _parse(raw)[0]


def ends_whole(log: Path, start: int = 0) -> bool:
    """Whether every record of the log from `start` is whole. A SIGKILL can cut the record
    being written short (the kernel stops a write between pages for a fatal signal); the
    operation it recorded took effect on disk but is not in the log."""
    with open(log, "rb") as f:
        f.seek(start)
        raw = f.read()
    _records, used, cut = _parse(raw)
    return used == len(raw) and not cut


class CheckpointWatch:
    """Called, whether the log shows a checkpoint of `database` since byte `start`: a sync of
    that file after the writer printed READY (in WAL mode only a checkpoint writes it)."""

    def __init__(self, log: Path, start: int, database: Path) -> None:
        self.log, self.offset, self.database = log, start, str(database)
        self.paths: dict[tuple[int, int], str] = {}
        self.ready = self.seen = False

    def __call__(self) -> bool:
        with open(self.log, "rb") as f:
            f.seek(self.offset)
            records, used, _cut = _parse(f.read())
        self.offset += used
        for rec in records:
            if rec.op == OPEN:
                self.paths[rec.pid, rec.fd] = rec.path
            elif rec.op == MARK and rec.data.startswith(b"READY"):
                self.ready = True
            elif rec.op == SYNC and self.ready:
                self.seen = self.seen or self.paths.get((rec.pid, rec.fd)) == self.database
        return self.seen


def _parse(raw: bytes) -> tuple[list[Record], int, bool]:
    """The whole records in `raw`, how many bytes they take up to the last whole one, and
    whether a record cut short was skipped."""
    records: list[Record] = []
    pos, cut = 0, False
    while pos + _HEADER.size <= len(raw):
        magic, op, flag, _pad, pid, fd, arg, plen, dlen = _HEADER.unpack_from(raw, pos)
        body = pos + _HEADER.size
        end = body + plen + dlen
        if magic == _MAGIC and end + _END.size > len(raw):
            break  # still being written, or cut short at the end of the log
        if magic != _MAGIC or _END.unpack_from(raw, end)[0] != _END_MAGIC:
            # cut short by a SIGKILL, and more records follow: the next one starts at the
            # next header whose end marker is in place
            cut = True
            pos = _next_record(raw, pos + 1)
            continue
        path = raw[body:body + plen].decode()
        records.append(Record(op, flag, pid, fd, arg, path, raw[body + plen:end]))
        pos = end + _END.size
    return records, pos, cut


def _next_record(raw: bytes, pos: int) -> int:
    magic = _HEADER.pack(_MAGIC, 0, 0, 0, 0, 0, 0, 0, 0)[:4]
    while (pos := raw.find(magic, pos)) >= 0:
        if pos + _HEADER.size <= len(raw):
            *_, plen, dlen = _HEADER.unpack_from(raw, pos)
            end = pos + _HEADER.size + plen + dlen
            if end + _END.size <= len(raw) and _END.unpack_from(raw, end)[0] == _END_MAGIC:
                return pos
        pos += 1
    return len(raw)


@dataclass(eq=False)
class File:
    synced: bytearray  # bytes and size as of the last fsync
    pending: list[tuple[int, bytes] | int] = field(default_factory=list)  # writes / truncations
    size: int = 0  # as the running process sees it

    def apply(self, buf: bytearray, op: tuple[int, bytes] | int) -> None:
        if isinstance(op, int):
            del buf[op:]
            buf.extend(bytes(op - len(buf)))
        else:
            offset, data = op
            if offset > len(buf):
                buf.extend(bytes(offset - len(buf)))
            buf[offset:offset + len(data)] = data

    def sync(self) -> None:
        for op in self.pending:
            self.apply(self.synced, op)
        self.pending.clear()

    def contents(self, lossy: bool, rng: random.Random | None) -> bytes:
        """After a power loss (`lossy`), or all of it; `rng`: torn unsynced writes."""
        buf = bytearray(self.synced)
        for op in self.pending:
            if not lossy:
                self.apply(buf, op)
            elif rng is None:
                break
            elif isinstance(op, int):
                if rng.random() < 0.5:
                    self.apply(buf, op)
            else:  # each 4 KiB page of the write on its own
                offset, data = op
                for page in range(offset - offset % PAGE, offset + len(data), PAGE):
                    lo, hi = max(page, offset), min(page + PAGE, offset + len(data))
                    if rng.random() < 0.5:
                        self.apply(buf, (lo, data[lo - offset:hi - offset]))
        return bytes(buf)


_NameChange = list[tuple[str, "File | Dir | None"]]  # one atomic change: (name, node or gone)


@dataclass(eq=False)
class Dir:
    names: dict[str, File | Dir] = field(default_factory=dict)  # as the process sees them
    synced: dict[str, File | Dir] = field(default_factory=dict)  # as of its last fsync
    pending: list[_NameChange] = field(default_factory=list)

    def change(self, change: _NameChange) -> None:
        _rename(self.names, change)
        self.pending.append(change)

    def sync(self) -> None:
        self.synced = dict(self.names)
        self.pending.clear()

    def durable_names(self, lossy: bool, rng: random.Random | None) -> dict[str, File | Dir]:
        if not lossy:
            return self.names
        names = dict(self.synced)
        keep = rng.randrange(len(self.pending) + 1) if rng is not None and self.pending else 0
        for change in self.pending[:keep]:
            _rename(names, change)
        return names


def _rename(names: dict[str, File | Dir], change: _NameChange) -> None:
    for name, node in change:
        if node is None:
            names.pop(name, None)
        else:
            names[name] = node


@dataclass
class Root:
    path: Path
    lossy: bool
    top: Dir


class Replay:
    """The roots' files as the recorded process changed them, record after record."""

    def __init__(self, roots: list[Root], records: list[Record], *,
                 sqlite_dirsync: bool = True) -> None:
        self.roots = roots
        self.records = records
        # False: a folder's fdatasync does not count. SQLite syncs folders with fdatasync and
        # Python's os.fsync with fsync, so this replays a SQLite built with
        # SQLITE_DISABLE_DIRSYNC under the same Python code.
        self.sqlite_dirsync = sqlite_dirsync
        self.done = 0  # records applied
        self.fds: dict[tuple[int, int], File | Dir] = {}
        self.marks: list[tuple[int, bytes]] = []  # (record index, line written)
        self.last_sync: dict[int, int] = {}  # id(node) -> index of its last sync record

    @classmethod
    def snapshot(cls, lossy: list[Path], kept: list[Path]) -> list[Root]:
        """The roots as they are on disk now, all of it durable (before the recording)."""
        return [Root(p, p in lossy, _scan(p)) for p in [*lossy, *kept]]

    def advance(self, cut: int) -> None:
        """Apply the records before index `cut` (cuts only move forward)."""
        assert cut >= self.done, (cut, self.done)
        while self.done < cut:
            self._apply(self.done, self.records[self.done])
            self.done += 1

    def node_at(self, path: Path) -> File | Dir | None:
        """The node a path names now, as the process sees it."""
        root, parts = self._locate(str(path))
        node: File | Dir = root.top
        for part in parts:
            if not isinstance(node, Dir) or part not in node.names:
                return None
            node = node.names[part]
        return node

    def materialize(self, target: Path, torn: random.Random | None = None, *,
                    lose: bool = True) -> list[Path]:
        """Write each root as a power loss now leaves it into `target` / <root's name>
        (`lose=False`: every root as the process sees it, lossy or not)."""
        out = []
        for root in self.roots:
            dest = target / root.path.name
            _write_tree(root.top, dest, root.lossy and lose, torn)
            out.append(dest)
        return out

    # -- replay ---------------------------------------------------------------------------------

    def _locate(self, path: str) -> tuple[Root, list[str]]:
        for root in self.roots:
            base = str(root.path)
            if path == base or path.startswith(base + "/"):
                return root, [p for p in path[len(base):].split("/") if p]
        raise AssertionError(f"the power-loss log names {path}, outside every root")

    def _parent(self, path: str) -> tuple[Dir, str]:
        root, parts = self._locate(path)
        assert parts, f"the log changes the root {path} itself"
        node: File | Dir = root.top
        for part in parts[:-1]:
            assert isinstance(node, Dir), f"{part} of {path} is not a folder"
            assert part in node.names, f"no folder {part} in {path}"
            node = node.names[part]
        assert isinstance(node, Dir), path
        return node, parts[-1]

    def _apply(self, index: int, rec: Record) -> None:
        if rec.op == MARK:
            self.marks.append((index, rec.data))
        elif rec.op == OPEN:
            parent, name = self._parent(rec.path) if self._locate(rec.path)[1] else (None, "")
            node = self.node_at(Path(rec.path))
            if node is None:
                assert parent is not None, f"open of a missing root {rec.path}"
                assert rec.arg & _O_CREAT, f"open of a missing {rec.path}"
                node = File(bytearray())
                parent.change([(name, node)])
            elif rec.arg & _O_TRUNC and isinstance(node, File):
                node.pending.append(0)
                node.size = 0
            self.fds[rec.pid, rec.fd] = node
        elif rec.op == CLOSE:
            self.fds.pop((rec.pid, rec.fd), None)
        elif rec.op in (WRITE, TRUNC, SYNC):
            node = self.fds.get((rec.pid, rec.fd))
            assert node is not None, f"record {index}: descriptor {rec.fd} was never opened"
            if rec.op == SYNC:
                if isinstance(node, Dir) and rec.flag and not self.sqlite_dirsync:
                    return
                node.sync()
                self.last_sync[id(node)] = index
            else:
                assert isinstance(node, File), f"record {index}: a write to a folder"
                if rec.op == TRUNC:
                    node.pending.append(rec.arg)
                    node.size = rec.arg
                else:
                    offset = node.size if rec.arg < 0 else rec.arg
                    node.pending.append((offset, rec.data))
                    node.size = max(node.size, offset + len(rec.data))
        elif rec.op in (UNLINK, RMDIR):
            parent, name = self._parent(rec.path)
            parent.change([(name, None)])
        elif rec.op == MKDIR:
            parent, name = self._parent(rec.path)
            parent.change([(name, Dir())])
        elif rec.op == RENAME:
            old, new = rec.path.split("\0")
            assert old, f"record {index}: a file renamed into the roots from outside"
            src, src_name = self._parent(old)
            moved = src.names[src_name]
            if not new:
                src.change([(src_name, None)])
                return
            dst, dst_name = self._parent(new)
            if dst is src:
                src.change([(src_name, None), (dst_name, moved)])
            else:
                src.change([(src_name, None)])
                dst.change([(dst_name, moved)])
        else:
            raise AssertionError(f"record {index}: unknown operation {rec.op}")


def phases(records: list[Record], lossy: Path, database: Path) -> list[str]:
    """What the writer was doing at each cut 0..len(records): ``first open`` (before it printed
    READY), ``checkpoint`` (`database` has writes not yet synced, or was just synced: in WAL
    mode only a checkpoint writes it), ``mark-clean`` (a flush reached the central DB, outside
    `lossy`, and nothing was written or synced under `lossy` since), else ``group commit``."""
    paths: dict[tuple[int, int], str] = {}
    ready, db_dirty = False, False
    last_lossy, last_kept_write = -1, -1
    out: list[str] = []
    for k in range(len(records) + 1):
        just_synced_db = k > 0 and records[k - 1].op == SYNC and paths.get(
            (records[k - 1].pid, records[k - 1].fd)) == str(database)
        if not ready:
            out.append("first open")
        elif db_dirty or just_synced_db:
            out.append("checkpoint")
        elif last_kept_write > last_lossy:
            out.append("mark-clean")
        else:
            out.append("group commit")
        if k == len(records):
            break
        rec = records[k]
        path = rec.path if rec.op == OPEN else paths.get((rec.pid, rec.fd), "")
        on_lossy = path == str(lossy) or path.startswith(f"{lossy}/")
        if rec.op == OPEN:
            paths[rec.pid, rec.fd] = rec.path
        elif rec.op == MARK and rec.data.startswith(b"READY"):
            ready = True
        elif rec.op == SYNC and on_lossy:
            last_lossy = k
            db_dirty = db_dirty and path != str(database)
        elif rec.op in (WRITE, TRUNC) and not on_lossy:
            last_kept_write = k
        elif rec.op in (WRITE, TRUNC):
            last_lossy = k
            db_dirty = db_dirty or (path == str(database) and ready)
    return out


def _scan(path: Path) -> Dir:
    top = Dir()
    for entry in sorted(path.iterdir()):
        node: File | Dir
        if entry.is_dir():
            node = _scan(entry)
        else:
            data = entry.read_bytes()
            node = File(bytearray(data), size=len(data))
        top.names[entry.name] = node
    top.synced = dict(top.names)
    return top


def _write_tree(top: Dir, dest: Path, lossy: bool, torn: random.Random | None) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name, node in top.durable_names(lossy, torn).items():
        if isinstance(node, Dir):
            _write_tree(node, dest / name, lossy, torn)
        else:
            (dest / name).write_bytes(node.contents(lossy, torn))


def scratch(parent: Path, prefix: str) -> Path:
    """A new empty folder under `parent` for one image."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
