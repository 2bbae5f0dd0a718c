"""Writing local files so that a reader never sees half of one."""

from __future__ import annotations

import os
import tempfile


def write_text_atomic(path: str, text: str) -> None:
    """Writes to a temporary file beside `path`, then renames it over `path`: a process killed
    mid-write leaves the old file or the new one, never half of one."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
