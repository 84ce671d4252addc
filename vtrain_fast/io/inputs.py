"""Input files are checked before they are read: an existing regular file (not a folder, a
device such as ``/dev/zero``, a FIFO or a socket, which would never end or block) of bounded size,
so that a wrong path fails at once with :class:`~vtrain_fast.io.errors.InputError` instead of
growing memory without limit."""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from .errors import InputError, format_bytes

# Sweep specs, calibration files and nccl-tests output: text of a few KiB.
MAX_TEXT_BYTES = 16 * 2 ** 20
# evaluate / calibrate inputs (CSV or Parquet): about 10 million configuration rows.
MAX_TABLE_BYTES = 2 ** 30


def check_input_file(path, what: str, limit: int) -> int:
    """Raise :class:`InputError` unless ``path`` is an existing regular file of at most
    ``limit`` bytes; return its size. Only ``os.stat`` is called: nothing is opened.

    Parameters
    ----------
    path : str or Path
    what : str
        What the file should be, for the message (``"TOML file"``, ``"CSV or Parquet file"``).
    limit : int
        Largest size accepted, bytes.
    """
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise InputError(str(p), "file", str(p), f"an existing, readable {what} (nothing exists at {p})",
                         f"it cannot be opened (no such file or folder); check the path (relative to "
                         f"{Path.cwd()})") from None
    except (OSError, ValueError) as e:      # ValueError: a NUL byte in the path
        reason = getattr(e, "strerror", None) or str(e)
        raise InputError(str(p), "file", str(p), f"an existing, readable {what}",
                         f"it cannot be opened ({reason}); check the path") from None
    if not stat.S_ISREG(st.st_mode):
        m = st.st_mode
        kind = ("a folder" if stat.S_ISDIR(m) else "a device" if stat.S_ISCHR(m) or stat.S_ISBLK(m)
                else "a FIFO (named pipe)" if stat.S_ISFIFO(m) else "a socket" if stat.S_ISSOCK(m)
                else "not a regular file")
        raise InputError(str(p), "file", str(p), f"a regular {what} (this is {kind})",
                         f"give the path of a {what}")
    if st.st_size > limit:
        raise InputError(str(p), "file size", f"{st.st_size:,} bytes",
                         f"at most {limit:,} bytes ({format_bytes(limit)}) for a {what}",
                         "check the path; split a larger input into several files")
    return st.st_size


