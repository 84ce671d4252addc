"""GPUs as data: the GPU presets read from ``vtrain_fast/data/gpus/*.toml``, their calibration
and override ranges, the machine vector the kernels read (``gpus``), and calibration files
(``calfile``). Loads without Numba.
"""
