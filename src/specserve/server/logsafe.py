"""Log lines a client cannot forge.

Clients choose strings that end up in log messages (a model name, an unknown field, a
path). A newline in one would start a line of the client's making, e.g. a fake
`ERROR specserve.server: ...`; an ANSI escape would repaint the terminal. `SafeFormatter`
escapes every character that is not printable in the message and in the exception's
own text, so one record is always one line plus, for errors, the traceback's frames.
"""
from __future__ import annotations

import logging
import traceback

# Traceback pieces that come from the code, not from data: frames, the header, chain notes.
_STRUCTURAL = ("Traceback (", "  File ", "\n", "  [Previous line")


def escape(text: str) -> str:
    """`text` with each non-printable character (newline, CR, ESC, U+2028...) as a Python escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class SafeFormatter(logging.Formatter):
    """A Formatter whose messages and exception texts are escaped (see the module docstring)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape(record.message)
        return super().formatMessage(record)

    def formatException(self, ei) -> str:
        lines = []
        for chunk in traceback.TracebackException(*ei).format():
            lines.append(chunk if chunk.startswith(_STRUCTURAL) else escape(chunk.rstrip("\n")) + "\n")
        return "".join(lines).rstrip("\n")


def install(fmt: str = "%(levelname)s %(name)s: %(message)s") -> None:
    """Escape on every handler of the root logger (where the server's and uvicorn's loggers end up)."""
    root = logging.getLogger()
    for handler in root.handlers:
        current = handler.formatter
        handler.setFormatter(SafeFormatter(current._fmt if current is not None else fmt,
                                           current.datefmt if current is not None else None))
