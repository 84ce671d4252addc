"""Files in and out: error messages and output-path checks (``errors``), bounded TOML/CSV input
reading (``inputs``), the result columns (``schema``) and result folders' parts, records and
manifests (``writer``). The name shadows no stdlib import: every import of it is package
relative or ``vtrain_fast.io``.
"""
