"""Incremental detokenisation and stop-string detection for one request.

Byte-level BPE can split one UTF-8 character over several tokens, so a token's text is not
``decode([token])``. ``tokenizers.decoders.DecodeStream`` handles that: it holds a token back
until its bytes form whole characters, and re-decodes a little left context so merges that
depend on it come out right; the prompt's ids seed that context. It replaced a hand-written
window decoder (same output, a little less CPU per token: docs/ux.md, scripts/ux_report.py).

Stop strings: the output text is cut just before the first match, and the detokenizer then
reports ``stop_reason``. While streaming, the last ``max(len(stop)) - 1`` characters are held
back (they may be the start of a stop string); ``finish`` releases them.

Invariant: the concatenation of every delta returned equals ``text`` once ``finish`` ran.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (), *, stop: Sequence[str] = (),
                 skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._stream = DecodeStream(list(prompt_ids), skip_special_tokens=skip_special_tokens)
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
        delta = self._stream.step(self._tokenizer, token_id)
        if delta:
            self._append(delta)
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
