"""`validate`: every option of every group (shipped and a user's folder), or the one config the
overrides compose; every problem with its file, key and line.

A user folder is read by the hardened reader first (`untrusted`), so syntax errors, refused
YAML and schema mistakes of every file are listed together; each option is then composed with
the keys those name left out, so its range and cross-group rules are reported in the same run.
Nothing beyond the typed config is built: no stage runs, no device is touched.
"""

from __future__ import annotations

import dataclasses

from pipeline.config.advice import page_warnings
from pipeline.config.checked import strategy_stage_problems
from pipeline.config.compose import ALL_GROUPS, JOB_GROUPS, Session
from pipeline.config.deployment import Configs
from pipeline.config.overrides import checked_overrides
from pipeline.core.checks import ConfigError, Problem


def config_problems(
    session: Session, strategies: set[str], reads: frozenset[str] = ALL_GROUPS
) -> list[Problem]:
    """Every problem of one composed config in the groups `reads` names, each naming its key
    (no file yet)."""
    cfg = session.cfg
    # the requested strategy's own stages, active or not (the job checks the effective one's)
    found = strategy_stage_problems(cfg)
    fallback = cfg.strategy.fallback
    if fallback is not None and fallback not in strategies:
        known = ", ".join(sorted(strategies))
        found.append(
            Problem("strategy.fallback", f"strategy.fallback: {fallback!r} is not one of {known}")
        )
    problems = session.problems(reads)
    said = {p.key for p in found}
    return found + [p for p in problems if not (p.key == "strategy.fallback" in said)]


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


def consequences_dropped(said: list[Problem], more: list[Problem]) -> list[Problem]:
    """`more` without the problems of a key that `said` (a file's or an override's own
    problems) already names: a value left out for its mistake is then missing, or a default."""
    named = {(p.file, p.key) for p in said if p.key}
    return [p for p in more if (p.file, p.key) not in named]


def validate_all(loaded: Configs) -> tuple[list[str], list[Problem], list[Problem]]:
    """(checked files, problems, warnings): every option, each composed alone over the
    shipped defaults; with a user folder, its own options and deployment only (a shipped
    option composes the same with or without the folder: `validate` alone checks those)."""
    sources = loaded.sources
    options = sources.options()
    strategies = {name for group, name, _ in options if group == "strategy"}
    own = options if sources.folder is None else sources.own_options()
    checked = [path for _, _, path in own]
    found, warned = list(sources.problems), []
    for group, option, path in own:
        try:
            session = Session.compose([f"{group}={option}"])
        except ConfigError as e:
            found += [p.at(path) for p in e.problems]
            continue
        lines = sources.file_of(group, option)[1]
        more = [placed(p, path, lines, group) for p in config_problems(session, strategies)]
        found += consequences_dropped(found, more)
        if group == "model":
            warned += [placed(w, path, lines, group) for w in page_warnings(session)]
    if loaded.deployment is not None:
        checked.append(loaded.deployment.path)
        composed, problems = checked_config([], loaded)
        found += consequences_dropped(found, problems)
        warned += [] if composed is None else config_warnings(composed, loaded, set())
    checked += sorted({p.file for p in found if p.file and p.file not in checked})
    return checked, in_order(found), in_order(warned)


def group_options(loaded: Configs) -> dict[str, list[str]]:
    """Each group's options, shipped and the user's."""
    found: dict[str, list[str]] = {}
    for group, name, _ in loaded.sources.options():
        found.setdefault(group, []).append(name)
    return found


def checked_config(
    overrides: list[str], loaded: Configs, reads: frozenset[str] = ALL_GROUPS
) -> tuple[Session | None, list[Problem]]:
    """The session the overrides compose over the user's deployment (None if even their
    clean part cannot), and every problem of the config: the user folder's, the overrides',
    and the composed config's in the groups a command reads (`reads`), each in the file or
    override it comes from."""
    options = group_options(loaded)
    refused, kept = checked_overrides(overrides, options)
    found = [*loaded.sources.problems, *refused]
    try:
        session = Session.compose([*loaded.overrides, *kept])
    except ConfigError as e:
        return None, in_order(found + e.problems)
    set_here = {o.lstrip("+~").partition("=")[0] for o in kept} - set(options)
    more = [
        located(p, session, loaded, set_here)
        for p in config_problems(session, set(options.get("strategy", [])), reads)
    ]
    return session, in_order(found + consequences_dropped(found, more))


def located(problem: Problem, session: Session, loaded: Configs, set_here: set[str]) -> Problem:
    """A problem of a composed config in the override that set its key (`set_here`: the keys
    the overrides set), or the deployment's line that did, or else the file of its group's
    option."""
    group, key = problem.key.partition(".")[0].split("[")[0], problem.key.split("[")[0]
    if problem.file is not None:
        return problem
    if any(key == k or key.startswith(k + ".") for k in set_here):
        return problem.at("overrides")
    deployment = loaded.deployment
    if deployment is not None and key in deployment.lines:
        return problem.at(deployment.path, deployment.lines[key])
    if group in session.choices:
        path, lines = loaded.sources.file_of(group, session.choices[group])
        return placed(problem, path, lines, group)
    return problem


def config_warnings(session: Session, loaded: Configs, set_here: set[str]) -> list[Problem]:
    """The advice for a composed config, each where its key was set."""
    return [located(w, session, loaded, set_here) for w in page_warnings(session)]


def validate_one(overrides: list[str], loaded: Configs) -> tuple[list[Problem], list[Problem]]:
    """(problems, warnings) of the one config the overrides compose, each in the file it
    comes from (a problem that only bench, simulate or soak reads says so)."""
    session, problems = checked_config(overrides, loaded)
    if session is None:
        return problems, []
    set_here = {o.lstrip("+~").partition("=")[0] for o in overrides}
    return [who_reads(p) for p in problems], config_warnings(session, loaded, set_here)


def who_reads(problem: Problem) -> Problem:
    """A problem of a group that one command alone reads, saying that the others run."""
    group = problem.key.partition(".")[0].split("[")[0]
    if group in JOB_GROUPS or group not in ALL_GROUPS:
        return problem
    said = f" (only `{group}` reads {group}.*: run, plan, explain and the rest take this config)"
    return dataclasses.replace(problem, message=problem.message + said)
