"""vtrain_fast: analytic cost model and sweep engine for large-language-model training plans."""
__version__ = "0.1.0"
