"""Results folders: Parquet part files written under temporary names, then renamed, and a
``manifest.json`` written last. A folder without a complete manifest is an unfinished sweep and
every reader refuses it.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import InputError

MANIFEST = "manifest.json"
PART_GLOB = "part-*.parquet"


def write_json_atomic(path: Path, obj) -> None:
    """Write JSON to ``path`` via a temporary file and an atomic rename."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def prepare_folder(folder: Path, overwrite: bool) -> None:
    """Create ``folder`` for a new sweep.

    Raises
    ------
    InputError
        If the folder holds results (or leftovers) and ``overwrite`` is false.
    """
    if folder.exists() and any(folder.iterdir()):
        if not overwrite:
            raise InputError(str(folder), "output folder", str(folder), "an empty or new folder",
                             "pass --overwrite to replace its contents, or choose another -o")
        manifest = folder / MANIFEST
        if manifest.exists():           # first make the old result visibly incomplete
            manifest.unlink()
        for p in folder.iterdir():
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink()
    folder.mkdir(parents=True, exist_ok=True)


class PartWriter:
    """Append record batches as row groups to ``part-NNNNN.parquet`` files.

    Each part is written as ``part-NNNNN.parquet.tmp`` and renamed when full or closed.
    zstd compression, column statistics on.
    """

    def __init__(self, folder: Path, schema: pa.Schema, rows_per_file: int = 1 << 24):
        self.folder, self.schema, self.rows_per_file = folder, schema, rows_per_file
        self.parts: list[str] = []
        self.rows = 0
        self._writer = None
        self._tmp = None
        self._rows_in_part = 0

    def _open(self):
        name = f"part-{len(self.parts):05d}.parquet"
        self._tmp = self.folder / (name + ".tmp")
        self._writer = pq.ParquetWriter(self._tmp, self.schema, compression="zstd",
                                        write_statistics=True)
        self.parts.append(name)
        self._rows_in_part = 0

    def _finish_part(self):
        if self._writer is not None:
            self._writer.close()
            os.replace(self._tmp, self.folder / self.parts[-1])
            self._writer = None

    def write(self, batch: pa.RecordBatch) -> None:
        if self._writer is None:
            self._open()
        self._writer.write_batch(batch)
        self.rows += batch.num_rows
        self._rows_in_part += batch.num_rows
        if self._rows_in_part >= self.rows_per_file:
            self._finish_part()

    def close(self) -> None:
        self._finish_part()


def read_manifest(folder: str | Path) -> dict:
    """Return the manifest of a finished results folder.

    Raises
    ------
    InputError
        If the folder does not exist or the sweep did not finish (no manifest).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(str(folder), "results folder", str(folder), "a folder written by `vtrain-fast sweep`",
                         "run `vtrain-fast sweep SPEC.toml -o DIR` first")
    path = folder / MANIFEST
    if not path.exists():
        raise InputError(str(folder), MANIFEST, None, "a finished sweep (manifest.json is written last)",
                         "the sweep was interrupted or is still running; rerun it with --overwrite")
    with open(path, encoding="utf-8") as fh:
        manifest = json.load(fh)
    if not manifest.get("complete"):
        raise InputError(str(path), "complete", manifest.get("complete"), "true",
                         "rerun the sweep with --overwrite")
    return manifest
