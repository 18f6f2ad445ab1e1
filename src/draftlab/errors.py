"""User-facing errors: the CLI prints them as one line and exits with code 2."""


class DraftlabError(Exception):
    """Bad input or an unavailable resource; the message names the bad value."""
