"""Coverage-guided fuzz targets (atheris), one per parser; see README.md."""
