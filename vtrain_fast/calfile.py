"""Reading and writing calibration files (TOML, one table per GPU preset)."""
from __future__ import annotations

import tomllib
from datetime import date
from pathlib import Path

from .errors import InputError, check_output_file, write_atomically


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(float(v)) if isinstance(v, float) else str(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def update_calibration_file(path: str | Path, gpu: str, values: dict, meta: dict | None = None) -> None:
    """Set ``values`` in table ``[gpu]`` of the calibration file at ``path`` (created if
    missing; other tables and keys are kept) and write it atomically.

    ``meta`` (strings and numbers) is stored under ``[meta.<gpu>]`` for provenance, with
    today's ``date``.
    """
    check_output_file(path)
    p = Path(path)
    doc = {}
    if p.exists():
        try:
            doc = tomllib.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise InputError(str(p), "calibration file", str(e).splitlines()[0] if str(e) else type(e).__name__,
                             "a missing file or a valid calibration TOML to update",
                             "choose another -o or delete the file") from None
    doc.setdefault(gpu, {}).update({k: float(v) for k, v in values.items()})
    doc.setdefault("meta", {}).setdefault(gpu, {}).update({**(meta or {}), "date": date.today().isoformat()})
    lines = ["# vtrain_fast calibration: one table per GPU preset (see `vtrain-fast calibrate`)."]
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
