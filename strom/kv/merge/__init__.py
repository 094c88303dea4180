"""Merge engines of primary-key tables (Fluss's ``table.merge-engine``) and the options that choose them."""
