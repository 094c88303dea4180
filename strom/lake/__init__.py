"""Lake formats: the lake copy of a strom table (Delta first), written by tiering, read by union reads.

Import :mod:`strom.lake.format` for the contract; a format's module loads only when a table names it.
"""
