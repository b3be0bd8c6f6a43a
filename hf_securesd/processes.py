"""Process liveness, for sweeping what a killed run left behind (scratch folders, partial files)."""

from __future__ import annotations

import os

MAX_PID = 2**31 - 1  # process ids are positive C ints (pid_t); Linux caps them far lower (2**22)


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (one owned by another user counts as alive).

    An id no process can have (0, negative, above `MAX_PID`) is not alive; this never raises."""
    if not 0 < pid <= MAX_PID:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
