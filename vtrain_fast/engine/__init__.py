"""Running sweeps: one chunk of the index space into its file (``chunks``), chunks on a Dask
cluster (``distributed``), and result folders with resume, repair and merge (``run``).
"""
