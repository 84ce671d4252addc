"""Reading results and single plans: queries and Pareto frontiers (``query``), tables and plots
(``report``), evaluating given configurations (``evaluate``), validation against
measurements (``validate``), fitting calibrations (``calibrate``) and NCCL tables (``nccl``).
"""
