"""gapo: GAPO (Group Adaptive Clipping Policy Optimization, arXiv 2609.00444) and its baselines.

The math lives in small pure modules that import nothing heavy beyond torch:
``clipping`` (ε schedules), ``losses`` (clipped surrogates), ``aggregation``,
``advantages`` and ``metrics``. The trainer, CLI and integrations build on them.
"""

__version__ = "0.1.0"
