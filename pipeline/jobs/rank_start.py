"""The first code a rank runs: die with the parent and beat, before anything else.

Ranks are forked by the launching process's forkserver, which has imported torch and the
rank's code (`pipeline.jobs.spawn`) already. The rank's work still travels pickled, as bytes,
and is unpickled only after the parent-death signal is armed and the heartbeat runs: a parent
killed meanwhile takes its ranks with it at once, and a rank stopped meanwhile is seen as
stalled (its heartbeat stops) instead of leaving its peers to time out in the rendezvous.
This module imports nothing of the project's.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
import threading
import time
from typing import Any

PR_SET_PDEATHSIG = 1
HEARTBEAT_S = 0.5
"""How often a rank beats."""


def start(work: bytes, rank: int, parent: int, beats: Any, results: Any) -> None:
    """Arm the parent-death signal, start the heartbeat, then run the pickled work: a
    callable and its arguments, given `results` last."""
    die_with(parent)
    threading.Thread(target=beat, args=(beats, rank, parent), daemon=True).start()
    entry, args = pickle.loads(work)
    entry(*args, results)


def die_with(parent: int) -> None:
    """The kernel kills this process when the process that forked it dies (Linux): a rank's
    forkserver, which ends as soon as `parent` (the process that asked for the ranks) does,
    or `parent` itself (a Mooncake master it starts); a rank's `beat` watches `parent` too."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if not alive(parent):  # the parent died before the signal was armed
        os._exit(1)


def alive(pid: int) -> bool:
    """Does process `pid` exist (another user's included)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        pass
    return True


def beat(beats: Any, rank: int, parent: int) -> None:
    while True:
        beats[rank] = time.monotonic()
        if not alive(parent):
            os._exit(1)
        time.sleep(HEARTBEAT_S)
