"""User-facing errors. Each names the file, the key or column, the value, what is allowed and a fix."""
from __future__ import annotations

import difflib
import errno
import os
import re


class InputError(ValueError):
    """Bad user input (spec, CSV, calibration file, results folder).

    The CLI prints the message and exits with status 2.
    """

    def __init__(self, where: str, key: str, value, allowed: str, fix: str = ""):
        self.where, self.key, self.value, self.allowed, self.fix = where, key, value, allowed, fix
        msg = (f"{where}: {key} is missing; wanted: {allowed}" if value is None
               else f"{where}: {key} = {_toml(value)} is not allowed; allowed: {allowed}")
        if fix:
            msg += f". Fix: {fix}"
        super().__init__(msg)

    def __reduce__(self):
        # picklable with its five fields (a Dask worker's error reaches the client whole)
        return type(self), (self.where, self.key, self.value, self.allowed, self.fix)


def _toml(value) -> str:
    """``value`` as TOML would write it (``true``, ``[1, 2]``; strings as ``'x'``, TOML's literal
    strings); other objects by repr."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def similar_names(value: str, candidates, cutoff: float = 0.6, n: int = 1) -> list:
    """The (at most ``n``) ``candidates`` most like ``value``, case-insensitive: those whose
    :class:`difflib.SequenceMatcher` ratio with ``value`` is at least ``cutoff`` both ways, best
    first. (The ratio depends on the order of the two strings: ``num_steps`` against
    ``num_experts`` scores 0.7 one way and 0.5 the other, and the two name different things; the
    smaller of the two is the one to trust.)"""
    v = str(value).lower()
    scored = []
    for c in candidates:
        low = str(c).lower()
        ratio = min(difflib.SequenceMatcher(None, v, low).ratio(), difflib.SequenceMatcher(None, low, v).ratio())
        if ratio >= cutoff:
            scored.append((ratio, c))
    scored.sort(key=lambda t: -t[0])       # stable: the candidates' order breaks ties
    return [c for _, c in scored[:n]]


def did_you_mean(value: str, candidates, otherwise: str) -> str:
    """A fix naming the candidate closest to ``value`` (:func:`similar_names`: ratio >= 0.6 both
    ways, case-insensitive; else the first that starts with ``value``, 3+ characters), else
    ``otherwise``: never a name that merely shares a prefix such as ``num_`` with ``value``."""
    close = similar_names(value, candidates)
    if not close and len(value) >= 3:     # a short form of a long name: 'memory', 'iter'
        close = [c for c in candidates if str(c).lower().startswith(value.lower())][:1]
    return f"did you mean {close[0]!r}?" if close else otherwise


def number_ranges(numbers, limit: int = 10) -> str:
    """Whole numbers as compact ranges, at most ``limit`` of them: ``2-9999``, ``1, 3-5, 8``,
    ``1, 3, 5, ... (and 4,997 more)``; for a message that must stay one line however many
    numbers there are."""
    nums = sorted(set(int(k) for k in numbers))
    runs = []
    for k in nums:
        if runs and k == runs[-1][1] + 1:
            runs[-1][1] = k
        else:
            runs.append([k, k])
    text = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs]
    if len(text) > limit:
        left = sum(b - a + 1 for a, b in runs[limit:])
        return ", ".join(text[:limit]) + f", ... (and {left:,} more)"
    return ", ".join(text) or "none"


def format_bytes(n: float) -> str:
    """``n`` bytes in a readable binary unit: ``512 B``, ``1.5 KiB``, ``977 KiB``, ``16 MiB``,
    ``3.2 GiB``."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            break
        n /= 1024
    text = f"{n:,.0f}" if unit == "B" or abs(n) >= 100 else f"{n:,.1f}".removesuffix(".0")
    return f"{text} {unit}"


def free_bytes(path) -> int | None:
    """Free bytes on the file system that holds ``path`` (its nearest existing folder), or
    None if that cannot be told (a pseudo file system such as /sys reports a size of 0)."""
    import shutil
    from pathlib import Path
    try:
        place = Path(path).absolute()
        while not place.exists() and place != place.parent:
            place = place.parent
        usage = shutil.disk_usage(place)
    except (OSError, ValueError):
        return None
    return usage.free if usage.total else None     # /sys, /proc: no size to tell


def write_failure(path, exc: Exception, what: str = "output file") -> InputError:
    """The :class:`InputError` for a write to ``path`` that failed with ``exc`` (disk full,
    file-size limit, read-only or unwritable place): the path, the system's reason, the free
    space on that disk and the fix. ``exc`` is an :class:`OSError`, or an error of a library
    that states the system's code in its text (Polars' ``ComputeError``: ``... (os error 28)``)."""
    free = free_bytes(path)
    room = f"; {format_bytes(free)} free there" if free is not None else ""
    code = getattr(exc, "errno", None)
    if code is None:       # Polars and Arrow put the system's code in the text: "... (os error 28)"
        m = re.search(r"(?:os error|errno) (\d+)", str(exc))
        code = int(m.group(1)) if m else None
    reason = getattr(exc, "strerror", None) or (os.strerror(code) if code else str(exc) or type(exc).__name__)
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        fix = ("free some space (or raise the file-size limit, ulimit -f) or choose another -o, then rerun the "
               "same command: finished work is kept")
    else:
        fix = "choose a folder you can write to (-o), or fix its permissions, then rerun the same command"
    return InputError(str(path), what, str(path), "a place that can be written, with room",
                      f"writing it failed: {reason}{room}; {fix}")


def is_write_failure(exc: BaseException) -> bool:
    """True for an :class:`OSError`, and for a library's error that reports one in its text
    (Polars raises ``ComputeError: ... (os error 28)`` when the disk is full)."""
    return isinstance(exc, OSError) or (type(exc).__name__ == "ComputeError"
                                        and re.search(r"os error \d+", str(exc)) is not None)


