"""Composing one invocation's config, deciding its strategy, and typing it into a `Job`.

`Session` wraps a composed config with a way to compose its siblings (a fallback strategy with
the same overrides); it needs an initialized Hydra (`initialize_config_module`) when it
composes. Every mistake surfaces as a `ConfigError` before a `Job` exists, so no rank ever
starts on a config that cannot run.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf, open_dict

from pipeline.config.build import built
from pipeline.config.checked import built_groups, job_of, typed_job, unknown_keys
from pipeline.config.costs import AUTO, Ranking, device_links, ranking
from pipeline.config.eligibility import Verdict
from pipeline.config.job import Job, pool_problems
from pipeline.config.recall import composition
from pipeline.config.schema import GROUP_SCHEMAS, Config
from pipeline.core.checks import ConfigError, Problem, raise_problems
from pipeline.core.model import ModelGeometry
from pipeline.core.topology import Topology

log = logging.getLogger("hicache-pipeline.config")
ALL_GROUPS = frozenset(GROUP_SCHEMAS)
"""What `validate` checks: every group (a command checks only those it reads)."""
JOB_GROUPS = frozenset(
    {"model", "topology", "strategy", "workload", "runtime", "storage", "events"}
)
"""What every command that composes a job reads; bench, simulate and soak add their own."""
READS = {
    **dict.fromkeys(("run", "plan", "explain", "check-ordering"), JOB_GROUPS),
    **{driver: JOB_GROUPS | {driver} for driver in ("bench", "simulate", "soak")},
    **dict.fromkeys(("validate", "list"), ALL_GROUPS),
}
"""The config groups each subcommand checks."""
GROUP_CHOICE_PREFIXES = ("strategy=", "+strategy=", "++strategy=")
HYDRA_SAYS = (
    (
        r"Could not append to config\. An item is already at '([^']+)'",
        "+{0}: {0} is set already: drop the '+' ({0}=...)",
    ),
    (r"Could not delete from config\. .*?'([^']+)'", "~{0}: no such key to delete"),
    (r"Key '[^']+' not in '\w+'.*?full_key: (\S+)", "{0}: no such key (`--cfg job` shows them)"),
)
"""Hydra's words for the override mistakes that only it finds -> ours (the rest are checked
before Hydra sees them, see `overrides`)."""


def register_schemas() -> None:
    """Store `base_config` and one `base_<group>` per group (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    for group, schema in GROUP_SCHEMAS.items():
        cs.store(group=group, name=f"base_{group}", node=schema)


def message_of(e: BaseException) -> str:
    """An exception and its causes on one line (Hydra wraps the useful part)."""
    parts: list[str] = []
    cause: BaseException | None = e
    while cause is not None:
        text = " ".join(str(cause).split())
        if text and text not in parts:
            parts.append(text)
        cause = cause.__cause__
    return ": ".join(parts)


def hydra_problem(e: BaseException) -> Problem:
    """A composition error in the project's words (Hydra's own go to the debug log, which
    `--verbose` shows)."""
    said = message_of(e)
    log.debug("Hydra said: %s", said)
    for pattern, ours in HYDRA_SAYS:
        if found := re.search(pattern, said):
            key = found.group(1)
            return Problem(key, ours.format(key), "overrides")
    message = (
        "the overrides do not compose: check each key with `hicache-pipeline list` and "
        "`--cfg job` (--verbose shows Hydra's own message)"
    )
    return Problem("", message, "overrides")


def composed(overrides: list[str], *, hydra_node: bool = False) -> DictConfig:
    """`config` with overrides; a composition error becomes a ConfigError."""
    try:
        return composition(overrides, hydra_node=hydra_node)
    except ConfigError:
        raise
    except Exception as e:  # Hydra's composition errors: missing options, bad values
        raise ConfigError([hydra_problem(e)]) from None


def typed(node: DictConfig, key: str) -> Any:
    """The schema object of a composed group; ConfigError with every problem of it."""
    result = built(node, GROUP_SCHEMAS[key], key)
    raise_problems(list(result.problems))
    return result.obj


@dataclass(frozen=True)
class Session:
    """One invocation: its composed config, the overrides that made it, its strategy option."""

    cfg: DictConfig
    overrides: tuple[str, ...]
    choices: Mapping[str, str]
    """The option chosen for each config group."""
    siblings: dict[str, DictConfig] = field(default_factory=dict, compare=False, repr=False)
    """Each other strategy option's config, composed once (a verdict and its Job both read a
    fallback's); read only."""
    pick: Ranking | None = field(default=None, compare=False, repr=False)
    """With strategy=auto: the estimates that chose this session's strategy."""
    links_note: str | None = None
    """Why the cost model prices with the device's links instead of runtime.links' default."""

    @classmethod
    def compose(cls, overrides: list[str]) -> Session:
        """Compose `config` with overrides (Hydra must be initialized)."""
        cfg = composed(overrides, hydra_node=True)
        choices = {g: str(cfg.hydra.runtime.choices[g]) for g in GROUP_SCHEMAS}
        with open_dict(cfg):
            del cfg["hydra"]
        note = None
        if found := device_links(cfg, {o.lstrip("+~").partition("=")[0] for o in overrides}):
            preset, note = found  # every sibling and every bench case composes it too
            cfg.runtime.links = preset
            overrides = [*overrides, f"runtime.links={preset}"]
        session = cls(cfg, tuple(overrides), MappingProxyType(choices), links_note=note)
        return session.picked() if choices["strategy"] == AUTO else session

    def picked(self) -> Session:
        """strategy=auto: the same overrides with the winner's option. Where no estimate can
        be made (a group it reads has a mistake), auto's own file (replicated's stages) stays,
        and `job` reports the mistake."""
        try:
            pick = ranking(self.cfg, self.with_strategy)
        except ConfigError:
            return self
        winner = pick.winner.option
        kept = [o for o in self.overrides if not o.startswith(GROUP_CHOICE_PREFIXES)]
        overrides = (*kept, f"strategy={winner}")
        choices = MappingProxyType({**self.choices, "strategy": winner})
        siblings = dict(self.siblings)
        return Session(siblings.pop(winner), overrides, choices, siblings, pick, self.links_note)

    @property
    def auto_note(self) -> str | None:
        """What strategy=auto picked and why (None without auto)."""
        if self.pick is None:
            return None
        return f"strategy=auto picked {self.pick.winner.option}: {self.pick.reason()}"

    @property
    def strategy_option(self) -> str:
        return self.choices["strategy"]

    def runs(self) -> tuple[str | None, DictConfig]:
        """(a note when strategy=auto picked it or the requested strategy falls back, the
        config that runs)."""
        verdict = self.verdict()
        if verdict.active:
            return self.auto_note, self.cfg
        note = f"strategy {verdict.strategy} is inactive here: {verdict.effective_strategy} runs"
        return note, self.with_strategy(verdict.effective_strategy)

    def as_yaml(self) -> str:
        """The config that runs, as YAML (`--cfg job`): the effective strategy's where the
        requested one falls back, with a comment saying so."""
        note, cfg = self.runs()
        return (f"# {note}\n" if note else "") + OmegaConf.to_yaml(cfg)

    def as_plain(self) -> dict[str, Any]:
        """The config that runs as plain data (`--cfg job --json`), and the note if any."""
        note, cfg = self.runs()
        return {"note": note, "config": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)}

    def with_strategy(self, option: str) -> DictConfig:
        """The same config with another strategy option (keeping strategy.* knob overrides)."""
        if option not in self.siblings:
            kept = [o for o in self.overrides if not o.startswith(GROUP_CHOICE_PREFIXES)]
            self.siblings[option] = composed([*kept, f"strategy={option}"])
        return self.siblings[option]

    def model(self) -> ModelGeometry:
        return typed(self.cfg.model, "model")

    def topology(self) -> Topology:
        """The topology as given (normalizations are applied by `verdict` and `job`)."""
        return typed(self.cfg.topology, "topology")

    def verdict(self) -> Verdict:
        """Is the requested strategy active, and what runs instead (ConfigError first for keys
        that no schema declares)."""
        raise_problems(unknown_keys(self.cfg))
        _, problems, verdict = self.checked
        raise_problems(problems if verdict is None else [])
        assert verdict is not None, "no verdict without a problem"
        return verdict

    @functools.cached_property
    def checked(self) -> tuple[Job | None, list[Problem], Verdict | None]:
        """(Job, every problem, verdict) of this config: computed once per session."""
        notes = tuple(n for n in (self.links_note, self.auto_note) if n is not None)
        return job_of(self.cfg, self.strategy_option, self.with_strategy, notes)

    def problems(self, reads: frozenset[str] = ALL_GROUPS) -> list[Problem]:
        """Every problem of the groups a command reads (another group's, such as the bench's
        sizes in whole pages, is no reason to refuse a command that never reads it)."""
        return self.checked_for(reads)[1]

    def job(self, reads: frozenset[str] = ALL_GROUPS) -> Job:
        """What runs, typed once and checked whole (the groups `reads` names): the effective
        strategy's stages on the normalized topology (ConfigError listing every problem
        otherwise)."""
        job, problems = self.checked_for(reads)
        raise_problems(problems)
        assert job is not None, "no job without a problem"
        return job

    def checked_for(self, reads: frozenset[str]) -> tuple[Job | None, list[Problem]]:
        """(Job, problems) with only the problems of the groups in `reads`."""
        job, problems, verdict = self.checked
        own = [p for p in problems if read_by(p, reads)]
        if job is not None or own or verdict is None:
            return job, own
        # every problem was another group's: the Job they held back, and the rules that
        # waited for it (the pools are checked only once the sizes are whole pages)
        strategy = self.cfg if verdict.active else self.with_strategy(verdict.effective_strategy)
        groups = {**built_groups(self.cfg), **built_groups(strategy, ("strategy",))}
        if any(b.obj is None for b in groups.values()):
            return None, problems
        job = typed_job(groups, verdict, bool(self.cfg.strict))
        own = pool_problems(job)
        return (None if own else job), own


def read_by(problem: Problem, reads: frozenset[str]) -> bool:
    """Whether a problem is of a group in `reads` (or of no group: a file, the command line,
    `strict`)."""
    group = problem.key.partition(".")[0].split("[")[0]
    return group in reads or group not in ALL_GROUPS
