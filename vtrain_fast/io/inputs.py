"""Input files are checked before they are read: an existing regular file (not a folder, a
device such as ``/dev/zero``, a FIFO or a socket, which would never end or block) of bounded size,
so that a wrong path fails at once with :class:`~vtrain_fast.io.errors.InputError` instead of
growing memory without limit."""
from __future__ import annotations

import os
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
        Missing, unreadable, not a regular file, too large, not UTF-8, or not valid TOML.
    """
    import tomllib
    data = read_input_bytes(path, what, limit)
    try:
        return tomllib.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        raise InputError(str(path), "encoding", f"byte {e.start}", "a UTF-8 text file",
                         f"save the {what} as UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise InputError(str(path), "TOML", str(e), f"a valid {what} (https://toml.io)") from None
