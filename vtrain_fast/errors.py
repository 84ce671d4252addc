"""User-facing errors. Each names the file, the key or column, the value, what is allowed and a fix."""
from __future__ import annotations


class InputError(ValueError):
    """Bad user input (spec, CSV, calibration file, results folder).

    The CLI prints the message and exits with status 2.
    """

    def __init__(self, where: str, key: str, value, allowed: str, fix: str = ""):
        self.where, self.key, self.value, self.allowed, self.fix = where, key, value, allowed, fix
        msg = f"{where}: {key} = {value!r} is not allowed; allowed: {allowed}"
        if fix:
            msg += f". Fix: {fix}"
        super().__init__(msg)
