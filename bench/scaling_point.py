"""One point of the scaling benchmark (bench/scaling.py): a replay of a synthetic group of G responses × T tokens
under K rewards, its time, forward tokens, the decoder / vocabulary split and its peak memory above the loaded model.

    PYTHONPATH=$PWD python bench/scaling_point.py '<a Point as JSON>'   # what bench/scaling.py runs per point

prints ``RESULT {json}`` as its last line. On a CPU every point runs in a fresh process like this, so that its peak
memory is its own (no allocator cache or weights of an earlier point); on CUDA the points run in one process and
the peak is ``torch.cuda.max_memory_allocated`` above the level before the replay.

- **Responses**: token ids drawn uniformly (seeded) from the tokenizer's ordinary ids (no special ids), T per
  response, not sampled: sampling 2,000 tokens would cost far more than the replay it precedes. A teacher-forced
  replay's cost depends on the lengths, not on the text (no early stop; the only content-dependent shortcut, a
  variant whose hidden state equals P_all's, never happens with distinct random responses).
- **Prompt**: the text-to-SQL task's first example under its template; K checker descriptions of realistic length
  (:data:`CHECKERS`), the same for every response (the ``rule`` regime: verifier text shared across responses).
- **Models**: the base model (``default``: SmolLM2-135M) or, for the vocabulary factor and the memory point, a random
  ``LlamaForCausalLM`` with the base's width, heads, MLP and rotary settings, a chosen number of layers and
  vocabulary V, tied head (SmolLM2's, Qwen 2.5 small's and Gemma's layout), over the base's tokenizer. Llama's config
  class for every V keeps the replay's path (the own pass, :mod:`mrtpo.model.llama_step`) the same for all of them,
  so that only V changes; Qwen 2 (q/k/v biases) and Gemma (sliding windows) run through transformers' layers.
- **Split**: the time inside :func:`mrtpo.replay.kvtrie.shared_hidden` (the decoder passes) and inside the engine's
  vocabulary step (``mrtpo.replay.engine.vocabulary_side``: projection, log-softmax, JS) are read by wrapping
  those two functions from here (:func:`phase_timers`); the library is unchanged and so are its numbers.
"""
from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

# (reward, what its checker verifies): the first K are a point's verifier information
CHECKERS = (
    ("format", "the reply is one SQL query in a ```sql code block, with nothing after the block"),
    ("valid", "the query parses and runs on the database above without an error"),
    ("correct", "the rows the query returns equal those of the reference query, in any order"),
    ("concise", "the reply is at most 200 words long, the query included"),
    ("tables", "the query reads only the tables that the question needs, joined on their keys"),
    ("style", "SQL keywords are upper-case and every column is qualified by its table's name"),
    ("readonly", "the query only reads: no INSERT, UPDATE, DELETE, DROP or PRAGMA statement"),
    ("explained", "one sentence before the query says what it computes and from which tables"),
)
# the functions of mrtpo.replay.engine whose time is the decoder's and the vocabulary side's
PHASES = {"decoder": "shared_hidden", "vocabulary": "vocabulary_side"}


@dataclass(frozen=True)
class Point:
    """What one point replays. ``vocab`` None: the base model ``model`` itself; else a random Llama of the base's
    shape with ``vocab`` entries and ``layers`` layers (None: the base's). ``dtype``: ``auto`` (the model as loaded,
    the replay's default precision: bf16 weight copies on CUDA and on AMX / AVX512-BF16 CPUs) or ``float32`` /
    ``bfloat16`` (the model cast to it, the replay in that dtype)."""

    T: int
    K: int
    G: int
    vocab: int | None = None
    layers: int | None = None
    model: str = "default"
    device: str = "auto"
    dtype: str = "auto"
    repeats: int = 1
    seed: int = 0


def status_bytes(text: str, field: str) -> int:
    """A ``/proc/self/status`` field given in kB (``VmHWM``, ``VmRSS``), in bytes; KeyError if it is not there."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key == field:
            number, unit = value.split()
            if unit != "kB":
                raise ValueError(f"/proc/self/status {field}: unit {unit!r}, not kB")
            return int(number) * 1024
    raise KeyError(field)


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        return status_bytes(f.read(), field)


def reset_hwm() -> bool:
    """Reset this process's RSS high-water mark (VmHWM) to its RSS (Linux ≥ 4.0: ``5`` to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status("VmHWM") <= _status("VmRSS") + (1 << 20)
    except (OSError, KeyError, ValueError):
        return False


