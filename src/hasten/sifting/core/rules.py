"""The one registry of sifting rules: name -> config class -> pure policy, and who runs it.

A *rule* is what decides which samples to train on. It has a name (what a dict config selects
with its ``"policy"`` key), a frozen config dataclass, a pure policy built from a config
(``(losses, history, generator) -> Selection``, see :mod:`hasten.sifting.policy`), the law the
policy follows (each sample's keep probability, which the contract test checks the policy
against) and the front-ends that run it:

- ``"loader"``: :class:`~hasten.sifting.SiftingDataloader`, a stream of batches, each scored
  with a forward of the model just before it is trained on (``history`` = the last
  ``loss_history_length`` losses). Its rules keep samples without weights (a refilled batch
  reaches the user's loss as an ordinary batch) and know their keep rate a priori, which
  ``len()`` needs.
- ``"sampler"``: :class:`~hasten.sifting.PruningSampler`, once per epoch over the whole dataset,
  from the losses the training step fed back (``losses`` = every sample's stored loss,
  ``history`` = the finite ones). Its rules may weight the kept samples:
  ``PruningSampler.update`` applies the weights to the loss it returns.

The registry is the bottom layer of sifting: it imports nothing of sifting but the field
validators and the exceptions (``tests/unit/sifting/test_layering.py`` checks it). Each config
module registers its own rules when it is imported, with the policy and the keep law from the
policy modules beneath it: :mod:`hasten.sifting.config` the loader's, :mod:`hasten.sifting.
pruning_config` the sampler's (importing :mod:`hasten.sifting` imports both).

Built-in rules (name, config, front-end, keep law):

- ``relative_probabilistic``: :class:`~hasten.sifting.config.RelativeProbabilisticSiftConfig`,
  loader; keep with probability ``p ** beta_value``, ``p`` the loss's percentile in the history
  (SageMaker's rule; about ``1 / (1 + beta)`` kept);
- ``stale_relative``: :class:`~hasten.sifting.pruning_config.StaleRelativePruningConfig`,
  sampler; the same law on the stored losses;
- ``unbiased``: :class:`~hasten.sifting.pruning_config.UnbiasedPruningConfig`, sampler; a loss
  below the threshold is kept with probability ``1 - prune_ratio`` and then weighted
  ``1 / (1 - prune_ratio)``, every other sample is kept (InfoBatch's rule).

The unbiased rule is sampler-only: its point is to need no extra forward (the sampler reads
losses the training step computed anyway) and its weights must reach the training loss, which
the sampler's ``update`` does and a stream of plain batches cannot. A config given to a front-end
that does not run its rule raises, naming the front-end (or the config) to use.

Registering a rule makes it selectable by name in both front-ends it claims, and puts it through
the contract test (``tests/unit/sifting/test_rule_contract.py``) automatically::

    register_rule(
        "mine", MyConfig, lambda cfg: functools.partial(my_select, k=cfg.k),
        frontends={"loader"}, keep_probability=my_keep_probability,
        nominal_keep_rate=lambda cfg: cfg.expected_keep_rate,
    )

What each front-end reads from a config besides the rule: the loader ``loss_history_length``,
``sift_delay`` and ``repeat_delay_per_epoch``; the sampler ``anneal_fraction`` and, if present,
``max_loss_age``.
"""

from __future__ import annotations

import dataclasses
import types
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor

from hasten.sifting.core.fields import from_mapping
from hasten.sifting.exceptions import SiftConfigValidationException

if TYPE_CHECKING:  # a type only: the policies sit above the registry
    from hasten.sifting.policy import SiftPolicy

__all__ = [
    "FRONTENDS",
    "LOADER",
    "RULES",
    "SAMPLER",
    "Rule",
    "coerce_config",
    "configs_for",
    "policy_for",
    "register_rule",
    "rule_of",
    "rules_for",
]

LOADER = "loader"
"""Front-end name of :class:`~hasten.sifting.SiftingDataloader`."""
SAMPLER = "sampler"
"""Front-end name of :class:`~hasten.sifting.PruningSampler`."""
FRONTENDS = (LOADER, SAMPLER)

_FRONTEND_CLASS = {LOADER: "SiftingDataloader", SAMPLER: "PruningSampler"}
_DEFAULT_RULE = {LOADER: "relative_probabilistic", SAMPLER: None}

KeepProbability = Callable[[Any, Tensor, Tensor], Tensor]
"""``(config, losses, history) -> probability of keeping each sample`` (the rule's law)."""


