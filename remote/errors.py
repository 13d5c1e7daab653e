"""Errors of the control side. Each renders as one line; exit codes follow the house rules."""

from __future__ import annotations


class SpecopsError(Exception):
    exit_code = 1


class BadInput(SpecopsError):
    """Inventory, run config, flags: one line naming file, key and what is wrong. Exit 2."""

    exit_code = 2


class ConnectError(SpecopsError):
    """The host could not be reached or refused us (timeouts, auth, host keys). Exit 1."""


class HostKeyError(ConnectError):
    """The host's key is unknown or changed: never accepted silently."""


class AgentError(SpecopsError):
    """The agent on the host did not return a usable JSON document."""
