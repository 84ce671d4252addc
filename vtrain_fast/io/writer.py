"""Results folders: Parquet part files written under temporary names, then renamed, and a
``manifest.json`` that says ``"complete": true`` only when the sweep has finished. A folder
without a complete manifest is an unfinished sweep and every reader refuses it.

A folder is trusted only as far as its manifest vouches for it: the manifest records every file
it uses (``files``: name -> rows, bytes and SHA-256 of the content, taken when the file was
written) and readers (:func:`result_paths`) read those files only, after checking each one; a
file that is missing, of another size or content, or not listed (a part copied in from
another sweep) is never read. Rerunning the sweep command rebuilds the chunks whose files fail
the check.

While a sweep runs, its manifest (``manifest.json``, or ``manifest-shard-K-of-N.json`` for one
shard of a sweep split over machines) is rewritten after every finished chunk and lists the
chunks whose part files are final; that is what makes a killed sweep resumable. A lock file
(``fcntl.flock``) refuses a second writer on the same folder or shard.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import InputError, format_bytes, write_atomically, write_failure
from .outputs import FolderOutput

MANIFEST = "manifest.json"
PART_GLOB = "part-*.parquet"
CANDIDATE_DIR = "reduce"
LOCK = ".lock"
SHARD_MANIFEST_RE = re.compile(r"^manifest-shard-(\d+)-of-(\d+)\.json$")

# Rows per Parquet row group: Polars' own default for write_parquet (512^2), which its
# scans parallelise over.
ROW_GROUP_ROWS = 1 << 18


# Format of the manifests this version writes: 2 adds the file records (``files`` and each
# chunk's ``file``) that readers check.
MANIFEST_FORMAT = 2
# A manifest larger than this is not one of ours (a 2^24-chunk sweep's is ~10 MB).
MAX_MANIFEST_BYTES = 256 << 20


def write_json_atomic(path: Path, obj) -> None:
    """Write JSON to ``path`` via a temporary file, fsync and an atomic rename (the old file
    stays whole when the write fails).

    Raises
    ------
    InputError
        If the file cannot be written (:func:`~vtrain_fast.io.errors.write_failure`).
    """
    text = json.dumps(obj, indent=1, default=str)
    write_atomically(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"), "manifest", fsync=True, check=False)


def write_folder_atomic(out: Path, build, what: str = "output folder") -> None:
    """Call ``build(tmp)`` to fill a temporary folder beside ``out``, then rename it into place
    (an existing ``out`` is moved aside first and removed after), so that an interrupted run
    leaves either the old folder or the whole new one, never a half-written one. Whether ``out``
    may be replaced is :func:`vtrain_fast.io.outputs.check_output`'s to say, before any work.

    Raises
    ------
    InputError
        If a write fails (disk full, file-size limit, unwritable place; an ``OSError`` or a
        Polars ``ComputeError`` with the system's code): naming ``out``, the system's reason and
        the free space (:func:`~vtrain_fast.io.errors.write_failure`). The old folder is kept
        and the temporary ones are removed.
    """
    import tempfile

    from .errors import is_write_failure
    out = Path(os.path.abspath(out))
    tmp = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        build(tmp)
        os.chmod(tmp, 0o755)
        if os.path.lexists(out):
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            try:
                os.rename(out, old / "r")
            except OSError:
                old.rmdir()
                raise
            try:
                os.rename(tmp, out)
            except OSError:
                os.rename(old / "r", out)       # the old folder back in place
                old.rmdir()
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except Exception as e:
        if not is_write_failure(e):
            raise
        raise write_failure(out, e, what) from None
    finally:
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs) -> dict:
    """``json`` object hook: a table that names a key twice (two entries of one chunk) is refused,
    not read as its last entry."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        raise _DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return out


def read_json(path: Path) -> dict:
    """Read a JSON object written by :func:`write_json_atomic`.

    Raises
    ------
    InputError
        If the file cannot be read, is not a regular file or too large, is not valid JSON, names
        a key twice in one object, or holds something other than a JSON object.
    """
    path = Path(path)
    fix = "rerun the sweep with --overwrite to rebuild the folder, or delete it"
    try:
        st = path.stat()
        if not path.is_file() or st.st_size > MAX_MANIFEST_BYTES:
            raise InputError(str(path), "manifest", str(path),
                             f"a regular file of at most {format_bytes(MAX_MANIFEST_BYTES)} written by vtrain-fast", fix)
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh, object_pairs_hook=_unique_keys)
    except _DuplicateKey as e:
        raise InputError(str(path), "manifest", f"the key {e.args[0]!r} listed twice in one table",
                         "each key (each chunk, each file) once, as vtrain-fast writes it", fix) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(str(path), "manifest", f"not JSON ({e})", "a manifest written by vtrain-fast",
                         fix) from None
    except OSError as e:
        raise InputError(str(path), "manifest", str(path), "a readable file",
                         f"reading it failed: {e.strerror or e}") from None
    if not isinstance(doc, dict):
        raise InputError(str(path), "manifest", f"a JSON {type(doc).__name__}",
                         "a JSON object written by vtrain-fast", fix)
    return doc


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
        try:
            fd = os.open(self.folder / name, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            self.release()
            raise write_failure(self.folder, e, "output folder") from None
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
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise write_failure(self.folder, e, "output folder") from None
        if self.shard is None:
            self._take(LOCK, fcntl.LOCK_EX)
        else:
            self._take(LOCK, fcntl.LOCK_SH)
            self._take(f"{LOCK}-shard-{self.shard[0]}-of-{self.shard[1]}", fcntl.LOCK_EX)
        return self

    @contextlib.contextmanager
    def opening(self):
        """While a run opens (checks the folder and writes its manifest): exclusive among
        shards too (``.lock-open``, waited for), so that two shards never both find a folder
        free of the other's split (see ``engine.run._check_one_split``)."""
        if self.shard is None:
            yield
            return
        fd = os.open(self.folder / f"{LOCK}-open", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)        # closing the descriptor drops its flock
        self._fds.clear()

    def __exit__(self, *exc) -> None:
        self.release()


_OWNED_RE = re.compile(r"^(manifest(-shard-\d+-of-\d+)?\.json(\.tmp)?|part-\d+\.parquet(\.[0-9a-f]+)?(\.tmp)?)$")


def is_sweep_file(name: str) -> bool:
    """True for the entries a sweep writes into its folder: manifests, part files, their
    temporary names, and the ``reduce/`` folder of candidates."""
    return name == CANDIDATE_DIR or bool(_OWNED_RE.match(name))


# What a sweep writes into its folder: --overwrite deletes these entries only (clear_folder).
SWEEP_OUTPUT = FolderOutput("sweep", whole=False, owns=is_sweep_file)


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


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of the file at ``path`` (read in 1 MiB blocks)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def file_record(path: Path, rows: int) -> dict:
    """What a manifest records of a written file.

    Parameters
    ----------
    path : Path
        The file (read once, for its SHA-256).
    rows : int
        Rows it holds.

    Returns
    -------
    dict
        ``{"name": str, "rows": int, "bytes": int, "sha256": str (64 hex digits)}``.
    """
    path = Path(path)
    return {"name": path.name, "rows": int(rows), "bytes": path.stat().st_size, "sha256": sha256_of(path)}


# Key of the Parquet file metadata that says which sweep and chunk wrote a file:
# ``{"sweep_key": ..., "chunk": c}`` (``"final"``: a frontier / top result or an empty folder's
# placeholder, written when the sweep finishes). Readers refuse a file of another sweep or of
# another chunk, also when its size and checksum are recorded (a hand-edited manifest).
ORIGIN_KEY = b"vtrain_fast.origin"
FINAL = "final"


def _expected_chunk(name: str):
    """The chunk a file of this name holds (``part-000003.parquet`` -> 3; ``part-000000`` may
    also be :data:`FINAL`)."""
    return int(re.search(r"(\d+)\.parquet$", name).group(1))


def read_origin(path: Path) -> dict | None:
    """The ``{"sweep_key", "chunk"}`` a file records of its writer (:data:`ORIGIN_KEY`), or
    None when it records none or cannot be read as Parquet."""
    try:
        meta = pq.read_schema(path).metadata or {}
        return json.loads(meta[ORIGIN_KEY]) if ORIGIN_KEY in meta else None
    except (OSError, ValueError, pa.ArrowException):
        return None


class PartWriter:
    """Write record batches as row groups of one Parquet file, ``folder/name``.

    The file is written as ``name.<unique>.tmp`` (two writers of one chunk, such as a Dask task
    retried while the first attempt still runs, never share a temporary file), checksummed
    and renamed by :meth:`close`, so a part
    file that exists is complete and its record (:func:`file_record`) describes it. zstd
    compression, column statistics on, dictionary encoding for ``dictionary_columns`` (default:
    all). A write that fails (disk full, file-size limit, read-only place) removes the
    temporary file and raises :class:`InputError` (:func:`write_failure`); the final name is
    never created.
    """

    def __init__(self, folder: Path, name: str, schema: pa.Schema,
                 dictionary_columns: list[str] | None = None, origin: tuple | None = None):
        self.path = Path(folder) / name
        self.origin = None if origin is None else {"sweep_key": origin[0], "chunk": origin[1]}
        if self.origin is not None:      # (sweep key, chunk or FINAL): see ORIGIN_KEY
            schema = schema.with_metadata({**(schema.metadata or {}), ORIGIN_KEY: json.dumps(self.origin).encode()})
        self.name, self.schema = name, schema
        self.dictionary_columns = dictionary_columns
        self.rows = 0
        self._writer = None
        self._error: InputError | None = None
        self._tag = os.urandom(4).hex()

    @property
    def tmp_path(self) -> Path:
        return self.path.with_name(f"{self.path.name}.{self._tag}.tmp")

    def _failed(self, e: OSError) -> InputError:
        w, self._writer = self._writer, None
        if w is not None:
            try:
                w.close()
            except Exception:        # the stream is already broken; the file goes anyway
                pass
        _unlink_quietly(self.tmp_path)
        self._error = write_failure(self.path, e, "part file")
        return self._error

    def write(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Append ``batch`` (one row group per call, at most :data:`ROW_GROUP_ROWS` rows).

        Raises
        ------
        InputError
            If the write fails (:func:`write_failure`); the temporary file is removed.
        """
        if self._error is not None:     # a failed file stays failed: no new file under its name
            raise self._error
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        if table.schema != self.schema:
            table = table.cast(self.schema)
        try:
            if self._writer is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._writer = pq.ParquetWriter(
                    self.tmp_path, self.schema, compression="zstd", write_statistics=True,
                    use_dictionary=True if self.dictionary_columns is None else self.dictionary_columns)
            self._writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
        except OSError as e:
            raise self._failed(e) from None
        self.rows += table.num_rows

    def close(self) -> dict | None:
        """Finish, checksum and rename the file; return its record (:func:`file_record`), or
        None if nothing was written.

        Raises
        ------
        InputError
            If finishing the file fails (:func:`write_failure`); the temporary file is removed.
        """
        if self._error is not None:
            raise self._error
        if self._writer is None:
            return None
        try:
            self._writer.close()
            self._writer = None
            with open(self.tmp_path, "rb+") as fh:
                os.fsync(fh.fileno())
            record = file_record(self.tmp_path, self.rows)
            record["name"] = self.name
            os.replace(self.tmp_path, self.path)
            remember_verified(self.path, record, self.origin)
        except OSError as e:
            raise self._failed(e) from None
        return record


def remove_leftovers(folder: Path, chunks=None) -> None:
    """Delete temporary files of an interrupted run: of ``chunks`` only (a shard must not touch
    the files other shards are writing), or every sweep ``*.tmp`` when ``chunks`` is None."""
    if chunks is None:
        paths = [p for p in folder.glob("*.tmp") if is_sweep_file(p.name)]
        paths += list(folder.glob(f"{CANDIDATE_DIR}/*.tmp"))
    else:
        paths = [p for c in chunks for name in (part_name(c), candidate_name(c))
                 for p in folder.glob(name + "*.tmp")]
    for p in paths:
        if p.exists():
            p.unlink()


def file_problem(folder: Path, record: dict, sweep_key: str | None = None) -> str | None:
    """What is wrong with the file a manifest records.

    Parameters
    ----------
    folder : Path
        The results folder; ``record["name"]`` is relative to it.
    record : dict
        As :func:`file_record` returns it.
    sweep_key : str, optional
        When given, the file's origin stamp (:data:`ORIGIN_KEY`) must name this sweep and the
        chunk its name says.

    Returns
    -------
    str or None
        The problem in words (missing, truncated, damaged, of another sweep or chunk), or None
        when the file is as recorded. Never raises: an unreadable file is a problem.
    """
    path = Path(folder) / record["name"]
    try:
        st = path.stat()
    except FileNotFoundError:
        return "missing"
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    if not path.is_file():
        return "not a regular file"
    if st.st_size != record["bytes"]:
        return (f"{st.st_size:,} bytes where the manifest records {record['bytes']:,} "
                f"({'truncated' if st.st_size < record['bytes'] else 'replaced or appended to'})")
    key = _stat_key(path, st)
    known = _VERIFIED.get(key)
    if known is None or known[0] != record["sha256"]:
        try:
            digest = sha256_of(path)
        except OSError as e:
            return f"unreadable ({e.strerror or e})"
        if digest != record["sha256"]:
            return "damaged or replaced (its SHA-256 differs from the one recorded when it was written)"
        known = _VERIFIED[key] = (digest, read_origin(path))
    if sweep_key is not None:
        origin = known[1]
        chunk = _expected_chunk(record["name"])
        if (not isinstance(origin, dict) or origin.get("sweep_key") != sweep_key
                or origin.get("chunk") not in ((chunk, FINAL) if chunk == 0 else (chunk,))):
            return ("a file of another sweep or chunk (its own metadata says it was written by "
                    f"{'no vtrain_fast sweep' if not isinstance(origin, dict) else 'chunk ' + str(origin.get('chunk')) + ' of sweep ' + str(origin.get('sweep_key'))[:12]})")
    return None


# Files already checked (or written) in this process, by (path, inode, size, mtime) -> (SHA-256,
# origin stamp): a query reads a folder several times and hashes and opens each file once.
_VERIFIED: dict = {}


def _stat_key(path: Path, st: os.stat_result) -> tuple:
    return (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)


def remember_verified(path: Path, record: dict, origin: dict | None) -> None:
    """Note that ``path`` as it is now has ``record``'s content and ``origin`` stamp (it was
    just written)."""
    path = Path(path)
    _VERIFIED[_stat_key(path, path.stat())] = (record["sha256"], origin)


def is_empty_of_results(folder: Path) -> bool:
    """True when ``folder`` holds nothing a sweep writes (an empty or unrelated folder)."""
    return not any(is_sweep_file(p.name) for p in folder.iterdir())


_FILE_NAME_RE = re.compile(r"^(part-\d{6}\.parquet|reduce/c-\d{6}\.parquet)$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _record_problem(record) -> str | None:
    """What makes ``record`` not a file record this package writes, or None."""
    if not isinstance(record, dict):
        return "a file record that is not a table"
    name = record.get("name")
    if not isinstance(name, str) or not _FILE_NAME_RE.match(name):
        return f"a file name {name!r} that is not a part (part-NNNNNN.parquet) or candidate file of the folder"
    if not _count(record.get("rows")) or not _count(record.get("bytes")):
        return f"{name}: rows and bytes that are not whole numbers >= 0"
    if not isinstance(record.get("sha256"), str) or not _SHA256_RE.match(record["sha256"]):
        return f"{name}: no SHA-256"
    return None


def check_manifest(manifest: dict, path: str | Path, whole: bool = True, final: bool = True) -> None:
    """Refuse a manifest whose structure this package could not have written (hand-edited or
    damaged): the format, the plan (its chunks the ceiling of its points over the chunk size),
    every chunk entry (listed once under its own number inside
    the plan, its points as the plan gives them, counts, and a record of the chunk's own file whose
    rows are the chunk's) and, when ``final`` and the manifest is complete, that its result agrees
    with its chunks (:func:`final_problem`).

    Parameters
    ----------
    manifest : dict
    path : str or Path
        The manifest file, for messages.
    whole : bool
        A whole sweep's manifest (not one shard's): a complete one covers every chunk.
    final : bool
        Check the result fields too; False where a rerun rebuilds them from the chunks (resume).

    Raises
    ------
    InputError
        Naming the manifest, the field and the fix (rerun the sweep, or with --overwrite).
    """
    fix = "the manifest was edited or damaged; rerun the sweep with --overwrite"

    def bad(field, value, allowed):
        raise InputError(str(path), field, value, allowed, fix)

    fmt = manifest.get("format", 1)
    if not _count(fmt):
        bad("format", fmt, "a whole number")
    if fmt < MANIFEST_FORMAT:
        raise InputError(str(path), "format", fmt, f"{MANIFEST_FORMAT} (a manifest that records each file's size and "
                         "checksum)", "the folder was written by an older vtrain_fast; rerun the sweep with --overwrite")
    plan = manifest.get("plan")
    if (not isinstance(plan, dict) or not all(_count(plan.get(k)) for k in ("num_points", "chunk_points", "num_chunks"))
            or not plan["chunk_points"]):
        bad("plan", plan, "the plan a sweep records (num_points, chunk_points, num_chunks)")
    if plan["num_chunks"] != -(-plan["num_points"] // plan["chunk_points"]):
        bad("plan.num_chunks", plan["num_chunks"], f"{-(-plan['num_points'] // plan['chunk_points']):,}, the "
            f"plan's {plan['num_points']:,} points in chunks of {plan['chunk_points']:,}")
    chunks = manifest.get("chunks")
    if not isinstance(chunks, dict):
        bad("chunks", type(chunks).__name__, "a table of finished chunks")
    for key, info in chunks.items():
        if not key.isdigit() or key != str(int(key)) or int(key) >= plan["num_chunks"]:
            bad("chunks", key, f"chunk numbers 0 to {plan['num_chunks'] - 1}, each once")
        c = int(key)
        points = min(plan["chunk_points"], plan["num_points"] - c * plan["chunk_points"])
        if not isinstance(info, dict) or info.get("chunk") != c or info.get("points") != points:
            bad(f"chunks.{key}", "an entry of another chunk or size", f"chunk {c} with its {points:,} points")
        counts = info.get("status_counts")
        if (not _count(info.get("rows")) or not _count(info.get("pruned")) or not isinstance(counts, list)
                or not all(_count(n) for n in counts) or sum(counts) + info["pruned"] > points):
            bad(f"chunks.{key}", "counts", f"whole numbers >= 0, at most the chunk's {points:,} points")
        rec = info.get("file")
        name = info.get("part") or info.get("candidates")
        if rec is None:
            if name is not None or info["rows"]:
                bad(f"chunks.{key}.file", None, "the record of the chunk's file")
            continue
        why = _record_problem(rec)
        if why or rec["name"] != name or rec["rows"] != info["rows"] or name not in (part_name(c), candidate_name(c)):
            bad(f"chunks.{key}.file", rec.get("name") if isinstance(rec, dict) else rec,
                why or f"the record of the chunk's own file ({part_name(c)} or {candidate_name(c)}), with the "
                "chunk's rows")
    if final and manifest.get("complete") and whole:
        problem = final_problem(manifest)
        if problem:
            raise InputError(str(path), *problem, "the manifest was edited or damaged: "
                             + rebuild_fix(manifest, Path(path).parent) + ", or rerun it with --overwrite")


def _reduces(manifest: dict) -> bool:
    """True for a sweep that keeps a reduction of its rows (``--keep frontier`` or ``top``): one
    result file merged from the chunks' candidates, not the chunks' own part files."""
    return str(manifest.get("keep", "all")).startswith(("frontier", "top"))


def final_problem(manifest: dict) -> tuple[str, object, str] | None:
    """Where a finished whole sweep's result fields disagree with its chunks (a hand-edited or
    damaged manifest), as ``(field, value, what it must be)``, or None when every field agrees:

    * ``chunks``: every chunk of the plan, their points adding up to ``plan.num_points``, which is
      ``num_points``;
    * ``files``: a record for each part file and no other, and ``parts`` each part once;
    * ``parts``: the chunks' own part files, each with the record its chunk holds (``--keep all`` /
      ``feasible``; with no row at all, the one empty part), or the one merged result file
      ``part-000000.parquet`` (``--keep frontier`` / ``top``);
    * ``num_rows``: the rows of the part files added up (and of the chunks, keep all / feasible);
    * ``status_counts`` and ``pruned_points``: the chunks' added up;
    * the machines: ``spec``, ``setting_axes``, ``machine_vectors`` and ``gpus`` agree
      (:func:`cluster_problem`).

    The grid of the spec the manifest records is counted one layer up, where specs are parsed
    (:func:`vtrain_fast.plan.spec.recorded_spec_problem`: the readers' scan and a rerun call it).

    The structure of the manifest (:func:`check_manifest` with ``final=False``) must be checked
    first. A rerun of the sweep rebuilds these fields from the chunks.
    """
    from .schema import STATUS_LABELS
    machines = cluster_problem(manifest)
    if machines:
        return machines
    plan, chunks = manifest["plan"], manifest["chunks"]
    if len(chunks) != plan["num_chunks"]:
        return "chunks", f"{len(chunks):,} chunks", f"all {plan['num_chunks']:,} chunks of the plan"
    files, parts = manifest.get("files"), manifest.get("parts")
    if not isinstance(files, dict) or not all(not _record_problem(r) and r["name"] == n for n, r in files.items()):
        return "files", type(files).__name__, "a record (name, rows, bytes, SHA-256) for each part file"
    if (not isinstance(parts, list) or not parts or not all(isinstance(n, str) for n in parts)
            or len(set(parts)) != len(parts) or set(parts) != set(files)):
        return "parts", parts, "the part files, each once, each with its record under files and no other record"
    if _reduces(manifest):
        if parts != [part_name(0)]:
            return "parts", parts, f"[{part_name(0)!r}], the one result merged from the chunks' candidates"
    else:
        own = {info["file"]["name"]: info["file"] for info in chunks.values() if info.get("part")}
        if own or parts != [part_name(0)] or files[part_name(0)]["rows"]:
            missing = sorted(set(own) - set(parts))
            if missing or set(parts) != set(own):
                return ("parts", f"{len(parts):,} part files" + (f" (without {missing[0]}, which chunk "
                        f"{_expected_chunk(missing[0])} lists)" if missing else ""),
                        f"the {len(own):,} part files the chunks list, each once")
            changed = [n for n in parts if files[n] != own[n]]
            if changed:
                return f"files.{changed[0]}", "a record unlike its chunk's", "the record its chunk holds"
        rows = sum(info["rows"] for info in chunks.values())
        if manifest.get("num_rows") != rows:
            return "num_rows", manifest.get("num_rows"), f"{rows:,}, the rows of the chunks added up"
    rows = sum(files[n]["rows"] for n in parts)
    if manifest.get("num_rows") != rows:
        return "num_rows", manifest.get("num_rows"), f"{rows:,}, the rows of the part files added up"
    counts = [0] * len(STATUS_LABELS)
    for info in chunks.values():
        for i, n in enumerate(info["status_counts"][:len(counts)]):
            counts[i] += n
    if manifest.get("status_counts") != dict(zip(STATUS_LABELS, counts)):
        return "status_counts", manifest.get("status_counts"), "the chunks' status counts added up"
    pruned = sum(info["pruned"] for info in chunks.values())
    if manifest.get("pruned_points") != pruned:
        return "pruned_points", manifest.get("pruned_points"), f"{pruned:,}, the chunks' pruned points added up"
    if manifest.get("num_points") != plan["num_points"]:
        return "num_points", manifest.get("num_points"), f"the plan's {plan['num_points']:,} points (plan.num_points)"
    return None


# The cluster values a manifest records per GPU (``gpus``) and the machine vector field each one is,
# with the factor from the recorded unit to the vector's (GB/s -> B/s, Gbit/s -> B/s, GiB -> bytes).
_CLUSTER_FIELDS = (("gpus_per_node", "gpus_per_node", 1.0), ("intra_node_GBps", "intra_node_Bps", 1e9),
                   ("inter_node_Gbps", "inter_node_Bps", 1e9 / 8.0), ("usd_per_gpu_hour", "usd_per_gpu_hour", 1.0),
                   ("pue", "pue", 1.0), ("reserved_GiB", "reserved_bytes", 1024.0 ** 3))


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def cluster_problem(manifest: dict) -> tuple[str, object, str] | None:
    """Where a manifest's record of the machines it priced on disagrees with itself, as ``(field,
    value, what it must be)``, or None: ``spec`` the spec's text; ``setting_axes`` setting names;
    ``machine_vectors`` (what the kernels priced with) one list of finite numbers per machine,
    labelled :func:`~vtrain_fast.io.schema.variant_label`; ``gpus`` one record per GPU of those
    machines and no other, each cluster value (read by ``export``, ``pareto -o``, ``report``) a finite
    number >= 0, ``gpus_per_node`` a whole number >= 1, and each the value of the GPU's machine
    vectors. A rerun of the sweep writes these fields again (they follow from its spec)."""
    from ..model.records import HARDWARE_FIELDS, HW_FIELDS
    from .schema import gpu_of_label
    if not isinstance(manifest.get("spec"), str):
        return "spec", type(manifest.get("spec")).__name__, "the spec's text"
    axes = manifest.get("setting_axes", [])
    if not isinstance(axes, list) or not all(isinstance(a, str) and a in HW_FIELDS for a in axes):
        return "setting_axes", axes, "a list of the settings the sweep varies (names of its settings)"
    vectors, gpus = manifest.get("machine_vectors"), manifest.get("gpus")
    if not isinstance(vectors, dict) or not vectors or not all(
            isinstance(v, list) and len(v) >= len(HARDWARE_FIELDS) and all(map(_number, v)) for v in vectors.values()):
        return ("machine_vectors", type(vectors).__name__, f"one list of at least {len(HARDWARE_FIELDS)} finite "
                "numbers per machine the sweep priced on")
    names = {gpu_of_label(label, axes) for label in vectors}
    if not isinstance(gpus, dict) or set(gpus) != names or not all(isinstance(g, dict) for g in gpus.values()):
        return "gpus", sorted(gpus) if isinstance(gpus, dict) else type(gpus).__name__, (
            f"one record per GPU of the machine vectors ({', '.join(sorted(names))})")
    for label, vec in vectors.items():
        name = gpu_of_label(label, axes)
        for key, field, factor in _CLUSTER_FIELDS:
            v = gpus[name].get(key)
            if not _number(v) or v < 0 or (key == "gpus_per_node" and (v != int(v) or v < 1)):
                return (f"gpus.{name}.{key}", v, "a whole number >= 1" if key == "gpus_per_node" else
                        "a finite number >= 0")
            priced = vec[HW_FIELDS.index(field)]
            if not math.isclose(v * factor, priced, rel_tol=1e-9, abs_tol=1e-12):
                return f"gpus.{name}.{key}", v, f"{priced / factor:g}, the value the sweep priced {label} with"
    return None


# The manifest "kind" of a `vtrain-fast schedule` output folder (schedule/run.py writes it).
SCHEDULE_KIND = "vtrain-fast schedule"


def read_manifest(folder: str | Path) -> dict:
    """Return the manifest of a finished results folder (not checking its files: see
    :func:`result_paths`).

    Raises
    ------
    InputError
        If the folder does not exist, holds no results, is a schedule's output folder, or the
        sweep did not finish (no manifest, or one that is not complete), or the manifest is not
        a JSON object.
    """
    folder = Path(folder)
    if not folder.is_dir():
        if folder.exists():
            raise InputError(str(folder), "results folder", str(folder), "a folder written by `vtrain-fast sweep`",
                             "it is a file; give the folder the sweep wrote (-o), e.g. results/<name>")
        raise InputError(str(folder), "results folder", str(folder),
                         f"a folder written by `vtrain-fast sweep` (no such folder from {Path.cwd()})",
                         "check the path (a sweep writes results/<name>/ under the folder it is run from, "
                         "or -o DIR), or run `vtrain-fast sweep SPEC.toml -o DIR` first")
    path = folder / MANIFEST
    if not path.exists():
        if any(SHARD_MANIFEST_RE.match(p.name) for p in folder.iterdir()):
            raise InputError(str(folder), MANIFEST, None, "a merged sweep",
                             f"the folder holds shards of a sweep; run `vtrain-fast merge {folder}` "
                             "once all shards have finished")
        parts = sorted(p.name for p in folder.glob("part-*.parquet"))
        if parts:
            raise InputError(str(folder), MANIFEST, None, "the manifest that vouches for the part files",
                             f"it is gone, so nothing vouches for the {len(parts)} part file(s) here "
                             f"({parts[0]}, ...): they are not read; rerun the sweep with --overwrite")
        if is_empty_of_results(folder):
            raise InputError(str(folder), "results folder", str(folder), "a folder written by `vtrain-fast sweep`",
                             "it holds no vtrain-fast results (no manifest.json, no part files); give the "
                             "folder a sweep wrote (-o), or run `vtrain-fast sweep SPEC.toml -o DIR` first")
        raise InputError(str(folder), MANIFEST, None, "a finished sweep (manifest.json is written last)",
                         "the sweep was interrupted or is still running; rerun the same command to "
                         "resume it, or rerun it with --overwrite")
    manifest = read_json(path)
    if manifest.get("kind") == SCHEDULE_KIND:
        raise InputError(str(folder), "results folder", str(folder), "a folder written by `vtrain-fast sweep`",
                         "this is a schedule output folder (jobs.parquet, segments.parquet, summary.parquet: "
                         "written by `vtrain-fast schedule`), not a sweep results folder; give the folder a sweep "
                         "wrote, or read the schedule's tables themselves (e.g. with polars or pandas)")
    if manifest.get("complete") is not True:
        raise InputError(str(path), "complete", manifest.get("complete"), "true",
                         "the sweep was interrupted or is still running; rerun the same command to "
                         "resume it, or rerun it with --overwrite")
    check_manifest(manifest, path)
    return manifest


def rebuild_fix(manifest: dict, folder: str | Path = "DIR") -> str:
    """How to rebuild a folder's damaged files: rerun the sweep (or its shards, then merge)."""
    spec = manifest.get("spec_path") or "SPEC.toml"
    if manifest.get("shards"):
        return (f"rerun the sweep on one machine (vtrain-fast sweep {spec} -o {folder} with the same options), or "
                f"rerun its shards (--shard K/{manifest['shards']}) and then vtrain-fast merge {folder}; either "
                "rebuilds only the damaged chunks")
    return (f"rerun the same sweep command (vtrain-fast sweep {spec} -o {folder} with the same options) to "
            "rebuild only the damaged chunks")


