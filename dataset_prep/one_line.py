"""Reader for the one-line-per-user format of S3-Rec, FMLP-Rec and BSARec.

Each line is ``user_id item_id item_id ...`` separated by whitespace, items in
time order, all ids positive integers written without leading zeros. Blank
lines are allowed only at the end of the file.
"""

from __future__ import annotations

from pathlib import Path

from .errors import RawFormatError
from .raw import RawFile, RawSequences, show_token

_ZERO = ord("0")


def read_one_line(path: Path | str, *, show_progress: bool = True) -> RawSequences:
    """Parse and validate a one-line-per-user file.

    Raises `RawInputError` if the file cannot be read and `RawFormatError`
    (file name, line number, problem) on the first malformed line.
    """
    path = Path(path)
    sequences: list[tuple[str, list[str]]] = []
    first_line_of_user: dict[str, int] = {}
    first_blank: int | None = None

    with RawFile(path, show_progress=show_progress) as raw:
        for number, line in raw:
            tokens = line.split()
            if not tokens:
                if first_blank is None:
                    first_blank = number
                continue
            if first_blank is not None:
                raise RawFormatError(
                    path,
                    first_blank,
                    "blank line between user lines (blank lines are only allowed at the end)",
                )
            for position, token in enumerate(tokens):
                # A canonical positive integer: ASCII digits, no leading zero. Leading
                # zeros are rejected because "7" and "007" would become two RecBole tokens.
                if not token.isdigit() or token[0] == _ZERO:
                    what = "user id" if position == 0 else f"item #{position}"
                    raise RawFormatError(path, number, f"{what} {_problem(token)}")
            user = tokens[0].decode("ascii")
            if len(tokens) == 1:
                raise RawFormatError(path, number, f"user {user} has no items")
            previous = first_line_of_user.get(user)
            if previous is not None:
                raise RawFormatError(
                    path, number, f"user {user} already appeared on line {previous}"
                )
            first_line_of_user[user] = number
            sequences.append((user, [token.decode("ascii") for token in tokens[1:]]))

    if not sequences:
        problem = "file is empty" if first_blank is None else "file has only blank lines"
        raise RawFormatError(path, None, f"{problem}: expected one line per user")
    return RawSequences(source=raw.source, sequences=sequences)


def _problem(token: bytes) -> str:
    shown = show_token(token)
    if not token.isdigit():
        return f"{shown} is not a positive integer"
    if token.strip(b"0") == b"":
        return f"{shown} is not positive (ids start at 1)"
    return f"{shown} has leading zeros (write ids as plain positive integers)"


def looks_like_one_line(path: Path | str) -> bool:
    """Whether the first line of `path` reads as a one-line-per-user record.

    Used only to suggest ``--format one-line`` when a raw-source reader fails
    on the first line, so it reads a bounded prefix and never raises.
    """
    try:
        with open(path, "rb") as fh:
            tokens = fh.readline(1 << 20).split()
    except OSError:
        return False
    return len(tokens) >= 2 and all(t.isdigit() and t[0] != _ZERO for t in tokens)