# Longest name of one file or folder most file systems allow, in bytes (NAME_MAX).
MAX_NAME_BYTES = 255


def check_plain_name(where: str, key: str, name, example: str) -> None:
    """Refuse ``name`` unless it is a plain name, fit to be a results folder, a table or a column
    value: a non-empty string of at most :data:`MAX_NAME_BYTES` bytes (UTF-8) without ``/``,
    ``\\`` or control characters, not starting with ``.``.

    Raises
    ------
    InputError
        Naming ``key``, the value and what to change (``example``: a good name).
    """
    allowed = (f"a non-empty string of at most {MAX_NAME_BYTES} bytes (UTF-8) without '/', '\\' or control "
               "characters that does not start with '.'")
    if not isinstance(name, str) or not name:
        raise InputError(where, key, name, allowed, f"e.g. {example}")
    bad = [c for c in name if c in "/\\" or ord(c) < 32 or ord(c) == 127]
    if bad or name.startswith("."):
        raise InputError(where, key, name, allowed,
                         f"remove the character {bad[0]!r}" if bad else "remove the leading '.'")
    size = len(name.encode("utf-8", errors="surrogatepass"))
    if size > MAX_NAME_BYTES:
        raise InputError(where, key, name[:40] + "...", allowed,
                         f"shorten the name ({size} bytes) to {MAX_NAME_BYTES} bytes or fewer")


def _check_parents(p, what: str) -> None:
    """Refuse ``p`` when one of its names is longer than the file system allows, or the
    nearest of its parents that exists is a file."""
    for part in p.parts:
        if len(os.fsencode(part)) > MAX_NAME_BYTES:
            raise InputError(str(p)[:80] + "...", what, part[:40] + "...",
                             f"names of at most {MAX_NAME_BYTES} bytes per file or folder",
                             "choose a shorter name")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(str(p), what, str(p), "a path whose folders are folders",
                                 f"{parent} is a file; choose another -o")
            break


def check_output_file(path) -> None:
    """Raise :class:`InputError` unless ``path`` can be written as a file (it is not a folder
    and its parent is not a file)."""
    from pathlib import Path
    p = Path(path)
    _check_parents(p, "output file")
    if p.is_dir():
        raise InputError(str(p), "output file", str(p), "a file name, not a folder",
                         f"give a file inside it, e.g. {p / 'out'}")
    # a results folder's own files (manifests, parts, candidates) are the sweep's alone
    folder = p.parent.parent if p.parent.name == "reduce" else p.parent
    if (re.match(r"^(manifest(-shard-\d+-of-\d+)?\.json|part-\d+\.parquet|c-\d+\.parquet)$", p.name)
            and any(folder.glob("manifest*.json"))):
        raise InputError(str(p), "output file", str(p), "a file that is not part of a results folder",
                         f"{p.name} belongs to the results folder {folder}; choose another name, e.g. "
                         f"{folder / ('my-' + p.name)}")


def check_output_folder(path) -> None:
    """Raise :class:`InputError` unless ``path`` can be a results folder: a folder or nothing
    yet, with no file among its parents."""
    from pathlib import Path
    p = Path(path)
    _check_parents(p, "output folder")
    if p.exists() and not p.is_dir():
        raise InputError(str(p), "output folder", str(p), "a folder (or a name not yet taken)",
                         f"it is a file; choose another -o, e.g. {p.with_name(p.name + '-results')}")


def file_exists_error(path, what: str = "output file", option: str = "-o") -> InputError:
    """The :class:`InputError` for an output file that is there already and may not be replaced
    (``option``: the option that named it, ``-o``, ``--plot``, ``--timeline``)."""
    return InputError(str(path), what, str(path), "a file that does not exist yet",
                      f"pass --overwrite to replace it, or choose another {option}")


def write_atomically(path, write, what: str = "output file", fsync: bool = False, check: bool = True,
                     replace: bool = True) -> None:
    """Create ``path`` through a temporary name and an atomic rename: ``write(tmp_path)``
    writes the content, so that an interrupted run leaves no half-written file that looks
    complete (``fsync``: flushed to disk before the rename). The one atomic-write helper: every
    file but the streamed Parquet parts (:class:`vtrain_fast.io.writer.PartWriter`) is written
    through it. With ``replace`` false an existing ``path`` is never replaced, not even one
    that appears while the content is written (the finished file is hard-linked to its name,
    which fails if the name is taken; where the file system has no hard links, it is renamed
    after a last check).

    Raises
    ------
    InputError
        If ``path`` is a folder or lies under a file (:func:`check_output_file`), exists and
        ``replace`` is false (:func:`file_exists_error`), or the write fails (disk full,
        file-size limit, unwritable place: the message names the path, the system's reason and
        the free space; the temporary file is removed).
    """
    from pathlib import Path
    if check:          # (the sweep's own files skip the user-output checks)
        check_output_file(path)
    p = Path(path)
    if not replace and os.path.lexists(p):
        raise file_exists_error(p, what)
    tmp = p.with_name(p.name + ".tmp")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        if fsync:            # on disk before the rename makes it the file (manifests)
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        if replace:
            os.replace(tmp, p)
        else:
            try:
                os.link(tmp, p)
            except FileExistsError:
                tmp.unlink()
                raise file_exists_error(p, what) from None
            except OSError:          # no hard links here (FAT, some network file systems)
                if os.path.lexists(p):
                    tmp.unlink()
                    raise file_exists_error(p, what) from None
                os.replace(tmp, p)
            else:
                tmp.unlink()
    except OSError as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise write_failure(p, e, what) from None
