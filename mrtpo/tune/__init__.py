"""Tuning the credit (``mrtpo tune``): which wording of each reward's verifier information and which relevance
measure put each reward's ρ on the tokens its checker reads — chosen per reward on a tuning draw, judged on a
held-out draw (other examples, other seeds) beside today's configuration, and written to a choice file that every
consumer reads.  :mod:`.space` (the candidates, as data), :mod:`.choice` (the file), :mod:`.apply` (a choice
applied), :mod:`.search` (the run), :mod:`.select` (the choice and its judgement), :mod:`.cache` (resuming)."""
from mrtpo.tune.choice import Choice, ChoiceError, Entry, load_choice, model_identity, parse_choice, save_choice

__all__ = ["Choice", "ChoiceError", "Entry", "load_choice", "model_identity", "parse_choice", "save_choice"]
