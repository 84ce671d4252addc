"""Results folders: Parquet part files written under temporary names, then renamed, and a
``manifest.json`` that says ``"complete": true`` only when the sweep has finished. A folder
without a complete manifest is an unfinished sweep and every reader refuses it.

While a sweep runs, its manifest (``manifest.json``, or ``manifest-shard-K-of-N.json`` for one
shard of a sweep split over machines) is rewritten after every finished chunk and lists the
chunks whose part files are final; that is what makes a killed sweep resumable. A lock file
(``fcntl.flock``) refuses a second writer on the same folder or shard.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import InputError

MANIFEST = "manifest.json"
PART_GLOB = "part-*.parquet"
CANDIDATE_DIR = "reduce"
LOCK = ".lock"
SHARD_MANIFEST_RE = re.compile(r"^manifest-shard-(\d+)-of-(\d+)\.json$")

# Rows per Parquet row group: Polars' own default for write_parquet (512^2), which its
# scans parallelise over.
ROW_GROUP_ROWS = 1 << 18


def write_json_atomic(path: Path, obj) -> None:
    """Write JSON to ``path`` via a temporary file and an atomic rename."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict:
    """Read a JSON file written by :func:`write_json_atomic`.

    Raises
    ------
    InputError
        If the file is not valid JSON.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as e:
        raise InputError(str(path), "JSON", str(e), "a manifest written by vtrain-fast",
                         "delete the folder or rerun with --overwrite") from None


def shard_manifest_name(shard: tuple[int, int] | None) -> str:
    """``manifest.json`` for a whole sweep, ``manifest-shard-K-of-N.json`` for shard K of N."""
    if shard is None:
        return MANIFEST
    return f"manifest-shard-{shard[0]}-of-{shard[1]}.json"


def part_name(chunk: int) -> str:
    """File name of chunk ``chunk``'s rows (zero-padded, so names sort in index order)."""
    return f"part-{chunk:06d}.parquet"


def candidate_name(chunk: int) -> str:
    """Path (relative to the folder) of chunk ``chunk``'s reduction candidates."""
    return f"{CANDIDATE_DIR}/c-{chunk:06d}.parquet"


class FolderLock:
    """Advisory lock on a results folder (``fcntl.flock`` on ``.lock`` files in it).

    A whole-folder writer (a sweep without ``--shard``, or ``merge``) holds ``.lock``
    exclusively; a shard holds ``.lock`` shared and ``.lock-shard-K-of-N`` exclusively, so
    shards of one sweep can run side by side while everything else is refused. The kernel
    drops the lock when the process dies, so a killed sweep can be resumed at once.

    Raises
    ------
    InputError
        (on enter) If another process holds a conflicting lock.
    """

    def __init__(self, folder: Path, shard: tuple[int, int] | None = None):
        self.folder, self.shard = Path(folder), shard
        self._fds: list[int] = []

    def _take(self, name: str, mode: int) -> None:
        fd = os.open(self.folder / name, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            self.release()
            what = "this shard of the sweep" if name != LOCK else "this folder"
            raise InputError(str(self.folder), "output folder", str(self.folder),
                             "a folder no other vtrain-fast process is writing to",
                             f"another process is writing {what} (lock {name}); wait for it to "
                             "finish or choose another -o") from None
        self._fds.append(fd)

    def __enter__(self) -> "FolderLock":
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.shard is None:
            self._take(LOCK, fcntl.LOCK_EX)
        else:
            self._take(LOCK, fcntl.LOCK_SH)
            self._take(f"{LOCK}-shard-{self.shard[0]}-of-{self.shard[1]}", fcntl.LOCK_EX)
        return self

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)        # closing the descriptor drops its flock
        self._fds.clear()

    def __exit__(self, *exc) -> None:
        self.release()


_OWNED_RE = re.compile(r"^(manifest(-shard-\d+-of-\d+)?\.json(\.tmp)?|part-\d+\.parquet(\.tmp)?)$")


def is_sweep_file(name: str) -> bool:
    """True for the entries a sweep writes into its folder: manifests, part files, their
    temporary names, and the ``reduce/`` folder of candidates."""
    return name == CANDIDATE_DIR or bool(_OWNED_RE.match(name))


