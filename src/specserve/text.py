"""Tokens -> text, incrementally: whole UTF-8 characters only, stop strings held back."""
from __future__ import annotations

from typing import Callable, Sequence


class StreamDecoder:
    """Turns a stream of token ids into text deltas.

    Bytes of a character split across tokens wait for the rest; text that could be
    the start of a stop string is held back until it is known not to be one.
    """

    def __init__(self, token_bytes: Callable[[int], bytes], stop: Sequence[str] = ()):
        self._token_bytes = token_bytes
        self._stop = [s for s in stop if s]
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._pending = b""  # bytes not yet forming whole characters
        self._text = ""  # decoded text not yet emitted
        self.stopped = False

    def push(self, tokens: Sequence[int]) -> str:
        """Feed tokens, get the text that is now final ("" while holding back)."""
        if self.stopped:
            return ""
        self._pending += b"".join(self._token_bytes(t) for t in tokens)
        text, self._pending = _split_utf8(self._pending)
        self._text += text
        for s in self._stop:
            i = self._text.find(s)
            if i >= 0:
                self.stopped = True
                out, self._text = self._text[:i], ""
                return out
        cut = max(len(self._text) - self._hold, 0)
        out, self._text = self._text[:cut], self._text[cut:]
        return out

    def flush(self) -> str:
        """The rest, at the end of generation (incomplete bytes become U+FFFD)."""
        if self.stopped:
            return ""
        out = self._text + self._pending.decode("utf-8", errors="replace")
        self._text, self._pending = "", b""
        return out


def _split_utf8(data: bytes) -> tuple[str, bytes]:
    """Decode the longest prefix of whole UTF-8 characters; return it and the rest."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8"), data[cut:]
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", errors="replace"), b""