def read_input_bytes(path, what: str, limit: int = MAX_TEXT_BYTES) -> bytes:
    """The bytes of the input file ``path`` after :func:`check_input_file`, reading at most
    ``limit + 1`` bytes (a file that grew past ``limit`` meanwhile is refused too).

    Raises
    ------
    InputError
        Missing, unreadable, not a regular file, or larger than ``limit``.
    """
    check_input_file(path, what, limit)
    p = Path(path)
    try:
        with open(p, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise InputError(str(p), "file", str(p), f"an existing, readable {what}", e.strerror or str(e)) from None
    if len(data) > limit:
        raise InputError(str(p), "file size", f"more than {limit:,} bytes",
                         f"at most {limit:,} bytes ({format_bytes(limit)}) for a {what}",
                         "check the path; split a larger input into several files")
    return data


def read_toml(path, what: str = "TOML file", limit: int = MAX_TEXT_BYTES) -> dict:
    """The TOML document of the input file ``path`` (:func:`read_input_bytes`; UTF-8, a BOM
    allowed): the one TOML reader of specs' companions (calibration, GPU and calibration-output
    files).

    Raises
    ------
    InputError
        Missing, unreadable, not a regular file, too large, not UTF-8, or not valid TOML
        (:func:`parse_toml`).
    """
    data = read_input_bytes(path, what, limit)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(str(path), "encoding", f"byte {e.start}", "a UTF-8 text file",
                         f"save the {what} as UTF-8 text") from None
    return parse_toml(text, str(path), what)


# tomllib's position at the end of its messages: "(at line 7, column 21)", "(at end of document)".
_TOML_AT = re.compile(r"\s*\(at (?:line (\d+), column \d+|end of document)\)\s*$")
# tomllib's messages for a key or table given twice.
_TWICE = ("Cannot overwrite a value", "Cannot declare", "Duplicate inline table key")


def parse_toml(text: str, where: str, what: str = "TOML file") -> dict:
    """The TOML document ``text`` (:func:`tomllib.loads`; a leading BOM dropped) of the file
    ``where``: the one place a TOML error becomes a message. A key or table given twice is named
    with both of its lines (tomllib says only "Cannot overwrite a value"); other errors keep
    tomllib's reason, with the line.

    Raises
    ------
    InputError
        Naming the file, the line, and the key given twice or tomllib's reason.
    """
    import tomllib
    try:
        return tomllib.loads(text.lstrip("\ufeff"))
    except tomllib.TOMLDecodeError as e:
        raise toml_error(text.lstrip("\ufeff"), str(e), where, what) from None


def toml_error(text: str, message: str, where: str, what: str) -> InputError:
    """The :class:`InputError` for tomllib's ``message`` about ``text`` (see :func:`parse_toml`)."""
    m = _TOML_AT.search(message)
    reason = message[:m.start()] if m else message
    lines = text.splitlines()
    line = (int(m.group(1)) if m.group(1) else len(lines)) if m else None
    if reason.startswith(_TWICE):
        keys = toml_keys(text)
        twice = _repeated_key(keys, int(m.group(1)) if m and m.group(1) else None)
        if twice is not None:
            key, first, again = twice
            short = key.rsplit(".", 1)[-1]
            table = key.startswith("[")
            fix = (f"merge the two {key} tables into one" if table else
                   f"keep one of lines {first} and {again}; to try several values, give them as one list, e.g. "
                   f"{short} = [1, 2]")
            return InputError(f"{where}, line {again}", ("table " if table else "key ") + key,
                              f"given twice (also on line {first})", "each key and table once in a TOML file", fix)
        return InputError(f"{where}, line {line}" if line else where, "TOML", reason,
                          f"each key and table once in a {what} (https://toml.io)",
                          "a key or table is given twice (or a key is also a table): keep one")
    return InputError(f"{where}, line {line}" if line else where, "TOML", reason,
                      f"a valid {what} (https://toml.io)",
                      f"fix line {line}: {lines[line - 1].strip()[:80]!r}" if line and line <= len(lines) else "")


def _key_parts(text: str) -> list[str]:
    """The parts of a TOML key (``a.b``, ``"a".b``, ``a . 'b'``), quotes removed."""
    return [p.strip().strip("\"'") for p in re.findall(r'"[^"]*"|\'[^\']*\'|[^.]+', text) if p.strip()]


def toml_keys(text: str) -> list[tuple[int, str]]:
    """``(line, full key)`` of each key line and table header of the TOML ``text``, in order:
    ``training.micro_batch_size`` for a key under ``[training]``, ``[cluster]`` for a header (array
    tables ``[[...]]`` and the lines inside multi-line strings and arrays left out). A reader of
    lines for messages, not a TOML parser: the document is known to be nearly valid."""
    out, table, depth, in_string = [], [], 0, None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if in_string:                      # inside a multi-line string
            if in_string in line:
                in_string = None
            continue
        if depth > 0:                      # inside a multi-line array
            depth += line.count("[") - line.count("]")
            continue
        if not line or line.startswith("#"):
            continue
        if line.startswith("[["):
            table = []
            continue
        if line.startswith("["):
            table = _key_parts(line[1:line.index("]")] if "]" in line else line[1:])
            out.append((n, "[" + ".".join(table) + "]"))
            continue
        key, eq, value = line.partition("=")
        if not eq:
            continue
        out.append((n, ".".join(table + _key_parts(key))))
        value = value.strip()
        for q in ('"""', "'''"):
            if value.startswith(q) and value.count(q) == 1:
                in_string = q
        if value.startswith("["):
            depth = value.count("[") - value.count("]")
    return out


def _repeated_key(keys, line):
    """``(key, first line, second line)`` of the key given twice at ``line`` (else the first key
    given twice: tomllib may tell only "at end of document"), or None."""
    seen: dict = {}
    found = []
    for n, k in keys:
        if k in seen:
            found.append((k, seen[k], n))
        seen.setdefault(k, n)
    exact = [f for f in found if f[2] == line]
    return (exact or found or [None])[0]
