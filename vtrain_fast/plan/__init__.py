"""What to sweep: model presets and shapes (``models``), sweep specs (``spec``) and the grid that
turns a spec into kernel arrays (``grid``). Loads without Numba up to ``spec``.
"""
