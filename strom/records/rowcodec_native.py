"""The compiled row codec (``native/rowcodec.c``), or None where it was not built (no C compiler): every
caller then takes its pure-Python reference, which it must equal byte for byte."""

from __future__ import annotations

try:
    import strom.records._rowcodec as native
except ImportError:  # built without a C compiler: the references handle everything
    native = None

NATIVE_AVAILABLE = native is not None

__all__ = ["NATIVE_AVAILABLE", "native"]
