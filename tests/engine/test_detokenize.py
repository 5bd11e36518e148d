"""Incremental detokenisation with multi-byte characters, and stop strings."""

from __future__ import annotations

from servelab.engine.detokenize import IncrementalDetokenizer

TEXT = "Natalia sold 48 clips: 3€ each, café 😀 数学 done.\nAnswer: 72"


def _stream(tokenizer, ids, **kwargs):
    detok = IncrementalDetokenizer(tokenizer, **kwargs)
    deltas = [detok.add(t) for t in ids]
    deltas.append(detok.finish())
    return detok, deltas


def test_deltas_concatenate_to_the_full_decode(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False).ids
    detok, deltas = _stream(tokenizer, ids)
    assert "".join(deltas) == detok.text == TEXT
    assert all("\ufffd" not in d for d in deltas)
    assert sum(1 for d in deltas if d == "") >= 3  # the emoji and CJK bytes arrive over several tokens


def test_prompt_context_is_not_emitted(tokenizer):
    prompt = tokenizer.encode("How many clips", add_special_tokens=True).ids
    ids = tokenizer.encode(" did she sell? 数", add_special_tokens=False).ids
    detok = IncrementalDetokenizer(tokenizer, prompt)
    out = "".join(detok.add(t) for t in ids) + detok.finish()
    assert out == " did she sell? 数"


def test_stop_string_truncates_and_is_never_streamed(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False).ids
    detok, deltas = _stream(tokenizer, ids, stop=("Answer:", "zzz"))
    assert detok.stop_reason == "Answer:"
    assert detok.text == "".join(deltas) == TEXT[:TEXT.index("Answer:")]
    assert detok.add(ids[0]) == ""


def test_stop_string_spanning_tokens(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False).ids
    stop = "fé 😀 数"
    detok, deltas = _stream(tokenizer, ids, stop=(stop,))
    assert detok.text == TEXT[:TEXT.index(stop)] and "".join(deltas) == detok.text


def test_random_ids_after_a_prompt_stream_exactly_the_decode_of_the_output(tokenizer):
    """Any id sequence (partial UTF-8 included) streams to what decoding the prompt and output
    together gives past the prompt, except an unfinished character at the very end, which is
    never emitted (its bytes may still complete)."""
    import numpy as np

    rng = np.random.default_rng(7)
    prompt = tokenizer.encode("Natalia sold", add_special_tokens=False).ids
    for _ in range(20):
        ids = rng.integers(0, tokenizer.get_vocab_size(), int(rng.integers(1, 60))).tolist()
        detok, deltas = _stream(tokenizer, ids)
        assert "".join(deltas) == detok.text == tokenizer.decode(ids).rstrip("\ufffd")
        with_prompt = IncrementalDetokenizer(tokenizer, prompt)
        out = "".join(with_prompt.add(t) for t in ids) + with_prompt.finish()
        assert tokenizer.decode(prompt + ids).startswith(tokenizer.decode(prompt))
        assert out == tokenizer.decode(prompt + ids)[len(tokenizer.decode(prompt)):].rstrip("\ufffd")
