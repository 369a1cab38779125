"""User-facing errors: the binary turns these into one line and a non-zero exit, never a traceback."""


class UserError(Exception):
    """Something the user can fix (a missing file, a corrupt checkpoint, a diverged run): exit 1."""

    exit_code = 1


class ConfigError(UserError, ValueError):
    """A bad setting: unknown key, unparsable value, wrong type, unknown experiment. Exit 2."""

    exit_code = 2
