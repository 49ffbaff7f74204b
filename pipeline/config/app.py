"""The front door of every subcommand: its command line, and the configs it may compose.

There is no Hydra app here: only Hydra's compose API, which builds a config and does nothing
else. So nothing a config says can run a callback, set an environment variable, configure
logging, pick a launcher or sweeper, or write a run folder: those parts of Hydra never run.
The command line takes overrides in Hydra's grammar and a few flags of its own; anything else
(Hydra's `--config-path`, `--experimental-rerun`, ...) is refused before a config is read; `-m`
sweeps run here, one composed job after another, writing nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from hydra import initialize_config_module

from pipeline.config.compose import ALL_GROUPS, Session
from pipeline.config.deployment import Configs
from pipeline.config.sources import SHIPPED
from pipeline.config.validate import checked_config
from pipeline.core.checks import ConfigError, Problem, raise_problems

FLAGS_WITH_VALUES = {"--config-dir": "config_dir", "--cfg": "cfg"}


@dataclass
class CommandLine:
    """What one subcommand was asked: flags, and Hydra overrides (unchecked)."""

    as_json: bool = False
    """`--json`: one JSON document on stdout (a failure's too); logs go to stderr."""
    help: bool = False
    """`--help`: what the subcommand does, its key knobs and an example."""
    verbose: bool = False
    """`--verbose`: debug logs, Hydra's and OmegaConf's own words included."""
    multirun: bool = False
    """`-m`: one job per combination of the overrides' values (`key=a,b`)."""
    cfg: str | None = None
    """`--cfg job`: print the composed config instead of running."""
    config_dir: str | None = None
    """`--config-dir DIR`: the user's own options (`DIR/<group>/<name>.yaml`) and their
    deployment's defaults (`DIR/config.yaml`)."""
    allowed_endpoints: list[str] = field(default_factory=list)
    """`--allow-endpoint HOST:PORT` (repeatable): store addresses a config file may name."""
    overrides: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, args: list[str]) -> CommandLine:
        """ConfigError for any flag this CLI does not take (Hydra's own included)."""
        line, rest = cls(), list(args)
        while rest:
            arg = rest.pop(0)
            name, eq, value = arg.partition("=")
            if arg == "--json":
                line.as_json = True
            elif arg in ("-h", "--help"):
                line.help = True
            elif arg in ("-v", "--verbose"):
                line.verbose = True
            elif arg in ("-m", "--multirun"):
                line.multirun = True
            elif name == "--allow-endpoint":
                if not eq and not rest:
                    raise ConfigError([Problem("", f"{name} needs a value", "command line")])
                line.allowed_endpoints.append(value if eq else rest.pop(0))
            elif name in FLAGS_WITH_VALUES:
                if not eq and not rest:
                    raise ConfigError([Problem("", f"{name} needs a value", "command line")])
                setattr(line, FLAGS_WITH_VALUES[name], value if eq else rest.pop(0))
            elif arg.startswith("-"):
                raise ConfigError([Problem("", refused_flag(arg), "command line")])
            else:
                line.overrides.append(arg)
        if line.cfg not in (None, "job"):
            raise ConfigError([Problem("", "--cfg takes only 'job'", "command line")])
        return line


def refused_flag(arg: str) -> str:
    return (
        f"{arg}: not an option of this command (options: --json, --help, --verbose, -m, "
        "--cfg job, --config-dir DIR, --allow-endpoint HOST:PORT; everything else is a "
        "key=value override)"
    )


@contextlib.contextmanager
def configs(config_dir: str | None, allowed: Sequence[str] = ()) -> Iterator[Configs]:
    """Hydra's compose API over the shipped options and the user's checked ones, and the
    user's deployment (`config.yaml`) if any (`allowed`: the store endpoints their files may
    name)."""
    with initialize_config_module(config_module=SHIPPED, version_base="1.3"):
        loaded = Configs.load(config_dir, allowed)
        with loaded.registered():
            yield loaded


def checked_session(
    line: CommandLine, loaded: Configs, reads: frozenset[str] = ALL_GROUPS
) -> Session:
    """The composed config, once the user folder, the overrides and the groups a command
    reads are clean (ConfigError listing every problem otherwise)."""
    session, problems = checked_config(line.overrides, loaded, reads)
    raise_problems(problems)
    assert session is not None, "no session without a problem"
    return session
