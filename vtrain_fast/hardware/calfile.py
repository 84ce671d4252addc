"""Reading and writing calibration files (TOML, one table per GPU preset)."""
from __future__ import annotations

from datetime import date
from pathlib import Path

from ..io.errors import InputError, check_output_file, write_atomically
from .gpus import CALIBRATION_RANGES, PRESETS
from ..io.inputs import read_toml


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(float(v)) if isinstance(v, float) else str(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def read_calibration_output(path: str | Path) -> dict:
    """The TOML document of the calibration file ``path`` that ``calibrate -o`` is about to
    update (``{}`` when it does not exist yet); call it before any work.

    The file must be a calibration file: top-level tables named after GPU presets holding
    calibration parameters (:data:`~vtrain_fast.hardware.gpus.CALIBRATION_RANGES`), and ``[meta]``
    with one table per preset. Anything else (a sweep spec, another TOML) is refused and left
    untouched.

    Raises
    ------
    InputError
        ``path`` is a folder or under a file, not a regular file, over 16 MiB, not UTF-8 TOML,
        or not a calibration file.
    """
    check_output_file(path)
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        return {}
    fix = "choose another -o (the file was left unchanged) or delete the file"
    try:
        doc = read_toml(p, "calibration TOML file")
    except InputError as e:         # the reader's message, and that the file was left unchanged
        raise InputError(e.where, e.key, e.value, e.allowed, f"{e.fix}; {fix}" if e.fix else fix) from None
    allowed = ("a calibration file: one table per GPU preset (" + ", ".join(PRESETS) + ") with calibration "
               "parameters (" + ", ".join(CALIBRATION_RANGES) + "), and [meta]")
    for name, table in doc.items():
        if name == "meta":
            bad = [k for k, v in table.items() if k not in PRESETS or not isinstance(v, dict)] \
                if isinstance(table, dict) else ["meta"]
            if bad:
                raise InputError(str(p), "meta" if bad == ["meta"] else f"meta.{bad[0]}",
                                 table if bad == ["meta"] else table[bad[0]], allowed,
                                 "this is not a calibration file: " + fix)
            continue
        if name not in PRESETS or not isinstance(table, dict):
            raise InputError(str(p), *(("table", f"[{name}]") if isinstance(table, dict) else (name, table)), allowed,
                             "this is not a calibration file: " + fix)
        for k, v in table.items():
            if k not in CALIBRATION_RANGES or isinstance(v, bool) or not isinstance(v, (int, float)):
                raise InputError(str(p), f"{name}.{k}", v, allowed, "this is not a calibration file: " + fix)
    return doc


def update_calibration_file(path: str | Path, gpu: str, values: dict, meta: dict | None = None,
                            comment: tuple[str, ...] = ()) -> None:
    """Set ``values`` in table ``[gpu]`` of the calibration file at ``path`` (created if
    missing; other tables and keys are kept) and write it atomically.

    ``meta`` (strings and numbers) is stored under ``[meta.<gpu>]`` for provenance, with
    today's ``date``. ``comment`` lines are written as ``#`` lines under the header line (a
    file's earlier comments are not kept: TOML comments are not read back).

    Raises
    ------
    InputError
        ``path`` is not a calibration file (:func:`read_calibration_output`); it is then left
        untouched.
    """
    p = Path(path)
    doc = read_calibration_output(p)
    doc.setdefault(gpu, {}).update({k: float(v) for k, v in values.items()})
    doc.setdefault("meta", {}).setdefault(gpu, {}).update({**(meta or {}), "date": date.today().isoformat()})
    lines = ["# vtrain_fast calibration: one table per GPU preset (see `vtrain-fast calibrate`)."]
    lines += [("# " + c).rstrip() for c in comment]
    for name, table in doc.items():
        if name == "meta":
            continue
        lines.append(f"\n[{name}]")
        lines += [f"{k} = {_fmt(v)}" for k, v in table.items()]
    for name, table in doc.get("meta", {}).items():
        lines.append(f'\n[meta."{name}"]')
        lines += [f"{k} = {_fmt(v)}" for k, v in table.items()]
    text = "\n".join(lines) + "\n"
    write_atomically(p, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
