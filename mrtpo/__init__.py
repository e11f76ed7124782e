"""mrtpo: token-level credit assignment for multi-reward RL of language models.

Importing mrtpo changes nothing in the process (no environment variables); mrtpo's own model loading is offline
(``local_files_only``), and the CLI and the app quiet the tokenizers' fork warning for their own processes.
"""
from mrtpo.errors import MrtpoError

__all__ = ["MrtpoError"]
__version__ = "0.1.0"
