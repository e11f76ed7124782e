"""The replay's element-wise vocabulary chain — log-softmax, the sampled tokens' log-probabilities and the JS
distances of one chunk of logits — eager, or compiled into one fused kernel.

Per token t and variant k, from the logits z_all (P_all) and z_k (P_\\k; below float32 their difference from z_all):

    log p = log_softmax(cap(z_all + b)),  log q_k = log_softmax(cap(z_k + b)),  d_kt = JS(p, q_k)  (mrtpo.core.js)

Eager, each step of that chain is one pass over (1 + K) × n × V floats (about fifteen of them). Compiled
(``torch.compile``, inductor's C++ backend on a CPU), the chain is a few loops per row that read the logits once
from memory and keep the rest in cache: the same formula, equal to the eager one within float32 rounding (the
reductions' order and the vectorized exp / log differ in the last bits). Compiling costs once per process (less from
inductor's disk cache); :func:`use_fused` weighs that against the chain's size.
"""
from __future__ import annotations

import warnings
from typing import Callable

import torch

from mrtpo.core.js import js_distance
from mrtpo.errors import MrtpoError

# "auto" compiles the chain on a CPU when a replay has at least this many logits (rows × vocabulary): enough eager
# chain that the time saved is more than the first compilation costs; once it is compiled in this process, every
# replay uses it
FUSE_MIN_LOGITS = 1 << 32
FUSED = ("auto", "on", "off")

Step = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def logprobs(z: torch.Tensor, bias: torch.Tensor | None, cap: float | None) -> torch.Tensor:
    """log_softmax(cap(z + b)) over the last dimension, as the model's own logits: ``bias`` the head's (V,) bias
    or None, ``cap`` Gemma 2's final soft-cap c (tanh(z / c) · c) or None. z: (..., V), float32 (or promoted)."""
    if bias is not None:
        z = z + bias
    if cap:
        z = torch.tanh(z / cap) * cap
    return torch.log_softmax(z, dim=-1)


def chain(z: torch.Tensor, y: torch.Tensor, exact: bool, bias: torch.Tensor | None = None,
          cap: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk's chain. z: (1 + k, n, V) — P_all's logits, then k variants' logits (``exact``) or their
    differences z_k − z_all (below float32, in the projection's dtype); y: (n, 1) long, the sampled tokens.

    Returns (log p(y_t) (n,), d (k, n) = JS(p_t, q_kt), log q_k(y_t) (k, n)), float32."""
    z_all = z[0].float()  # (n, V)
    lp = logprobs(z_all, bias, cap)
    lp_y = lp.gather(1, y)[:, 0]
    k = z.shape[0] - 1
    z_k = z[1:].float() if exact else z[1:] + z_all  # (k, n, V)
    lq = logprobs(z_k, bias, cap)
    d = js_distance(lp, lq, p=lp.exp())
    lq_y = lq.gather(2, y.expand(k, -1, -1))[..., 0]
    return lp_y, d, lq_y


_compiled: Step | None = None
_state = {"warm": False, "broken": False}


def use_fused(mode: str, device: torch.device, logits: int) -> bool:
    """Whether a replay with ``logits`` (rows × vocabulary) logits on ``device`` runs the compiled chain:
    ``"on"`` always (while compiling works here), ``"off"`` never, ``"auto"`` on a CPU once it is compiled in this
    process or when the replay is large enough to pay for compiling it (:data:`FUSE_MIN_LOGITS`)."""
    if mode not in FUSED:
        raise MrtpoError(f"fused must be one of {', '.join(FUSED)}, not {mode!r}")
    if mode == "off" or _state["broken"]:
        return False
    if mode == "on":
        return True
    return device.type == "cpu" and (_state["warm"] or logits >= FUSE_MIN_LOGITS)


def fused_chain(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`chain`, compiled (dynamic shapes: one compilation serves every n, k and V). Where compiling fails
    (no C++ compiler, an unsupported device), one warning says so and this process runs the eager chain from
    then on: the same numbers, the eager speed."""
    global _compiled
    if not _state["broken"]:
        try:
            if _compiled is None:
                _compiled = torch.compile(chain, dynamic=True)
            out = _compiled(*args, **kwargs)
            _state["warm"] = True
            return out
        except Exception as e:  # noqa: BLE001 - any compiler failure: the eager chain gives the same numbers
            _state["broken"] = True
            warnings.warn(f"the replay's vocabulary chain could not be compiled ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}); it runs eagerly", RuntimeWarning,
                          stacklevel=2)
    return chain(*args, **kwargs)
