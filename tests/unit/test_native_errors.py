"""What the C extension raises becomes bmoe's errors in one place."""

from __future__ import annotations

import errno

import pytest

from bmoe.adapters.native_errors import native_call
from bmoe.errors import BmoeError, ExpertReadError, StreamingSetupError


def test_an_os_error_becomes_a_setup_error_naming_the_step_and_the_c_error() -> None:
    expected = r"opening the files: Permission denied \(/m.gguf\)"
    with pytest.raises(StreamingSetupError, match=expected) as e, native_call("opening the files"):
        raise OSError(errno.EACCES, "Permission denied", "/m.gguf")
    assert isinstance(e.value, BmoeError) and isinstance(e.value, OSError)


def test_memory_error_becomes_a_setup_error() -> None:
    with pytest.raises(StreamingSetupError, match="allocating: out of memory"), native_call("allocating"):
        raise MemoryError()


def test_bmoe_errors_pass_through_and_bugs_stay_loud() -> None:
    with pytest.raises(ExpertReadError), native_call("x"):
        raise ExpertReadError("read failed")
    with pytest.raises(ValueError, match="layer out of range"), native_call("x"):
        raise ValueError("layer out of range")
