"""Multi-constraint instruction following (IFEval-style): one 0/1 reward per verifiable constraint.

An example is a short base request plus 2-4 IFEval constraints. The task prompt x is the request
followed by each constraint's wording, one per line (as IFEval prompts state their instructions).
Reward names are the instruction ids in the listed order; a repeated id gets ``#2``, ``#3``, ...
A reward's verifier information is its constraint's wording, followed by what its checker read in the
reply, quoted (:func:`mrtpo.tasks.base.quote_evidence`); removing it from the list of constraints is what
P_\\k does. Checkers, wordings, each constraint's evidence (the characters its checker read) and the
deliberate differences from IFEval are in :mod:`mrtpo.tasks.ifeval_checks`.

JSONL format (built-in prompts and users' own files), one object a line::

    {"id": "tea-1", "task": "Write a short note about tea.",
     "constraints": [{"id": "punctuation:no_comma", "kwargs": {}},
                     {"id": "keywords:existence", "kwargs": {"keywords": ["green"]}}]}

``kwargs`` may be omitted for instructions without arguments; ``combination:repeat_prompt`` defaults
its ``prompt_to_repeat`` to the example's ``task``.

IFEval's own format (``{"key", "prompt", "instruction_id_list", "kwargs"}`` a line, as google's
``input_data.jsonl``) is read too: the prompt is x as written, each constraint's verifier information its sentence
of the prompt (:mod:`mrtpo.tasks.ifeval_format`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from mrtpo.errors import MrtpoError
from mrtpo.tasks.base import Example, Score, TaskFamily, benchmark_of, sample_data
from mrtpo.tasks.ifeval_format import is_ifeval_line, parse_ifeval
from mrtpo.tasks.ifeval_registry import INSTRUCTIONS, validate

PROMPTS_PATH = sample_data("instructions", "prompts.jsonl")


def reward_names_for(constraint_ids: list[str]) -> list[str]:
    """Instruction ids as reward names; the n-th repeat of an id is suffixed ``#n``."""
    seen: dict[str, int] = {}
    names = []
    for cid in constraint_ids:
        seen[cid] = seen.get(cid, 0) + 1
        names.append(cid if seen[cid] == 1 else f"{cid}#{seen[cid]}")
    return names


def build_prompt(task: str, wordings: list[str]) -> str:
    """The task prompt x: the base request, then each constraint's wording on its own line."""
    return "\n".join([task.strip(), *wordings])


class InstructionsTask(TaskFamily):
    """IFEval-style verifiable constraints, strict 0/1 scores."""

    name = "instructions"
    description = "Short writing requests with 2-4 IFEval constraints; one 0/1 reward per constraint."
    # P_all is the task prompt x (request + every constraint, each followed by what its checker read in the
    # reply); P_\\k is the same without constraint k.
    template = {"prompt": "{prompt}\n{verifier_info}", "item": "{text}", "separator": "\n"}

    def __init__(self, prompts_path: str | Path = PROMPTS_PATH):
        self.prompts_path = Path(prompts_path)
        self._examples: list[Example] | None = None

    # -- examples -------------------------------------------------------------------------------
    def examples(self) -> list[Example]:
        """The built-in prompts from ``sample_data/instructions/prompts.jsonl``."""
        if self._examples is None:
            self._examples = self.load_examples(self.prompts_path)
        return self._examples

    def load_examples(self, path: str | Path) -> list[Example]:
        """Examples from a JSONL file of this family's format or IFEval's (``ifeval:FILE`` names the same file)."""
        if isinstance(path, str) and benchmark_of(path) == "ifeval":
            path = path[len("ifeval:"):]
        return super().load_examples(path)

    def parse_example(self, obj: dict[str, Any]) -> Example:
        """One JSONL object -> Example; KeyError(field) / ValueError('field: problem') when bad."""
        if is_ifeval_line(obj):
            return parse_ifeval(obj, reward_names_for)
        ex_id, task, constraints = obj["id"], obj["task"], obj["constraints"]
        if isinstance(ex_id, int) and not isinstance(ex_id, bool):
            ex_id = str(ex_id)
        if not isinstance(ex_id, str) or not ex_id.strip():
            raise ValueError(f"id: must be a non-empty string, got {ex_id!r}")
        if not isinstance(task, str) or not task.strip():
            raise ValueError(f"task: must be a non-empty string, got {task!r}")
        if not isinstance(constraints, list) or not constraints:
            raise ValueError("constraints: must be a non-empty list of {\"id\", \"kwargs\"} objects")
        parsed = []
        for i, c in enumerate(constraints):
            where = f"constraints[{i}]"
            if not isinstance(c, dict):
                raise ValueError(f"{where}: must be an object with 'id' and 'kwargs'")
            if "id" not in c:
                raise KeyError(f"{where}.id")
            kwargs = c.get("kwargs")
            kwargs = {} if kwargs is None else kwargs
            is_repeat_prompt = c["id"] == "combination:repeat_prompt" and isinstance(kwargs, dict)
            if is_repeat_prompt and kwargs.get("prompt_to_repeat") is None:
                kwargs = {**kwargs, "prompt_to_repeat": task}
            ins, kw = validate(c["id"], kwargs, where)
            parsed.append({"id": ins.id, "kwargs": kw, "wording": ins.wording(kw)})
        names = reward_names_for([c["id"] for c in parsed])
        prompt = build_prompt(task, [c["wording"] for c in parsed])
        return Example(id=ex_id, prompt=prompt, data={"task": task, "constraints": parsed, "rewards": names})

    def replay_prompt(self, example: Example) -> str:
        """The base request alone: the constraints come back in as the verifier information."""
        return example.data["task"].strip()

    # -- rewards --------------------------------------------------------------------------------
    def reward_names(self, example: Example) -> list[str]:
        return list(example.data["rewards"])

    def score(self, example: Example, response: str) -> dict[str, Score]:
        """Strict IFEval check of every constraint: 1.0 when followed, else 0.0 with the reason."""
        if not isinstance(response, str):
            raise MrtpoError(f"response must be a string, got {type(response).__name__}")
        out = {}
        for name, c in zip(example.data["rewards"], example.data["constraints"]):
            out[name] = INSTRUCTIONS[c["id"]].check(response, c["kwargs"])
        return out

    def notes(self, example: Example) -> list[str]:
        """For an IFEval-format example: the constraints whose sentence was not found in its prompt."""
        return list(example.data.get("notes", {}).values())

    def rule_info(self, example: Example) -> dict[str, str]:
        """Each reward's constraint wording."""
        return {name: c["wording"] for name, c in zip(example.data["rewards"], example.data["constraints"])}
