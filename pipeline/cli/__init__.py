"""The command line (`main`) and its subcommands (`COMMANDS`), thin: the front door
(`pipeline.config.app`) parses and composes; each subcommand hands the checked config to a
plain job function."""

from pipeline.cli.commands import COMMANDS
from pipeline.cli.main import main, run_command

__all__ = ["COMMANDS", "main", "run_command"]
