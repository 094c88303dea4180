"""The one error the connector raises, and the translation of client errors into it.

Spark shows a Python data source's failure as a long JVM error whose text embeds the Python traceback;
the only line a user reliably reads there is the last one, ``FlussConnectorError: <message>``. So every
message is a single line that names what the user can fix: the option, the table or the address.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from strom.errors import (
    ConnectionFailedError,
    DatabaseNotExistError,
    NetworkError,
    PartitionNotExistError,
    StromError,
    TableNotExistError,
)

MESSAGE_LENGTH_MAX = 500


class FlussConnectorError(Exception):
    """A failure the user can act on (bad option, unknown table, unreachable cluster); one-line message."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


def one_line(text: str) -> str:
    """Collapse whitespace (a server message may contain newlines) and cap the length."""
    collapsed = " ".join(text.split())
    if len(collapsed) > MESSAGE_LENGTH_MAX:
        collapsed = collapsed[: MESSAGE_LENGTH_MAX - 1] + "…"
    return collapsed


@contextmanager
def translated(bootstrap_servers: str, table: str | None = None) -> Iterator[None]:
    """Turn the client's errors raised inside the block into :class:`FlussConnectorError`.

    Only errors a user can fix are translated; a broken invariant (AssertionError) passes unchanged.
    """
    try:
        yield
    except FlussConnectorError:
        raise
    except (ConnectionFailedError, NetworkError) as exc:
        raise FlussConnectorError(
            f"cannot reach the Fluss cluster at {bootstrap_servers} (option 'bootstrap.servers'): {exc}"
        ) from exc
    except (TableNotExistError, DatabaseNotExistError) as exc:
        raise FlussConnectorError(
            f"table '{table}' does not exist on {bootstrap_servers} (option 'table'): {exc}"
        ) from exc
    except PartitionNotExistError as exc:
        raise FlussConnectorError(f"a partition of table '{table}' no longer exists: {exc}") from exc
    except StromError as exc:
        subject = f"table '{table}'" if table else f"the cluster at {bootstrap_servers}"
        raise FlussConnectorError(f"{type(exc).__name__} from {subject}: {exc}") from exc
    except TimeoutError as exc:
        raise FlussConnectorError(f"timed out talking to {bootstrap_servers}: {exc}") from exc
