"""A run trained with a choice file (``TrainConfig.tuned``, written by ``mrtpo tune``): the choice read and checked
against the run's model and task when the trainer is made, and each step's replays worded and measured as it says
(:func:`mrtpo.tune.apply.tuned_replays`)."""
from __future__ import annotations

from mrtpo.errors import MrtpoError
from mrtpo.model import LoadedModel
from mrtpo.replay.attention import attention_problem
from mrtpo.tasks.base import TaskFamily
from mrtpo.tune import Choice, load_choice, model_identity
from mrtpo.tune.apply import replay_inputs


def run_choice(path: str | None, family: TaskFamily) -> Choice | None:
    """The run's choice (None without one), validated and checked against its task (a ChoiceError naming the file
    and what is wrong)."""
    return None if path is None else load_choice(path).check(family=family.name)


def check_choice_fits(choice: Choice, lm: LoadedModel) -> None:
    """A ChoiceError when ``choice`` was tuned on another model; MrtpoError when a measure it gives reads P_all's
    attention and ``lm`` cannot give it — both before anything is stored or sampled."""
    choice.check(model_identity(lm))
    problem = attention_problem(lm) if replay_inputs(choice)["attention"] else None
    if problem:
        raise MrtpoError(f"{choice.source}: a measure it gives reads P_all's attention: {problem} (nothing was "
                         "stored)")
