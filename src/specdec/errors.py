"""The one exception type that reaches users as a one-line message."""


class SpecdecError(Exception):
    """A problem the user can fix; the message says what is wrong and what to do."""
