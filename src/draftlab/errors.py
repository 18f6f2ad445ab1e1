"""User-facing errors: the CLI prints them as one line and exits with code 2."""


class DraftlabError(Exception):
    """Bad input or an unavailable resource; the message names the bad value."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none), for one-line errors."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
