"""The one place where what bmoe's C extension (``bmoe.cext``) raises becomes bmoe's errors.

The Cython modules raise builtins: ``OSError`` with the C ``errno`` (``mmap``, ``open``,
``pread``), ``MemoryError`` (``calloc``, ``posix_memalign``). Adapters call them inside
``native_call(what)``, so a caller only ever sees ``BmoeError`` kinds. A ``ValueError``
from the extension means bmoe called it wrongly (a bug) and is left loud.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from bmoe.errors import BmoeError, StreamingSetupError


@contextmanager
def native_call(what: str) -> Iterator[None]:
    """Run C-extension work; ``OSError``/``MemoryError`` become ``StreamingSetupError``
    naming ``what`` (and the C error's text)."""
    try:
        yield
    except BmoeError:
        raise
    except MemoryError as exc:
        raise StreamingSetupError(f"{what}: out of memory") from exc
    except OSError as exc:
        detail = exc.strerror or str(exc)
        where = f" ({exc.filename})" if exc.filename else ""
        raise StreamingSetupError(f"{what}: {detail}{where}") from exc
