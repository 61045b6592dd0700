"""Errors that a user fixes by changing their data or their config."""


class DatasetError(Exception):
    """The data on disk cannot be read as the dataset it claims to be."""


class ConfigError(Exception):
    """A config value is wrong; the message names the key and what is allowed."""
