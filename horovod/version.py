"""Single place the package version lives (read by pyproject and `horovodrun --version`)."""

__version__ = "0.1.0"
