"""The cost model: Numba-compiled scalar cost formulas (``ops``, ``comm``, ``memory``), one
configuration (``step``), the parallel drivers over many configurations (``sweep``), the
parallel layout (``layout``), the registry of training settings it reads (``settings``), the
machine-vector and output layouts (``records``) and the one njit policy (``_jit``). The lowest
layer: nothing here imports another folder of the package.
"""
