"""The output rule: one guard, :func:`check_output`, that every command which writes calls for each
of its outputs before any work.

A command never replaces

(a) one of its own inputs (the output is the input, or a folder that holds it; resolved paths,
    so ``.``, ``..`` and symbolic links count),
(b) a results folder (a folder with a ``manifest*.json`` this command did not write), or a folder
    that holds one at any depth,
(c) a folder holding anything the command did not write (a folder output is replaced only when
    every entry in it is a name the command writes: :class:`FolderOutput`),
(d) anything that is not a regular file or folder (a device such as ``/dev/full``, a named pipe,
    a socket, or a symbolic link to one),
(e) the current working folder or a folder that holds it,

and, without ``--overwrite``, no existing file and no non-empty folder at all.
"""
from __future__ import annotations

import fnmatch
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from .errors import InputError, check_output_file, check_output_folder, file_exists_error

# A manifest.json larger than this is a sweep's (a schedule's own manifest is a few KiB).
_SMALL_MANIFEST = 1 << 20
# Entries looked at while searching a foreign folder for a results folder to name.
_SEARCH_LIMIT = 10_000


@dataclass(frozen=True)
class FolderOutput:
    """What a folder-writing command writes into its output folder.

    Attributes
    ----------
    command : str
        The command's name, for messages (``report``).
    names : tuple of str
        The entries it writes, as :mod:`fnmatch` patterns (``gantt-*.png``).
    manifest_kind : str, optional
        The ``kind`` of the ``manifest.json`` it writes (a ``manifest.json`` of another kind, or a
        sweep's, which has none, is not its own).
    whole : bool
        True: the folder is replaced as a whole (built beside it, renamed into place); False:
        only the entries named by ``owns`` are deleted and rewritten (a sweep), the rest stays.
    owns : callable, optional
        ``owns(name)``: True for an entry the command writes, instead of ``names``.
    """

    command: str
    names: tuple[str, ...] = ()
    manifest_kind: str | None = None
    whole: bool = True
    owns: Callable[[str], bool] | None = None

    def writes(self, entry: Path) -> bool:
        """True when ``entry`` (a path inside the output folder) is one this command writes."""
        name = entry.name
        if name == "manifest.json" or name.startswith("manifest-shard-"):
            kind = manifest_kind(entry)
            if kind != self.manifest_kind:
                return False
        if self.owns is not None:
            return self.owns(name)
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.names)

    def listing(self) -> str:
        return ", ".join(self.names) if self.names else "its own files"


def manifest_kind(path: Path) -> str | None:
    """The ``kind`` a ``manifest*.json`` states (``vtrain-fast schedule``), or None for a
    sweep's manifest (which states none) and for one that cannot be read."""
    try:
        if path.stat().st_size > _SMALL_MANIFEST:
            return None
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    kind = obj.get("kind") if isinstance(obj, dict) else None
    return kind if isinstance(kind, str) else None


def _is_manifest(name: str) -> bool:
    return fnmatch.fnmatchcase(name, "manifest*.json")


def find_results_folder(root: Path) -> Path | None:
    """The first folder at or under ``root`` with a ``manifest*.json`` (a results folder), or
    None; stops after :data:`_SEARCH_LIMIT` entries."""
    seen = 0
    for here, dirs, files in os.walk(root):
        if any(_is_manifest(f) for f in files):
            return Path(here)
        seen += len(dirs) + len(files)
        if seen > _SEARCH_LIMIT:
            return None
        dirs.sort()
    return None


_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"))


def _special(path: Path) -> str | None:
    """What ``path`` is when it is there and is not a regular file or folder (nor a symbolic link
    to one): ``'a character device'``; else None."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    link = ""
    if stat.S_ISLNK(mode):
        try:
            mode = os.stat(path).st_mode
        except OSError:          # a dangling link: replacing the link harms nothing
            return None
        link = "a symbolic link to "
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    kind = next((text for test, text in _KINDS if test(mode)), "not a regular file or folder")
    return link + kind


def _real(path) -> Path:
    return Path(os.path.realpath(path))


def _within(path: Path, folder: Path) -> bool:
    """``path`` is ``folder`` or lies under it (both resolved)."""
    return path == folder or path.is_relative_to(folder)


def _replaced(p: Path, folder: FolderOutput | None) -> list[Path]:
    """What writing ``p`` deletes or replaces: the file, the whole folder, or (a sweep) the
    folder's own entries."""
    if not os.path.lexists(p):
        return []
    if folder is None or folder.whole or not p.is_dir():
        return [p]
    return [e for e in p.iterdir() if folder.writes(e)]


