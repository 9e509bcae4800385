"""``fix_source`` with the default options, once per distinct text in a test session: the
fixture tests, the check's expected lines and the long-file tests all ask for the same
rewrites of the same files (each costs tens of milliseconds of libcst)."""

from __future__ import annotations

import functools

from syncscope.fixes import FixResult, fix_source


@functools.cache
def fixed(source: str) -> FixResult:
    return fix_source(source)
