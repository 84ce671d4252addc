"""Numba kernels: scalar cost formulas (``ops``, ``comm``, ``memory``), one configuration
(``step``), and the parallel drivers over many configurations (``sweep``).

Kernels import nothing from the spec, writer, query, report or cli modules.
"""
