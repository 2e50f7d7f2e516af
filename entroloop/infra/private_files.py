"""Files and folders only the owner can read: 0600 files, 0700 folders, whatever the umask is.

Why: what entroloop writes holds prompts, answers and corrections (bus logs, the publisher's
spool, gateway frame files, the audit log, the dead-letter quarantine, the chDB folder). With the
usual umask 022 they came out 0644/0444, readable by every account on the host, so the rule
"audit text is read only by audit id or user id" could be bypassed with ``cat``. Modes are set
explicitly (``os.open`` mode plus ``fchmod``/``chmod``) because the umask of a service manager
or a container is not ours to rely on.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700
READ_ONLY_FILE = 0o400  # write-once objects: the owner may read, nobody may write


def make_private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) as 0700 folders; an existing ``path`` of ours is made
    0700 too (a folder from an older version may be world-readable).

    Parents that already exist keep their mode: they may be the user's own folders (``$HOME``).
    A folder owned by another account, or on a read-only filesystem (an auditor verifying a copy
    of the log), is left as it is: reading it must still work.
    """
    path = Path(path)
    missing = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
    for folder in missing:
        os.chmod(folder, PRIVATE_DIR)  # mkdir's mode is masked by the umask; chmod is not
    if not missing:
        info = path.stat()
        if info.st_uid == os.geteuid() and info.st_mode & 0o777 != PRIVATE_DIR:
            try:
                os.chmod(path, PRIVATE_DIR)
            except OSError:  # read-only filesystem: nothing new is written there either
                pass
    return path


def open_private(path: Path, mode: str = "ab") -> IO[Any]:
    """``open(path, mode)`` for binary write/append modes, creating the file 0600 (an existing one
    is made 0600 too: a file from an older version may be world-readable)."""
    flags = os.O_CREAT | os.O_WRONLY
    if "a" in mode:
        flags |= os.O_APPEND
    if "w" in mode:
        flags |= os.O_TRUNC
    if "+" in mode:
        flags = (flags & ~os.O_WRONLY) | os.O_RDWR
    fd = os.open(path, flags, PRIVATE_FILE)
    try:
        os.fchmod(fd, PRIVATE_FILE)
        return os.fdopen(fd, mode)
    except BaseException:
        os.close(fd)
        raise


__all__ = ["PRIVATE_DIR", "PRIVATE_FILE", "READ_ONLY_FILE", "make_private_dir", "open_private"]
