"""The text of TRL's prompts and completions (plain strings or conversations), read by the trainer
(:mod:`mrtpo.integrations.trl`) and its credit log (:mod:`mrtpo.creditlog.trl_writer`); no TRL import."""
from __future__ import annotations

from typing import Any

from mrtpo.errors import MrtpoError


def prompt_text(prompt: Any) -> str:
    """The task prompt x of a TRL prompt: a plain string, or the last user message of a conversation."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)) and prompt:
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"] or list(prompt)
        return _content(users[-1].get("content", "") if isinstance(users[-1], dict) else users[-1])
    raise MrtpoError(f"cannot read the prompt text of a {type(prompt).__name__} prompt")


def completion_text(completion: Any) -> str:
    """A TRL completion as text (plain string, or the assistant messages joined)."""
    if isinstance(completion, str):
        return completion
    return "".join(_content(m.get("content", "")) for m in completion if isinstance(m, dict))


def _content(c: Any) -> str:
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return "".join(p.get("text", "") for p in c if isinstance(p, dict) and p.get("type", "text") == "text")
    return str(c)
