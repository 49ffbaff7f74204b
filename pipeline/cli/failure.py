"""How a subcommand says it failed: one line on stderr, and with `--json` a JSON document on
stdout as well (so `--json` output is always JSON, errors too)."""

from __future__ import annotations

import json
import sys

from pipeline.core.checks import ConfigError
from pipeline.jobs.report import printable
from pipeline.jobs.spawn import RankFailure


def failed(as_json: bool, error: Exception, code: int) -> int:
    """Say why a command failed and return its exit code: one line on stderr (a failed rank:
    its traceback too); with `--json`, also a JSON document on stdout (`error`, `exit_code`,
    and a config mistake's `errors` as validate gives them)."""
    keep = isinstance(error, RankFailure)
    said = printable(str(error), keep_lines=keep)
    print(f"error: {said}", file=sys.stderr)
    if as_json:
        found = error.problems if isinstance(error, ConfigError) else []
        errors = [p.as_dict() for p in found]
        print(json.dumps({"error": str(error), "exit_code": code, "errors": errors}, indent=2))
    return code


class Refused(Exception):
    """A subcommand that declines to run (strict and an inactive strategy): exit 1."""
