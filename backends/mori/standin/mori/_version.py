"""Version of the pdconform stand-in; the base version is the amd-mori release it mirrors."""

__version__ = "1.2.4+pdconform-standin"
