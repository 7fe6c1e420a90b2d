"""The one exception type for user mistakes, shared by every package (one clear line, no traceback)."""


class UserError(Exception):
    """A mistake in user input: the message names the file/field/row and what is allowed."""
