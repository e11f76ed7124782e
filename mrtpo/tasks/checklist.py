"""Checklists: a short writing request with up to eight independent items, each its own 0/1 reward.

Many rewards per response is where token credit should matter most: under GDPO every token carries the sum of all K
advantages, so on the tokens that decide item k the other K − 1 are noise. Each item here is read from its own part
of the reply (a word it must mention, how it starts or ends, a bullet's content, a count of bullets, ...), and its
checker states that part as its evidence (:mod:`mrtpo.tasks.checklist_items` lists the kinds and their evidence).

The task prompt x is the request followed by each item's wording, one per line, as the instructions family states
its constraints; P_all is that prompt and P_\\k the same without item k's line. Reward names are the items' ids.

``items`` (``--items K``, :meth:`ChecklistTask.with_items`): the first K items of each example, K = 1–8, so that
runs at K = 2, 4 and 8 share their prompts and each smaller checklist is part of the larger one.

JSONL format (built-in prompts and users' own files), one object a line::

    {"id": "beach", "task": "Write a packing list for a day at the beach.",
     "items": [{"kind": "mention", "word": "towel"},
               {"kind": "ends_with", "phrase": "Have fun!"},
               {"kind": "bullets", "count": 4, "relation": "at least"},
               {"kind": "bullet_mentions", "bullet": 1, "word": "hat", "id": "first-hat"}]}

Each item has a ``kind`` and that kind's arguments; ``id`` (its reward name) defaults to the kind and its argument
(``mention:towel``). An example holds 1–8 items with distinct ids.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from mrtpo.errors import MrtpoError
from mrtpo.tasks.base import Example, Score, TaskFamily, sample_data
from mrtpo.tasks.checklist_items import MAX_ITEMS, check_item, parse_item

PROMPTS_PATH = sample_data("checklist", "prompts.jsonl")


def build_prompt(task: str, wordings: list[str]) -> str:
    """The task prompt x: the request, then each item's wording on its own line."""
    return "\n".join([task.strip(), *wordings])


class ChecklistTask(TaskFamily):
    """Writing requests with a checklist of 1–8 independent items; one 0/1 reward per item."""

    name = "checklist"
    description = "Short writing requests with a checklist of up to 8 items; one 0/1 reward per item."
    template = {"prompt": "{prompt}\n{verifier_info}", "item": "{text}", "separator": "\n"}

    def __init__(self, prompts_path: str | Path = PROMPTS_PATH):
        self.prompts_path = Path(prompts_path)
        self._examples: list[Example] | None = None

    def examples(self) -> list[Example]:
        """The built-in checklists from ``sample_data/checklist/prompts.jsonl`` (eight items each)."""
        if self._examples is None:
            self._examples = self.load_examples(self.prompts_path)
        return self._examples

    def parse_example(self, obj: dict[str, Any]) -> Example:
        """One JSONL object -> Example; KeyError(field) / ValueError('field: problem') when bad."""
        ex_id, task, items = obj["id"], obj["task"], obj["items"]
        for key in obj:
            if key not in ("id", "task", "items"):
                raise ValueError(f"{key}: unknown field (a checklist line has id, task and items)")
        if isinstance(ex_id, int) and not isinstance(ex_id, bool):
            ex_id = str(ex_id)
        if not isinstance(ex_id, str) or not ex_id.strip():
            raise ValueError(f"id: must be a non-empty string, got {ex_id!r}")
        if not isinstance(task, str) or not task.strip():
            raise ValueError(f"task: must be a non-empty string, got {task!r}")
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_ITEMS:
            n = len(items) if isinstance(items, list) else type(items).__name__
            raise ValueError(f"items: must be a list of 1 to {MAX_ITEMS} items, got {n}")
        parsed: list[dict] = []
        for i, obj_i in enumerate(items):
            item = parse_item(obj_i, f"items[{i}]")
            twin = next((j for j, p in enumerate(parsed) if p["id"] == item["id"]), None)
            if twin is not None:
                raise ValueError(f"items[{i}].id: duplicate item id {item['id']!r} (also items[{twin}]); each item "
                                 "is its own reward and needs its own id")
            parsed.append(item)
        return _example(ex_id.strip(), task.strip(), parsed)

    def with_items(self, examples: list[Example], k: int) -> list[Example]:
        """Copies of ``examples`` holding their first ``k`` items (1 ≤ k ≤ 8); MrtpoError naming an example that
        has fewer."""
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_ITEMS:
            raise MrtpoError(f"items must be an integer from 1 to {MAX_ITEMS}, got {k!r}")
        out = []
        for ex in examples:
            have = ex.data["items"]
            if len(have) < k:
                raise MrtpoError(f"example '{ex.id}' has {len(have)} item{'s' if len(have) != 1 else ''}; "
                                 f"items {k} asks for more (use at most {len(have)}, or give it more items)")
            out.append(_example(ex.id, ex.data["task"], have[:k]))
        return out

    def replay_prompt(self, example: Example) -> str:
        """The request alone: the items come back in as the verifier information."""
        return example.data["task"]

    def reward_names(self, example: Example) -> list[str]:
        return [it["id"] for it in example.data["items"]]

    def score(self, example: Example, response: str) -> dict[str, Score]:
        """Every item's strict check: 1.0 when met, else 0.0 with the reason; each with its evidence."""
        if not isinstance(response, str):
            raise MrtpoError(f"response must be a string, got {type(response).__name__}")
        return {it["id"]: check_item(it, response) for it in example.data["items"]}

    def rule_info(self, example: Example) -> dict[str, str]:
        """Each item's wording."""
        return {it["id"]: it["wording"] for it in example.data["items"]}


def _example(ex_id: str, task: str, items: list[dict]) -> Example:
    return Example(id=ex_id, prompt=build_prompt(task, [it["wording"] for it in items]),
                   data={"task": task, "items": items})