class PeakMemory:
    """The peak memory of a block above its level at entry, in bytes (``.peak``): on CUDA torch's peak allocated
    memory; on a CPU the process's RSS high-water mark (reset at entry) — every page the block touched at once, the
    allocator's included — or, where the mark cannot be reset, the RSS sampled every 2 ms (may miss a short peak)."""

    def __init__(self, device: torch.device):
        self.device, self.peak = torch.device(device), 0

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return self
        self.base = _status("VmRSS")
        self._thread = None
        if not reset_hwm():
            self._stop, self._seen = False, self.base
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self):
        while not self._stop:
            self._seen = max(self._seen, _status("VmRSS"))
            time.sleep(0.002)

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device) - self.base
        elif self._thread is None:
            self.peak = _status("VmHWM") - self.base
        else:
            self._stop = True
            self._thread.join()
            self.peak = max(self._seen, _status("VmRSS")) - self.base
        self.peak = max(0, self.peak)


@contextlib.contextmanager
def timers(targets: dict, sync=lambda: None):
    """Seconds spent in the functions ``targets`` names — {key: [(owner, attribute name), ...]}, each call's time
    added to its key — while the block runs, by wrapping them (``sync`` before and after each call: CUDA's work is
    asynchronous); restored after. RuntimeError naming a function that is not there (nothing is wrapped then)."""
    places = [(key, owner, name) for key, pairs in targets.items() for owner, name in pairs]
    saved = [(owner, name, getattr(owner, name, None)) for _, owner, name in places]
    for (key, owner, name), (_, _, fn) in zip(places, saved):
        if not callable(fn):
            raise RuntimeError(f"{getattr(owner, '__name__', owner)}.{name} is gone: the benchmark times the "
                               f"replay's {key} by wrapping it (update its targets)")
    spent = dict.fromkeys(targets, 0.0)
    for (key, owner, name), (_, _, fn) in zip(places, saved):

        def timed(*a, _fn=fn, _key=key, **kw):
            sync()
            t0 = time.perf_counter()
            try:
                return _fn(*a, **kw)
            finally:
                sync()
                spent[_key] += time.perf_counter() - t0

        setattr(owner, name, timed)
    try:
        yield spent
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def phase_timers(sync=lambda: None):
    """:func:`timers` of :data:`PHASES` (the decoder passes, the vocabulary side): those functions of
    :mod:`mrtpo.replay.engine`."""
    from mrtpo.replay import engine

    return timers({phase: [(engine, name)] for phase, name in PHASES.items()}, sync)


