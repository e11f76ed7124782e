"""mrtpo: token-level credit assignment for multi-reward RL of language models.

Modules: ``model`` (load/sample), ``templates`` (verifier-info templates), ``relevance`` (replay + JS),
``advantages`` (estimator registry, MRTPO token reallocation), ``tasks`` (verifiers per family),
``pipeline`` (one group end to end), ``render`` (HTML heatmaps), ``cli``.
"""
import os as _os

_os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
_os.environ.setdefault("HF_HUB_OFFLINE", "1")
_os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from mrtpo.errors import MrtpoError  # noqa: E402

__all__ = ["MrtpoError"]
__version__ = "0.1.0"