def clear_folder(folder: Path) -> None:
    """Delete the sweep's own files in ``folder`` (see :func:`is_sweep_file`); anything else
    (other files, other sweeps' folders) is left alone. The manifest goes first so that the old
    result is visibly incomplete at every moment."""
    manifest = folder / MANIFEST
    if manifest.exists():
        manifest.unlink()
    for p in folder.iterdir():
        if not is_sweep_file(p.name):
            continue
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()


def storage_schema(schema: pa.Schema, nullable: tuple[str, ...]) -> pa.Schema:
    """``schema`` with every field outside ``nullable`` marked non-nullable. Parquet then
    stores no definition levels for those columns (NaN is a value, not a null), which makes
    writing about a quarter faster; readers see the same column types."""
    return pa.schema([f.with_nullable(f.name in nullable) for f in schema])


class PartWriter:
    """Write record batches as row groups of one Parquet file, ``folder/name``.

    The file is written as ``name.tmp`` and renamed by :meth:`close`, so a part file that
    exists is complete. zstd compression, column statistics on, dictionary encoding for
    ``dictionary_columns`` (default: all).
    """

    def __init__(self, folder: Path, name: str, schema: pa.Schema,
                 dictionary_columns: list[str] | None = None):
        self.path = Path(folder) / name
        self.name, self.schema = name, schema
        self.dictionary_columns = dictionary_columns
        self.rows = 0
        self._writer = None

    def write(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Append ``batch`` (one row group per call, at most :data:`ROW_GROUP_ROWS` rows)."""
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(
                self.path.with_name(self.path.name + ".tmp"), self.schema, compression="zstd",
                write_statistics=True,
                use_dictionary=True if self.dictionary_columns is None else self.dictionary_columns)
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        if table.schema != self.schema:
            table = table.cast(self.schema)
        self._writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
        self.rows += table.num_rows

    def close(self) -> str | None:
        """Finish and rename the file; return its name, or None if nothing was written."""
        if self._writer is None:
            return None
        self._writer.close()
        self._writer = None
        os.replace(self.path.with_name(self.path.name + ".tmp"), self.path)
        return self.name


def remove_leftovers(folder: Path, chunks=None) -> None:
    """Delete temporary files of an interrupted run: of ``chunks`` only (a shard must not touch
    the files other shards are writing), or every sweep ``*.tmp`` when ``chunks`` is None."""
    if chunks is None:
        paths = [p for p in folder.glob("*.tmp") if is_sweep_file(p.name)]
        paths += list(folder.glob(f"{CANDIDATE_DIR}/*.tmp"))
    else:
        paths = [folder / (name + ".tmp") for c in chunks for name in (part_name(c), candidate_name(c))]
    for p in paths:
        if p.exists():
            p.unlink()


def read_manifest(folder: str | Path) -> dict:
    """Return the manifest of a finished results folder.

    Raises
    ------
    InputError
        If the folder does not exist or the sweep did not finish (no manifest, or one that is
        not complete).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(str(folder), "results folder", str(folder), "a folder written by `vtrain-fast sweep`",
                         "run `vtrain-fast sweep SPEC.toml -o DIR` first")
    path = folder / MANIFEST
    if not path.exists():
        if any(SHARD_MANIFEST_RE.match(p.name) for p in folder.iterdir()):
            raise InputError(str(folder), MANIFEST, None, "a merged sweep",
                             f"the folder holds shards of a sweep; run `vtrain-fast merge {folder}` "
                             "once all shards have finished")
        raise InputError(str(folder), MANIFEST, None, "a finished sweep (manifest.json is written last)",
                         "the sweep was interrupted or is still running; rerun the same command to "
                         "resume it, or rerun it with --overwrite")
    manifest = read_json(path)
    if not manifest.get("complete"):
        raise InputError(str(path), "complete", manifest.get("complete"), "true",
                         "the sweep was interrupted or is still running; rerun the same command to "
                         "resume it, or rerun it with --overwrite")
    return manifest
