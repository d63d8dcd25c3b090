"""Tokens -> text, incrementally: whole UTF-8 characters only, stop strings held back."""
from __future__ import annotations

from typing import Callable, Sequence


class StreamDecoder:
    """Turns a stream of token ids into text deltas.

    Bytes of a character split across tokens wait for the rest; text that could be
    the start of a stop string is held back until it is known not to be one.

    Generation stops at the first character that completes a stop string (of those
    completing there, the longest wins), and the text is cut where that string starts.
    This depends on the text alone, not on how tokens were grouped into steps: a step
    that verified several tokens ends where one token at a time would have ended.
    """

    def __init__(self, token_bytes: Callable[[int], bytes], stop: Sequence[str] = (), skip: int = 0):
        self._token_bytes = token_bytes
        self._skip = skip  # leading bytes of the output not to emit (healed text the client already has)
        self._stop = [s for s in stop if s]
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._pending = b""  # bytes not yet forming whole characters
        self._text = ""  # decoded text not yet emitted
        self.stopped = False
        self.stop_word = ""  # the stop string that ended the text, once stopped

    def push(self, tokens: Sequence[int]) -> tuple[str, int]:
        """Feed tokens; get the text that is now final ("" while holding back) and how many of
        the tokens count: all, or those up to the one that completed a stop string."""
        if self.stopped:
            return "", 0
        for n, token in enumerate(tokens, 1):
            piece = self._token_bytes(token)
            if self._skip:
                piece, self._skip = piece[self._skip:], max(0, self._skip - len(piece))
            self._pending += piece
            text, self._pending = _split_utf8(self._pending)
            self._text += text
            if text and self._stop and self._find_stop(len(text)):
                out, self._text = self._text, ""
                return out, n
        cut = max(len(self._text) - self._hold, 0)
        out, self._text = self._text[:cut], self._text[cut:]
        return out, len(tokens)

    def _find_stop(self, n_new: int) -> bool:
        """Whether the last n_new characters completed a stop string; if so, keep the text before it."""
        # none completed earlier, so one completed now ends in the new text: look from hold before it
        start = max(len(self._text) - n_new - self._hold, 0)
        best = None  # (end, start, stop string)
        for s in self._stop:
            i = self._text.find(s, start)
            if i >= 0 and (best is None or (i + len(s), i) < best[:2]):
                best = (i + len(s), i, s)
        if best is None:
            return False
        self.stopped, self.stop_word = True, best[2]
        self._text = self._text[: best[1]]
        return True

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
