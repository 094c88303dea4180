"""Which lake format a table uses: the registry above the :mod:`strom.lake.format` contract.

A format's library loads only when a table asks for it (delta-rs for Delta, pyiceberg for Iceberg, pylance for Lance, pypaimon-rust for
Paimon), and
the contract imports none of its implementations.
"""

from __future__ import annotations

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


def _load_lance(options: Mapping[str, str]) -> LakeFormat:
    # pylance (an extra) loads only when a table asks for Lance
    try:
        from strom.lake.lance import LanceLakeFormat
    except ImportError as exc:
        raise InvalidConfigError(
            f"the lance lake format needs pylance, which is not installed ({exc}): pip install 'strom[lance]'"
        ) from exc
    return LanceLakeFormat(options)


def _load_paimon(options: Mapping[str, str]) -> LakeFormat:
    # pypaimon-rust (an extra) loads only when a table asks for Paimon
    try:
        from strom.lake.paimon import PaimonLakeFormat
    except ImportError as exc:
        raise InvalidConfigError(
            f"the paimon lake format needs pypaimon-rust, which is not installed ({exc}): pip install 'strom[paimon]'"
        ) from exc
    return PaimonLakeFormat(options)


FORMATS: dict[str, Callable[[Mapping[str, str]], LakeFormat]] = {
    "delta": _load_delta, "iceberg": _load_iceberg, "lance": _load_lance, "paimon": _load_paimon,
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