def random_model(base, vocab: int, layers: int | None, min_positions: int = 0, seed: int = 0):
    """A random ``LlamaForCausalLM`` of ``base``'s shape (a LoadedModel) with ``vocab`` entries and ``layers`` layers
    (None: the base's), tied head, on the base's device in its dtype, over its tokenizer (seeded weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from mrtpo.model import LoadedModel
    from mrtpo.model.rng import seeded_global

    c = base.model.config
    heads = c.num_attention_heads
    extra = {"rope_parameters": dict(c.rope_parameters)} if getattr(c, "rope_parameters", None) else {}
    tok = base.tokenizer
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=layers or c.num_hidden_layers, num_attention_heads=heads,
        num_key_value_heads=getattr(c, "num_key_value_heads", None) or heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads, rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=max(int(getattr(c, "max_position_embeddings", 0) or 0), min_positions),
        tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, **extra)
    with seeded_global(seed), torch.device(base.device):
        model = LlamaForCausalLM(cfg)
    model = model.to(dtype=base.dtype).eval()
    name = f"random Llama, {cfg.num_hidden_layers} layers × {c.hidden_size}, V = {vocab:,}"
    return LoadedModel(model=model, tokenizer=tok, name=name, device=base.device, dtype=base.dtype)


def synthetic_group(lm, T: int, K: int, G: int, seed: int = 0):
    """(prompt, verifier information, G responses of T token ids, template): the SQL task's first example, the
    first K of :data:`CHECKERS` (``check9`` … past 8), random ordinary token ids of the tokenizer (seeded)."""
    from mrtpo.groups import template_for
    from mrtpo.tasks import get_family

    fam = get_family("sql")
    ex = fam.examples()[0]
    info = {name: text for name, text in CHECKERS[:K]}
    for j in range(len(CHECKERS), K):
        info[f"check{j + 1}"] = f"requirement {j + 1} of the task holds for every row the query returns"
    n = min(len(lm.tokenizer), lm.model.get_output_embeddings().weight.shape[0])
    ordinary = np.setdiff1d(np.arange(n), np.array(sorted(set(lm.tokenizer.all_special_ids)), dtype=np.int64))
    ids = np.random.default_rng(seed).choice(ordinary, size=(G, T))
    return ex.prompt, info, [[int(t) for t in row] for row in ids], template_for(fam)


def _dtype(name: str) -> torch.dtype | None:
    return {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def load(p: Point, models: dict | None = None):
    """The LoadedModel of point ``p`` (the base model, or a random one of its shape), from ``models`` when there."""
    from mrtpo.model import load_model

    models = {} if models is None else models
    key = (p.model, p.device, p.dtype)
    if key not in models:
        lm = load_model(p.model, p.device)
        dt = _dtype(p.dtype)
        if dt is not None and dt != lm.dtype:
            lm = replace(lm, model=lm.model.to(dt), dtype=dt)
        models.clear()  # one base model at a time (a GPU grid holds the default model, not every V's as well)
        models[key] = lm
    base = models[key]
    if p.vocab is None:
        return base
    prompt, info, _, template = synthetic_group(base, 0, p.K, 0)
    need = len(base.encode(base.chat_prompt(template.fill(prompt, info)))) + p.T  # P_all (the longest) + a response
    return random_model(base, p.vocab, p.layers, min_positions=max(8192, need), seed=p.seed)


def measure(p: Point, models: dict | None = None) -> dict:
    """Replay point ``p`` (a warm-up replay of one response of length T first, then the best of ``p.repeats``): its
    figures as a JSON-ready dict (see the keys below)."""
    from mrtpo.model import compute_dtype, decoder_stack
    from mrtpo.replay import ReplayConfig, replay_group

    try:
        from bench import floor
    except ImportError:
        import floor

    lm = load(p, models)
    cuda = lm.device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(lm.device)

    cfg = ReplayConfig(precision="auto" if p.dtype == "auto" else "model")
    prompt, info, responses, template = synthetic_group(lm, p.T, p.K, p.G, p.seed)
    # warm-up: one response of the same length (the vocabulary side's shapes, most of the passes'), so that first
    # calls (kernels made for a new shape, the head paged in) are not timed
    w_prompt, w_info, w_resp, _ = synthetic_group(lm, p.T, p.K, 1, p.seed + 1)
    best = None
    # the peak above the loaded model counts from before the warm-up: the process keeps freed memory for reuse
    # (mrtpo.model.heap), so a peak counted from after it would miss what the warm-up left mapped
    with PeakMemory(lm.device) as mem:
        replay_group(lm, w_prompt, w_info, w_resp, template, config=cfg)
        for _ in range(max(1, p.repeats)):
            with phase_timers(sync) as spent:
                sync()
                t0 = time.perf_counter()
                res = replay_group(lm, prompt, info, responses, template, config=cfg)
                sync()
                seconds = time.perf_counter() - t0
            if best is None or seconds < best[0]:
                best = (seconds, dict(spent), res)
    seconds, spent, res = best
    head = lm.model.get_output_embeddings().weight
    dtype = compute_dtype(lm, cfg.precision)
    return {
        "point": asdict(p), "model": lm.name, "device": str(lm.device), "compute_dtype": str(dtype).removeprefix(
            "torch."), "layers": int(lm.model.config.num_hidden_layers), "vocab": int(head.shape[0]),
        "hidden": int(head.shape[1]), "seconds": seconds, "decoder_s": spent["decoder"],
        "vocabulary_s": spent["vocabulary"], "forward_tokens": int(res.forward_tokens),
        "forward_passes": int(res.forward_passes), "prefix_tokens": int(res.prefix_tokens),
        "head_rows": (1 + len(res.rewards)) * sum(len(r) for r in responses), "peak_bytes": int(mem.peak),
        "weights_bytes": int(sum(q.numel() * q.element_size() for q in lm.model.parameters())),
        "n_lin": floor.linear_weights(decoder_stack(lm.model)), "dtype_bytes": dtype.itemsize,
    }


def run_script(script: Path, args: list[str], what: str, timeout: float | None = None) -> dict:
    """Run the Python file ``script`` with ``args`` in a fresh process, this process's ``mrtpo`` and ``bench`` first
    on the path; its last ``RESULT {json}`` line, parsed. RuntimeError naming ``what`` with the child's last output
    lines when it fails."""
    import os
    import subprocess

    import mrtpo

    env = dict(os.environ)
    roots = [str(Path(mrtpo.__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1])]
    env["PYTHONPATH"] = os.pathsep.join(roots + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    out = subprocess.run([sys.executable, str(Path(script).resolve()), *args], env=env, capture_output=True,
                         text=True, timeout=timeout)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        tail = "\n".join((out.stdout + out.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"{what} failed (exit {out.returncode}):\n{tail}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def run_isolated(p: Point, timeout: float | None = None) -> dict:
    """:func:`measure` of ``p`` in a fresh Python process (this file, :func:`run_script`)."""
    return run_script(Path(__file__), [json.dumps(asdict(p))], f"point {asdict(p)}", timeout)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    p = Point(**json.loads(argv[0]))
    print("RESULT " + json.dumps(measure(p)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
