"""The one place the version lives: pyproject.toml reads it from here, and
modules import it from here (not from the package, whose public names
import those modules)."""

__version__ = "0.2.0"
