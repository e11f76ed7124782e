"""TRL's configurations of MRTPO: :class:`MRTPOConfig` (the credit fields of :class:`mrtpo.core.credit.CreditConfig`,
the template, the replay's and the credit log's), and :class:`MRTPOGRPOConfig`, TRL's own ``GRPOConfig`` carrying
those fields (each ``mrtpo_<name>``), as TRL's trainers carry theirs: one config for TRL users. Both are generated
from the same field metadata (:func:`mrtpo.config.opt`), so every default, help text and check is the one the CLI,
the app and the trainer use.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mrtpo.config import field_kind, from_flat, leaf_fields, opt, part
from mrtpo.core.credit import CreditConfig
from mrtpo.creditlog.writer_rows import GROUPS, GROUPS_HELP, LOG_HELP
from mrtpo.errors import MrtpoError
from mrtpo.replay import ReplayConfig
from mrtpo.templates import Template

try:
    from trl import GRPOConfig
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "mrtpo.integrations.trl needs TRL: pip install 'trl==1.16.0' (the optional extra 'trl')"
    ) from e


@dataclass
class MRTPOConfig(CreditConfig):
    """How the trainer computes advantages (METHOD.md): the credit fields of :class:`mrtpo.core.credit.CreditConfig`
    (``method``, ``beta``, ``warmup``, ``cap``, ``measure``, ``info``: the same names, defaults and checks as
    everywhere), plus the verifier-information ``template``, the replay's budgets and precision (``replay``: a
    :class:`mrtpo.replay.ReplayConfig`; its entropy temperature is TRL's) and the credit log (``credit_log``: a
    folder; ``credit_log_groups``: groups per step; :mod:`mrtpo.creditlog.trl_writer`)."""

    template: Template | dict | None = opt(None, "verifier-information template {prompt, item, separator} for P_all "
                                                "and P_\\k (default: mrtpo.templates.Template())")
    replay: ReplayConfig = part(ReplayConfig, omit=("temperature",))
    credit_log: str | None = opt(None, LOG_HELP)
    credit_log_groups: int = opt(GROUPS, GROUPS_HELP, lo=1, hi=4096)
    credit_log_logprobs: bool = opt(True, "log each token's log-prob and entropy from TRL's own loss forward (a "
                                          "step is written once its loss has run; False: at once, with only the "
                                          "log-probs TRL computed)")
    tuned: str | None = opt(None, "a choice file written by `mrtpo tune`: the template, each reward function's "
                                  "wording and measure (by its name, else the choice's default; instead of template "
                                  "and measure)")

    def __post_init__(self):
        super().__post_init__()  # MrtpoError for an unknown method or measure, β outside [0, 1], ...
        if not isinstance(self.template, Template):
            self.template = Template.from_dict(self.template)
        self.choice = None if self.tuned is None else trl_choice(self)


def trl_choice(cfg: MRTPOConfig):
    """The choice file of ``cfg.tuned``, validated; MrtpoError when ``template`` or ``measure`` is set beside it, or
    when a wording reads what a checker found (TRL's reward functions return numbers: their texts are the rule)."""
    from mrtpo.core.credit import MEASURE
    from mrtpo.tune import load_choice
    from mrtpo.tune.apply import reads_findings

    clash = [f for f, v in (("template", cfg.template != Template()), ("measure", cfg.measure != MEASURE)) if v]
    if clash:
        raise MrtpoError(f"tuned={cfg.tuned!r} gives the template and each reward's measure: leave "
                         f"{', '.join(clash)} out")
    choice = load_choice(cfg.tuned)
    found = sorted({e.wording for e in (choice.default, *choice.kinds.values(), *choice.rewards.values())
                    if reads_findings(e.text)})
    if found:
        raise MrtpoError(f"{choice.source}: wording '{found[0]}' reads {{findings}}, what a task family's checker "
                         "found in the reply; verifier_info_fn gives the rule: tune without that wording")
    return choice


#: MRTPOGRPOConfig's name of an MRTPOConfig field: this prefix + its name (``beta`` is GRPOConfig's KL coefficient)
PREFIX = "mrtpo_"
_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "list": list}  # any other: a dict (the template's)


def _grpo_fields() -> list[tuple[str, type, dataclasses.Field]]:
    """Every MRTPOConfig field (its parts' too), as a field of TRL's GRPOConfig: ``mrtpo_<name>``, the same default,
    its help text (what TRL's argument parser reads)."""
    out = []
    for f, _ in leaf_fields(MRTPOConfig):
        kind = _TYPES.get(field_kind(f), dict)
        default = None if f.name == "template" else f.default
        out.append((PREFIX + f.name, kind | None if "None" in str(f.type) else kind,
                    dataclasses.field(default=default, metadata={"help": "MRTPO: " + f.metadata["help"]})))
    return out


def _mrtpo_config(self) -> MRTPOConfig:
    """The :class:`MRTPOConfig` these ``mrtpo_*`` fields make (MrtpoError naming a bad value)."""
    values = {f.name: getattr(self, PREFIX + f.name) for f, _ in leaf_fields(MRTPOConfig)}
    return from_flat(MRTPOConfig, values, "MRTPO config")


def _post_init(self) -> None:
    GRPOConfig.__post_init__(self)
    try:  # checked with the rest of the arguments
        self.mrtpo_config()
    except MrtpoError as e:
        raise MrtpoError(f"MRTPOGRPOConfig's mrtpo_* fields: {e}") from None


_DOC = ("TRL's ``GRPOConfig`` with MRTPO's fields, each :class:`MRTPOConfig` field as ``mrtpo_<name>`` "
        "(``mrtpo_method``, ``mrtpo_beta``, ``mrtpo_measure``, ``mrtpo_token_budget``, ``mrtpo_credit_log``, ...): "
        "one config for :class:`mrtpo.integrations.trl.MRTPOGRPOTrainer`. :meth:`mrtpo_config` gives the "
        ":class:`MRTPOConfig` they make.")
MRTPOGRPOConfig = dataclasses.make_dataclass(
    "MRTPOGRPOConfig", _grpo_fields(), bases=(GRPOConfig,),
    namespace={"__post_init__": _post_init, "mrtpo_config": _mrtpo_config, "__module__": __name__, "__doc__": _DOC})
