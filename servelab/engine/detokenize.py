"""Incremental detokenisation and stop-string detection for one request.

Byte-level BPE can split one UTF-8 character over several tokens, so a token's text is not
``decode([token])``. We decode a short window (``prefix_offset:``) and emit only the part
past what the window decoded before the new token, holding back while the tail is an
incomplete character (U+FFFD). Windows start a few tokens back so merges that depend on
the left context decode correctly.

Stop strings: the output text is cut just before the first match, and the detokenizer then
reports ``stop_reason``. While streaming, the last ``max(len(stop)) - 1`` characters are held
back (they may be the start of a stop string); ``finish`` releases them.

Invariant: the concatenation of every delta returned equals ``text`` once ``finish`` ran.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer

_WINDOW = 5  # tokens of left context re-decoded with each new token


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (), *, stop: Sequence[str] = (),
                 skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._ids = list(prompt_ids)
        self._read_offset = len(self._ids)
        self._prefix_offset = max(len(self._ids) - _WINDOW, 0)
        self._skip = skip_special_tokens
        self._stop = tuple(stop)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._text = ""  # generated text so far (cut at the stop string)
        self._num_emitted = 0  # characters of _text already returned
        self.stop_reason: str | None = None  # the stop string that matched

    @property
    def text(self) -> str:
        return self._text

    @property
    def stopped(self) -> bool:
        return self.stop_reason is not None

    def add(self, token_id: int) -> str:
        """Append one generated token; return the new text that is safe to stream (maybe "")."""
        if self.stopped:
            return ""
        self._ids.append(token_id)
        prefix = self._decode(self._ids[self._prefix_offset:self._read_offset])
        full = self._decode(self._ids[self._prefix_offset:])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self._append(full[len(prefix):])
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        end = len(self._text) if self.stopped else max(len(self._text) - self._hold, self._num_emitted)
        return self._emit(end)

    def finish(self) -> str:
        """Release any held-back text at the end of generation."""
        return self._emit(len(self._text))

    def _append(self, delta: str) -> None:
        search_from = max(len(self._text) - self._hold, 0)
        self._text += delta
        hits = [(i, s) for s in self._stop if (i := self._text.find(s, search_from)) >= 0]
        if hits:
            index, stop = min(hits)
            self._text = self._text[:index]
            self.stop_reason = stop

    def _emit(self, end: int) -> str:
        out = self._text[self._num_emitted:end]
        self._num_emitted = max(end, self._num_emitted)
        return out

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip) if ids else ""
