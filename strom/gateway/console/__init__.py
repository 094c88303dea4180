"""The operator's console: web pages the gateway serves under ``/console`` (docs/gateway.md, "The console")."""

from strom.gateway.console.pages import CONSOLE_KEYS, PREFIX, Console, install_console

__all__ = ["CONSOLE_KEYS", "PREFIX", "Console", "install_console"]
