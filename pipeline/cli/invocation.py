"""What a subcommand is handed (its checked command line and config sources), and how it prints
its result (`--json`: one JSON document on stdout)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

from pipeline.config.app import CommandLine, checked_session
from pipeline.config.compose import ALL_GROUPS, Session
from pipeline.config.deployment import Configs
from pipeline.config.job import Job


@dataclasses.dataclass(frozen=True)
class Invocation:
    """One subcommand's checked input: its command line and the options it may compose."""

    line: CommandLine
    sources: Configs
    reads: frozenset[str] = ALL_GROUPS
    """The config groups the subcommand reads: it checks those (see `READS`)."""

    def session(self) -> Session:
        return checked_session(self.line, self.sources, self.reads)

    def job(self) -> Job:
        """The config, checked in every group the subcommand reads (ConfigError before
        anything runs)."""
        return self.session().job(self.reads)

    def config_text(self) -> str:
        """`--cfg job`: the config that runs, as YAML (`--json`: a JSON document)."""
        session = self.session()
        return json.dumps(session.as_plain(), indent=2) if self.line.as_json else session.as_yaml()


Handler = Callable[[Invocation], int]


def emit(inv: Invocation, result: dict, text: Callable[[dict], str]) -> None:
    print(json.dumps(result, indent=2) if inv.line.as_json else text(result))
