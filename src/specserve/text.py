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
    """Decode all but a trailing incomplete UTF-8 sequence, which is returned as the rest.

    Invalid bytes become U+FFFD here and now, wherever they are: holding them back would
    make the text depend on how tokens were grouped into steps.
    """
    for k in range(1, min(3, len(data)) + 1):  # an incomplete sequence is at most 3 bytes
        b = data[-k]
        if b & 0xC0 == 0x80:  # a continuation byte: its lead byte is further back
            continue
        need = 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4 if b >> 3 == 0b11110 else 1
        if need > k:
            return data[:-k].decode("utf-8", errors="replace"), data[-k:]
        break
    return data.decode("utf-8", errors="replace"), b""