@dataclass(frozen=True)
class Rule:
    """One registered sifting rule (see the module docstring)."""

    name: str
    """What a dict config selects with ``{"policy": name, ...}``."""
    config: type
    """The config class; its instances select this rule."""
    policy: Callable[[Any], SiftPolicy]
    """``policy(config)``: the pure selection function for that config."""
    frontends: frozenset[str]
    """The front-ends that run it: a subset of :data:`FRONTENDS`."""
    keep_probability: KeepProbability | None = None
    """The law the policy follows: each sample's probability of being kept, given the
    ``losses`` and ``history`` the policy gets (checked by the contract test)."""
    nominal_keep_rate: Callable[[Any], float] | None = None
    """The keep rate known before any loss is seen (loader rules: ``len()`` is planned by it);
    ``None`` when it depends on the losses."""
    elsewhere: str = ""
    """What to use instead, for the front-ends that do not run it (part of the error)."""
    example: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Constructor keywords of a typical config that sifts from the first batch: the contract
    test runs the rule with it (``config(**example)``; the built-in sampler rules' examples set
    ``guard=None``, since the test checks the rule's own keep-rate law)."""

    def make_example(self) -> Any:
        """A config built from :attr:`example`."""
        return self.config(**self.example)

    def runs_in(self, frontend: str) -> bool:
        """Whether ``frontend`` runs this rule."""
        return frontend in self.frontends


_RULES: dict[str, Rule] = {}
RULES: Mapping[str, Rule] = types.MappingProxyType(_RULES)
"""Every registered rule by name (read-only; add with :func:`register_rule`)."""


def register_rule(
    name: str,
    config: type,
    policy: Callable[[Any], SiftPolicy],
    *,
    frontends: Collection[str],
    keep_probability: KeepProbability | None = None,
    nominal_keep_rate: Callable[[Any], float] | None = None,
    elsewhere: str = "",
    example: Mapping[str, Any] | None = None,
) -> Rule:
    """Register a rule (see the module docstring); returns it.

    Raises:
        ValueError: the name or the config class is taken by another rule, an unknown front-end,
            or a loader rule without ``nominal_keep_rate``.
    """
    fronts = frozenset(frontends)
    unknown = sorted(fronts - set(FRONTENDS))
    if not fronts or unknown:
        raise ValueError(f"frontends must be a non-empty subset of {FRONTENDS}, got {unknown}")
    if LOADER in fronts and nominal_keep_rate is None:
        raise ValueError(
            f"rule {name!r} runs in the loader, whose len() is planned by the keep rate: pass "
            "nominal_keep_rate=lambda cfg: <expected fraction kept>"
        )
    if not dataclasses.is_dataclass(config):
        raise ValueError(f"a rule's config must be a dataclass, got {config!r}")
    rule = Rule(
        name,
        config,
        policy,
        fronts,
        keep_probability,
        nominal_keep_rate,
        elsewhere,
        dict(example or {}),
    )
    old = _RULES.get(name)
    if old is not None and old.config is not config:
        raise ValueError(f"a sifting rule named {name!r} is already registered")
    for other in _RULES.values():
        if other.config is config and other.name != name:
            raise ValueError(f"{config.__name__} already selects the rule {other.name!r}")
    _RULES[name] = rule
    return rule


def rule_of(config: Any) -> Rule:
    """The rule a config object selects (by its class, base classes included).

    Raises:
        SiftConfigValidationException: no rule is registered for the config's class.
    """
    for cls in type(config).__mro__:
        for rule in _RULES.values():
            if rule.config is cls:
                return rule
    raise SiftConfigValidationException(
        f"no sifting rule is registered for {type(config).__name__}; register one with "
        "hasten.sifting.core.rules.register_rule(name, ConfigClass, policy, frontends=...)"
    )


def rules_for(frontend: str) -> list[Rule]:
    """The rules ``frontend`` runs, in registration order."""
    return [r for r in _RULES.values() if frontend in r.frontends]


def policy_for(config: Any) -> SiftPolicy:
    """The pure policy function of a config object (see :func:`rule_of` for the errors)."""
    return rule_of(config).policy(config)


def coerce_config(config: Any, frontend: str, *, what: str = "config") -> Any:
    """``config`` as a config object that ``frontend`` runs; dicts are converted.

    A dict picks its rule with its ``"policy"`` key (the loader's default:
    ``"relative_probabilistic"``, SageMaker's rule; the sampler has none).

    Raises:
        SiftConfigValidationException: a dict with an unknown ``"policy"``, unknown or missing
            keys, bad values; an object that is not a registered config; or a rule that
            ``frontend`` does not run (the message names what to use instead).
    """
    if frontend not in FRONTENDS:
        raise ValueError(f"frontend must be one of {FRONTENDS}, got {frontend!r}")
    names = sorted(r.name for r in rules_for(frontend))
    if isinstance(config, Mapping):
        data = dict(config)
        default = _DEFAULT_RULE[frontend]
        name = data.pop("policy", default)
        if name not in _RULES:
            if name is None:
                raise SiftConfigValidationException(
                    f"a {what} dict for {_FRONTEND_CLASS[frontend]} needs 'policy' set to one "
                    f"of {names}"
                )
            raise SiftConfigValidationException(
                f"unknown sifting policy {name!r} in the {what}; registered for "
                f"{_FRONTEND_CLASS[frontend]}: {', '.join(names)}"
            )
        rule = _RULES[name]
        _check_runs(rule, frontend)
        return from_mapping(rule.config, data, what)
    if config is None:
        examples = {
            LOADER: "RelativeProbabilisticSiftConfig(beta_value=1.0, loss_history_length=500)",
            SAMPLER: "UnbiasedPruningConfig() or StaleRelativePruningConfig()",
        }
        raise SiftConfigValidationException(
            f"{what} is required: pass {examples[frontend]} or the equivalent dict"
        )
    rule = _rule_or_none(config)
    if rule is None:
        classes = ", ".join(r.config.__name__ for r in rules_for(frontend))
        raise SiftConfigValidationException(
            f"{what} must be a sifting config object ({classes}) or a dict with a 'policy' key "
            f"({', '.join(names)}), got {type(config).__name__}"
        )
    _check_runs(rule, frontend)
    return config


def configs_for(frontend: str) -> Mapping[str, type]:
    """A live, read-only view ``name -> config class`` of the rules ``frontend`` runs."""
    return _ConfigView(frontend)


class _ConfigView(Mapping[str, type]):
    def __init__(self, frontend: str) -> None:
        self._frontend = frontend

    def __getitem__(self, name: str) -> type:
        rule = _RULES[name]
        if self._frontend not in rule.frontends:
            raise KeyError(name)
        return rule.config

    def __iter__(self) -> Iterator[str]:
        return iter([r.name for r in rules_for(self._frontend)])

    def __len__(self) -> int:
        return len(rules_for(self._frontend))

    def __repr__(self) -> str:
        return repr(dict(self))


def _rule_or_none(config: Any) -> Rule | None:
    try:
        return rule_of(config)
    except SiftConfigValidationException:
        return None


def _check_runs(rule: Rule, frontend: str) -> None:
    if frontend in rule.frontends:
        return
    others = " or ".join(_FRONTEND_CLASS[f] for f in sorted(rule.frontends))
    hint = f" {rule.elsewhere}" if rule.elsewhere else ""
    raise SiftConfigValidationException(
        f"{_FRONTEND_CLASS[frontend]} does not run the {rule.name!r} rule "
        f"({rule.config.__name__}): it runs in {others}.{hint}"
    )


# --------------------------------------------------------------------------- deprecated halves
# The former two-step registration (a name for a class, then a policy for the class), kept so
# that code written against it still works. Either half may come first.

_PENDING_NAMES: dict[type, tuple[str, frozenset[str]]] = {}
_PENDING_POLICIES: dict[type, Callable[[Any], SiftPolicy]] = {}


def _register_half(
    config: type,
    *,
    name: str | None = None,
    frontend: str | None = None,
    policy: Callable[[Any], SiftPolicy] | None = None,
) -> None:
    warnings.warn(
        "register_sift_config / register_pruning_config / register_policy are deprecated: "
        "register a rule in one call with hasten.sifting.core.rules.register_rule(name, "
        "ConfigClass, policy, frontends=...)",
        DeprecationWarning,
        stacklevel=3,
    )
    for rule in list(_RULES.values()):
        if rule.config is config:  # complete already: replace the half given
            fronts = rule.frontends | ({frontend} if frontend else set())
            _RULES[rule.name] = dataclasses.replace(
                rule, policy=policy or rule.policy, frontends=frozenset(fronts)
            )
            return
    if name is not None:
        assert frontend is not None
        _PENDING_NAMES[config] = (name, frozenset({frontend}))
    if policy is not None:
        _PENDING_POLICIES[config] = policy
    if config in _PENDING_NAMES and config in _PENDING_POLICIES:
        name, fronts = _PENDING_NAMES.pop(config)
        _RULES[name] = Rule(
            name,
            config,
            _PENDING_POLICIES.pop(config),
            fronts,
            # as before the registry: the config's expected_keep_rate, else 1 (no sifting)
            nominal_keep_rate=lambda cfg: float(getattr(cfg, "expected_keep_rate", 1.0)),
        )
