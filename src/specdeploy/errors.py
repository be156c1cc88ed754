"""The one exception type for user mistakes: the CLI prints its message on one line and exits 2."""


class SpecdeployError(ValueError):
    """A problem the user can fix (bad path, incompatible models, invalid option), with a message saying how."""
