"""A task family as TRL's pieces, so that :class:`mrtpo.integrations.trl.MRTPOGRPOTrainer` (or a plain
``trl.GRPOTrainer``) trains on mrtpo's own tasks and checkers::

    task = task_for_trl(get_family("checklist"), get_family("checklist").with_items(examples, 4))
    trainer = MRTPOGRPOTrainer(model=..., reward_funcs=task.reward_funcs, train_dataset=Dataset.from_list(task.rows),
                               verifier_info_fn=task.verifier_info, replay_prompt_fn=task.replay_prompt, ...)

TRL takes a fixed list of reward functions, while a family's reward names can differ from example to example (a
checklist's items, an instruction's constraints). The functions are therefore positional: ``<family>_1`` ..
``<family>_K`` (K the most rewards any example has), function k scoring the k-th reward of each completion's own
example (None where that example has fewer, which TRL skips). Each row of the dataset is ``{"prompt": [the user
message x], "example_id": id}``; TRL hands ``example_id`` to the reward functions and the row to
``verifier_info``. ``verifier_info`` gives the family's v_k (in the ``info`` regime) under the positional names, and
``replay_prompt`` the text that fills the template's ``{prompt}`` (:meth:`TaskFamily.replay_prompt`: for checklists
and instructions the request without its items, which the verifier information brings back).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mrtpo.core.info import INFO, check_info
from mrtpo.errors import MrtpoError
from mrtpo.integrations.trl_text import completion_text
from mrtpo.tasks.base import Example, Score, TaskFamily


@dataclass
class TaskForTRL:
    """A family's examples as TRL's dataset rows, positional reward functions, verifier information and replay
    prompts (module docstring)."""

    family: TaskFamily
    examples: list[Example]
    info: str = INFO
    by_id: dict[str, Example] = field(init=False)
    names: list[str] = field(init=False)  # the reward functions' names, in order
    _scores: dict = field(init=False, default_factory=dict)  # (example id, completion) → its scores, the last batch's

    def __post_init__(self):
        check_info(self.info)
        if not self.examples:
            raise MrtpoError(f"task '{self.family.name}': no examples to train on")
        self.by_id = {ex.id: ex for ex in self.examples}
        k = max(len(self.family.reward_names(ex)) for ex in self.examples)
        self.names = [f"{self.family.name}_{i + 1}" for i in range(k)]

    @property
    def rows(self) -> list[dict]:
        """The dataset: one row per example, its prompt as a one-message conversation and its id."""
        return [{"prompt": [{"role": "user", "content": ex.prompt}], "example_id": ex.id} for ex in self.examples]

    @property
    def reward_funcs(self) -> list:
        """One function per reward position, ``(prompts, completions, example_id, **kw) -> [float | None]``."""
        return [self._reward_func(i) for i in range(len(self.names))]

    def _example(self, example_id: Any) -> Example:
        ex = self.by_id.get(str(example_id))
        if ex is None:
            raise MrtpoError(f"task '{self.family.name}': a row's example_id {example_id!r} is not one of the task's "
                             "examples (give TRL the rows of task_for_trl)")
        return ex

    def score(self, example_id: Any, completion: Any) -> dict[str, Score]:
        """The family's scores of ``completion`` for its example (scored once for all the positional functions)."""
        ex, text = self._example(example_id), completion_text(completion)
        key = (ex.id, text)
        if key not in self._scores:
            if len(self._scores) > 4096:  # the scores of earlier batches are not asked for again
                self._scores.clear()
            self._scores[key] = self.family.score(ex, text)
        return self._scores[key]

    def _reward_func(self, i: int):
        def reward(prompts, completions, example_id, **kw) -> list[float | None]:
            out = []
            for eid, c in zip(example_id, completions):
                names = self.family.reward_names(self._example(eid))
                out.append(float(self.score(eid, c)[names[i]].value) if i < len(names) else None)
            return out
        reward.__name__ = self.names[i]
        return reward

    def verifier_info(self, prompt, completion, example: dict, info: str | None = None) -> dict[str, str]:
        """v_k of the completion's example under the positional names (in the regime ``info``, default the
        task's)."""
        ex = self._example(example["example_id"])
        text = completion_text(completion)
        scores = self.score(ex.id, completion)
        v = self.family.verifier_info(ex, text, scores, info or self.info)
        return {self.names[i]: v[k] for i, k in enumerate(self.family.reward_names(ex))}

    def replay_prompt(self, prompt, example: dict) -> str:
        """What fills the template's ``{prompt}`` when the completion is replayed."""
        return self.family.replay_prompt(self._example(example["example_id"]))


def task_for_trl(family: TaskFamily, examples: list[Example] | None = None, info: str = INFO) -> TaskForTRL:
    """TRL's pieces for ``family`` on ``examples`` (default: its built-in ones)."""
    return TaskForTRL(family, list(family.examples() if examples is None else examples), info)