def check_files(folder: Path, records, fix: str, sweep_key: str | None = None) -> None:
    """Raise :class:`InputError` naming the recorded files that are missing, truncated,
    damaged or of another sweep or chunk (:func:`file_problem`), with ``fix``."""
    bad = [(r["name"], prob) for r in records if (prob := file_problem(folder, r, sweep_key))]
    if bad:
        name, prob = bad[0]
        others = "; ".join(f"{n} is {p}" for n, p in bad[1:6]) + (f"; {len(bad) - 6} more" if len(bad) > 6 else "")
        raise InputError(str(Path(folder) / name), "part file", name,
                         "the file as the manifest recorded it (its size and SHA-256)",
                         f"it is {prob}" + (f"; also {others}" if others else "") + f"; {fix}")


def folder_problems(folder: str | Path, manifest: dict) -> list[tuple[str, str]]:
    """Every file ``manifest`` records (the parts it lists and each chunk's file) that fails its
    check (:func:`file_problem`), and the manifest itself when it is finished but its result
    fields disagree with its chunks (:func:`final_problem`; its structure checked first,
    :func:`check_manifest` with ``final=False``).

    Returns
    -------
    list of (str, str)
        ``(file name, problem)``; empty for an intact folder.
    """
    records = dict((manifest.get("files") or {}))
    for info in (manifest.get("chunks") or {}).values():
        if isinstance(info, dict) and isinstance(info.get("file"), dict):
            records.setdefault(info["file"]["name"], info["file"])
    key = manifest.get("sweep_key")
    out = [(n, prob) for n, r in records.items() if (prob := file_problem(Path(folder), r, key))]
    problem = final_problem(manifest) if manifest.get("complete") and not manifest.get("shard") else None
    if problem:
        out.append((MANIFEST, at_odds(problem)))
    return out


def at_odds(problem: tuple[str, object, str]) -> str:
    """How a rerun names a manifest field that disagrees (``(field, value, what it must be)``, the
    answer of :func:`final_problem`, :func:`cluster_problem` or
    :func:`vtrain_fast.plan.spec.recorded_spec_problem`)."""
    field, value, must = problem
    return f"at odds with its chunks ({field} = {value!r}, where it must be {must})"


def result_paths(folder: str | Path, manifest: dict | None = None) -> list[Path]:
    """The files of a finished results folder, as its manifest lists them, each checked
    (:func:`file_problem`): the only files readers read. ``manifest``: the folder's, already read
    by :func:`read_manifest` (else it is read here).

    Raises
    ------
    InputError
        As :func:`read_manifest`; a folder written before file records (format < 2); a listed
        file that is missing, truncated or damaged, naming it and how to rebuild it.
    """
    folder = Path(folder)
    manifest = read_manifest(folder) if manifest is None else manifest      # checked: check_manifest
    files, parts = manifest["files"], manifest["parts"]
    records = [files[name] for name in parts]
    check_files(folder, records, rebuild_fix(manifest, folder), manifest.get("sweep_key"))
    return [folder / r["name"] for r in records]
