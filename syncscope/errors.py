"""Errors that reach the user as one line and an exit status, never as a traceback."""

from __future__ import annotations


class SyncscopeError(Exception):
    """A problem with the user's input or environment: printed as one line, exit status 2."""

    exit_code: int = 2

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class BadRunDirectory(SyncscopeError):
    """A run directory that is missing, unreadable or of an unknown format."""


class BadTrace(SyncscopeError):
    """A Kineto trace file that cannot be read (names the file and the problem)."""
