"""What a run reads, stored as what it is: an examples value resolved to absolute paths, the files and folders it
reads, and a fingerprint of the examples that names the first one that changed (issue 33, item 3)."""
from __future__ import annotations

from pathlib import Path

from mrtpo.tasks import examples_paths, resolve_examples
from mrtpo.tasks.base import Example
from mrtpo.tasks.fingerprint import examples_fingerprint, fingerprint_change
from tests.tasks.test_example_ids import _bird


def test_resolve_examples_makes_paths_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_examples("spider:spider") == f"spider:{tmp_path / 'spider'}"
    assert resolve_examples("bird:../b/dev.json") == f"bird:{tmp_path.parent / 'b' / 'dev.json'}"
    assert resolve_examples("mine.jsonl") == str(tmp_path / "mine.jsonl")
    assert resolve_examples("ifeval:in.jsonl") == f"ifeval:{tmp_path / 'in.jsonl'}"
    assert resolve_examples("bfcl:parallel") == "bfcl:parallel"  # a category of the package, not a path
    assert resolve_examples("bfcl:q/BFCL_v4_simple.json") == f"bfcl:{tmp_path / 'q' / 'BFCL_v4_simple.json'}"
    assert resolve_examples(None) is None
    assert resolve_examples(f"spider:{tmp_path}") == f"spider:{tmp_path}"  # already absolute: unchanged


def test_examples_paths_are_what_a_benchmark_reads(tmp_path):
    folder = _bird(tmp_path, [{"question_id": 1, "db_id": "shop", "question": "q", "SQL": "SELECT 1"}])
    assert examples_paths(f"bird:{folder / 'dev.json'}") == [folder / "dev.json", folder / "dev.json",
                                                               folder / "dev_databases"]
    assert examples_paths("q.jsonl") == [Path("q.jsonl")]
    assert examples_paths(None) == []


def test_fingerprint_names_the_first_example_that_changed(tmp_path):
    exs = [Example(f"e{i}", f"prompt {i}", {"reference": i, "db_path": f"/a/{i}.sqlite"}) for i in range(4)]
    fp = examples_fingerprint(exs)
    assert fp["count"] == 4 and len(fp["digests"]) == 4 * 12 and len(fp["sha256"]) == 64
    moved = [Example(e.id, e.prompt, {**e.data, "db_path": "/elsewhere.sqlite", "source": "bird:/x"}) for e in exs]
    assert fingerprint_change(fp, moved) is None  # where the files lie is not what the examples are
    changed = list(exs)
    changed[2] = Example("e2", "A different question entirely", exs[2].data)
    assert fingerprint_change(fp, changed) == ("example 'e2' (number 3) is not the one the run was created with "
                                               "(its id or text changed)")
    assert fingerprint_change(fp, exs[:3]) == "there are 3 examples now, the run was created with 4"
    assert fingerprint_change(fp, [*exs, Example("e9", "more")]) == ("there are 5 examples now, the run was created "
                                                                     "with 4")
    renamed = [Example("x0", exs[0].prompt, exs[0].data), *exs[1:]]
    assert "example 'x0' (number 1)" in fingerprint_change(fp, renamed)