def _example(p: Path, folder: FolderOutput | None) -> str:
    name = _real(p).name or "out"
    if folder is not None:
        return f"-o {Path(name + '-new') if name else 'out'}"
    stem, suffix = os.path.splitext(name)
    return f"-o {stem}-new{suffix}"


def _held(entry: Path, folder: FolderOutput) -> str:
    """How a message names ``entry``, an entry of the output folder the command did not write."""
    inner = find_results_folder(entry) if entry.is_dir() and not entry.is_symlink() else None
    return f"the results folder {inner}" if inner is not None else f"{entry.name}, which `{folder.command}` did not write"


def check_output(path, option: str = "-o", *, inputs: Iterable = (), overwrite: bool = False,
                 folder: FolderOutput | None = None) -> Path:
    """Refuse an output the command may not write (the rule in this module's docstring); call
    it for every output before any work.

    Parameters
    ----------
    path : str or Path
        The output file or folder.
    option : str
        The option that names it, for messages (``-o``, ``--plot``).
    inputs : iterable of path or None
        Every file or folder the command reads (None entries are skipped).
    overwrite : bool
        ``--overwrite`` given: an existing file, or a folder this command wrote, may be replaced.
    folder : FolderOutput, optional
        The output is a folder and this is what the command writes into it; None: a file.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    InputError
        Naming the path, why it may not be written and what to do instead.
    """
    p = Path(path)
    what = "output folder" if folder is not None else "output file"
    special = _special(p)
    if special:                                                              # (d)
        raise InputError(str(p), option, str(p), "a regular file or folder, or a name not yet taken",
                         f"it is {special}, which is never replaced; choose another {option}, e.g. "
                         f"{_example(p, folder)}")
    if folder is None:
        check_output_file(p)
    else:
        check_output_folder(p)
    replaced = _replaced(p, folder)
    for source in inputs:                                                   # (a)
        if source is None or not os.path.lexists(source):
            continue
        src = _real(source)
        for r in replaced:
            if _within(src, _real(r)):
                held = "is" if src == _real(r) else "holds"
                raise InputError(str(p), option, str(p), "a path that is not one of the command's inputs",
                                 f"it {held} {source}, which this command reads and never replaces; choose "
                                 f"another {option}, e.g. {_example(p, folder)}")
    try:
        here = _real(os.getcwd())
    except OSError:
        here = None
    for r in replaced:                                                      # (e)
        if here is not None and _within(here, _real(r)):
            raise InputError(str(p), option, str(p), "a folder that is not the current folder nor holds it",
                             f"{r} is {'the current folder' if here == _real(r) else 'a folder holding the current one'}"
                             f", which is never replaced; name a new folder, e.g. {option} report")
    if folder is None:
        if os.path.lexists(p) and not overwrite:
            raise file_exists_error(p, what, option)
        return p
    if not p.is_dir():
        return p
    entries = sorted(p.iterdir())
    foreign = [e for e in entries if not folder.writes(e)]
    own_manifest = any(_is_manifest(e.name) and e not in foreign for e in entries)
    if any(_is_manifest(e.name) for e in foreign) and not own_manifest:   # (b)
        raise InputError(str(p), option, str(p), f"a new folder, or one that `{folder.command}` wrote",
                         f"it is a results folder (it has {next(e.name for e in foreign if _is_manifest(e.name))}), "
                         f"which `{folder.command}` never replaces; choose another {option}, e.g. "
                         f"{_example(p, folder)}")
    stray = [e for e in foreign if not e.name.startswith(".lock")]         # (a lock a refused run left)
    if stray and (folder.whole or not own_manifest):                        # (b), (c)
        if folder.whole:
            allowed = f"a new or empty folder, or one that `{folder.command}` wrote ({folder.listing()})"
            why = f"--overwrite replaces only a folder that `{folder.command}` wrote: choose another {option}"
        else:       # a sweep: its own results folder, files the user added to it kept
            allowed = f"a new or empty folder, or a results folder that `{folder.command}` wrote"
            why = f"`{folder.command}` makes a folder its own results folder: name a new folder"
        raise InputError(str(p), option, str(p), allowed,
                         f"it holds {_held(stray[0], folder)}; {why}, e.g. {_example(p, folder)}")
    if folder.whole and entries and not overwrite:
        raise InputError(str(p), option, str(p), "an empty or new folder",
                         f"it holds an earlier `{folder.command}` output; add --overwrite to replace it, or "
                         f"name another folder")
    return p


__all__ = ["FolderOutput", "check_output", "find_results_folder", "manifest_kind"]
