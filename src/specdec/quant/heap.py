"""Handing memory that converting weights freed back to the system."""

from __future__ import annotations

import ctypes


def return_freed_memory() -> None:
    """Give the heap's free pages back (glibc's malloc_trim). Converting a model frees large
    temporaries between long-lived results; glibc kept them, and how much it kept varied run to
    run: the 0.5B draft's conversion peaked at 1.6 GB in one run and 2.4 GB in the next."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass
