"""Which lake format a table uses: the registry above the :mod:`strom.lake.format` contract.

A format's library loads only when a table asks for it (delta-rs for Delta, pyiceberg for Iceberg, pylance for Lance, pypaimon-rust for
Paimon), and
the contract imports none of its implementations.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping

from strom.errors import InvalidConfigError
from strom.lake.format import LakeFormat
from strom.metadata.table_info import TableInfo
from strom.table_properties import DATALAKE_FORMAT, datalake_option_prefix


def _load_delta(options: Mapping[str, str]) -> LakeFormat:
    from strom.lake.delta import DeltaLakeFormat  # delta-rs loads only when a table asks for Delta

    return DeltaLakeFormat(options)


def _load_iceberg(options: Mapping[str, str]) -> LakeFormat:
    from strom.lake.iceberg import IcebergLakeFormat  # pyiceberg loads only when a table asks for Iceberg

    return IcebergLakeFormat(options)


def _from_extra(lake: str, module: str, class_name: str, library: str) -> Callable[[Mapping[str, str]], LakeFormat]:
    """A format whose library is an extra (``strom[<lake>]``): it loads only when a table asks for it, and
    its absence is a clear error naming the extra."""

    def load(options: Mapping[str, str]) -> LakeFormat:
        try:
            implementation = importlib.import_module(module)
        except ImportError as exc:
            raise InvalidConfigError(
                f"the {lake} lake format needs {library}, which is not installed ({exc}): pip install 'strom[{lake}]'"
            ) from exc
        format_class: Callable[[Mapping[str, str]], LakeFormat] = getattr(implementation, class_name)
        return format_class(options)

    return load


FORMATS: dict[str, Callable[[Mapping[str, str]], LakeFormat]] = {
    "delta": _load_delta,
    "iceberg": _load_iceberg,
    "lance": _from_extra("lance", "strom.lake.lance", "LanceLakeFormat", "pylance"),
    "paimon": _from_extra("paimon", "strom.lake.paimon", "PaimonLakeFormat", "pypaimon-rust"),
}
"""Lake format identifier -> factory taking the format's options (``table.datalake.<format>.*``)."""


def lake_format(info: TableInfo) -> LakeFormat:
    """The format a lake-enabled table names (``table.datalake.format``), configured from its
    ``table.datalake.<format>.<key>`` properties.

    Raises:
        InvalidConfigError: no or an unknown format, or a format option missing (e.g. the warehouse).
    """
    properties = info.properties
    name = info.options.datalake_format or ""
    factory = FORMATS.get(name)
    if factory is None:
        raise InvalidConfigError(
            f"table '{info.path}' names lake format {name or '(none)'!r} ({DATALAKE_FORMAT}); "
            f"strom writes {', '.join(sorted(FORMATS))}"
        )
    prefix = datalake_option_prefix(name)
    return factory({key[len(prefix):]: value for key, value in properties.items() if key.startswith(prefix)})


__all__ = ["FORMATS", "lake_format"]
