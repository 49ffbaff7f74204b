"""`validate`: compose every option of every group (or one config) and report every error.

Checks, without constructing a stage or touching a device: schema (types, enums, unknown keys,
missing required fields), range and cross-field rules (every schema's `__post_init__`),
`_target_`s that name stages for their list with arguments that bind (`assemble.checked_entry`),
known eligibility rule names, and fallbacks that name an existing strategy option.
"""

from __future__ import annotations

from collections.abc import Callable

from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from pipeline.config.assemble import stage_errors
from pipeline.config.compose import unknown_keys
from pipeline.config.eligibility import RULES
from pipeline.config.schema import GROUP_SCHEMAS

Composer = Callable[[list[str]], DictConfig]
DIRECTIONS = ("backup", "load")


def group_options() -> dict[str, list[str]]:
    """Every option of every schema'd group on the search path (shipped and --config-dir)."""
    loader = GlobalHydra.instance().config_loader()
    return {
        group: [o for o in loader.get_group_options(group) if not o.startswith("base_")]
        for group in GROUP_SCHEMAS
    }


def option_file(group: str, option: str) -> str:
    """Where an option lives, as a path a user can open."""
    loader = GlobalHydra.instance().config_loader()
    result = loader.repository.load_config(f"{group}/{option}")  # type: ignore[attr-defined]
    if result is None:
        return f"{group}/{option}"
    base = result.path.removeprefix("pkg://").removeprefix("file://")
    return f"{base}/{group}/{option}.yaml"


def check_config(cfg: DictConfig, where: str, strategies: list[str]) -> list[str]:
    """Every problem of one composed config, each prefixed with `where` and the key."""
    errors = [f"{where}: {e}" for e in unknown_keys(cfg)]
    for group in GROUP_SCHEMAS:
        try:
            OmegaConf.to_object(cfg[group])
        except Exception as e:  # schema and __post_init__ errors alike
            errors.append(f"{where}: {group}: {_message(e)}")
    if "strategy" not in cfg:
        return errors
    try:
        directions = {d: OmegaConf.to_container(cfg.strategy[d], resolve=True) for d in DIRECTIONS}
    except Exception as e:  # an interpolation that does not resolve
        return [*errors, f"{where}: strategy: {_message(e)}"]
    errors += stage_errors(directions, where)  # type: ignore[arg-type]
    unknown = [r for r in cfg.strategy.requires if r not in RULES]
    if unknown:
        errors.append(
            f"{where}: strategy.requires: unknown rules {unknown}; known rules: {sorted(RULES)}"
        )
    fallback = cfg.strategy.fallback
    if fallback is not None and fallback not in strategies:
        errors.append(
            f"{where}: strategy.fallback: {fallback!r} is not a strategy option "
            f"({', '.join(strategies)})"
        )
    return errors


def validate_all(compose: Composer) -> tuple[list[str], list[str]]:
    """(checked option files, errors) over every option of every group."""
    options = group_options()
    checked, errors = [], []
    for group, names in options.items():
        for option in names:
            where = option_file(group, option)
            checked.append(where)
            try:
                cfg = compose([f"{group}={option}"])
            except Exception as e:
                errors.append(f"{where}: {_message(e)}")
                continue
            errors += check_config(cfg, where, options["strategy"])
    return checked, errors


def _message(e: BaseException) -> str:
    """An exception and its causes on one line (Hydra wraps the useful part)."""
    parts = []
    while e is not None:
        text = str(e).strip().replace("\n", " ")
        if text and text not in parts:
            parts.append(text)
        e = e.__cause__  # type: ignore[assignment]
    return ": ".join(parts)
