"""`validate`: every option of every group (shipped and a user's folder), or the one config the
overrides compose; every problem with its file, key and line.

A user folder is read by the hardened reader first (`untrusted`), so syntax errors, refused
YAML and schema mistakes of every file are listed together; each option is then composed with
the keys those name left out, so its range and cross-group rules are reported in the same run.
Nothing beyond the typed config is built: no stage runs, no device is touched.
"""

from __future__ import annotations

from pipeline.config.compose import Session, strategy_stage_problems, typed_groups, unknown_keys
from pipeline.config.eligibility import RULES
from pipeline.config.sources import ConfigSources
from pipeline.config.untrusted import override_problems
from pipeline.spec.checks import ConfigError, Problem


def config_problems(session: Session, strategies: set[str]) -> list[Problem]:
    """Every problem of one composed config, each naming its key (no file yet)."""
    cfg = session.cfg
    found = unknown_keys(cfg)
    try:
        typed_groups(cfg)
    except ConfigError as e:
        found += e.problems
    # the requested strategy's own stages, active or not (job() checks the effective one's)
    found += strategy_stage_problems(cfg)
    unknown = [r for r in cfg.strategy.requires if r not in RULES]
    if unknown:
        found.append(
            Problem(
                "strategy.requires",
                f"strategy.requires: unknown rules {unknown}; known rules: {sorted(RULES)}",
            )
        )
    fallback = cfg.strategy.fallback
    if fallback is not None and fallback not in strategies:
        known = ", ".join(sorted(strategies))
        found.append(
            Problem("strategy.fallback", f"strategy.fallback: {fallback!r} is not one of {known}")
        )
    if found:
        return found
    try:
        session.job()  # the effective strategy, and the rules that join groups
    except ConfigError as e:
        found += e.problems
    except ValueError as e:  # a fallback chain that ends nowhere
        found.append(Problem("strategy.fallback", str(e)))
    return found


def placed(problem: Problem, file: str, lines: dict[str, int], group: str | None) -> Problem:
    """`problem` in `file`, at the line of its key where the key belongs to the file's group."""
    if problem.file is not None:
        return problem
    head, _, rest = problem.key.partition(".")
    line = lines.get(rest) if head.split("[")[0] == group else None
    return problem.at(file, line)


def in_order(problems: list[Problem]) -> list[Problem]:
    """Each problem once, by file and line."""
    unique = dict.fromkeys(problems)
    return sorted(unique, key=lambda p: (p.file or "", p.line or 0))


def validate_all(sources: ConfigSources) -> tuple[list[str], list[Problem]]:
    """(checked files, problems) over every option of every group."""
    options = sources.options()
    strategies = {name for group, name, _ in options if group == "strategy"}
    checked = [path for _, _, path in options]
    found = list(sources.problems)
    checked += sorted({p.file for p in found if p.file and p.file not in checked})
    for group, option, path in options:
        try:
            session = Session.compose([f"{group}={option}"])
        except ConfigError as e:
            found += [p.at(path) for p in e.problems]
            continue
        lines = sources.file_of(group, option)[1]
        found += [placed(p, path, lines, group) for p in config_problems(session, strategies)]
    return checked, in_order(found)


def validate_one(overrides: list[str], sources: ConfigSources) -> list[Problem]:
    """The problems of the one config the overrides compose, each in the file it comes from."""
    found = [*sources.problems, *override_problems(overrides)]
    if found:
        return found
    try:
        session = Session.compose(overrides)
    except ConfigError as e:
        return e.problems
    strategies = {name for group, name, _ in sources.options() if group == "strategy"}
    for problem in config_problems(session, strategies):
        group = problem.key.partition(".")[0].split("[")[0]
        if group in session.choices:
            path, lines = sources.file_of(group, session.choices[group])
            problem = placed(problem, path, lines, group)
        found.append(problem)
    return in_order(found)
