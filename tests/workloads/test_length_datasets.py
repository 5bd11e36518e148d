import time

import numpy as np
import pytest

from servelab.workloads import WorkloadError, load_arxiv_lengths, load_gsm8k
from servelab.workloads.tokenize import count_tokens, load_tokenizer, train_bpe_tokenizer


def test_arxiv_lengths(data_dir):
    table = load_arxiv_lengths(data_dir / "datasets/arxiv_summarization_lengths.csv")
    assert len(table) == 28_257
    assert table.num_prompt_tokens.min() >= 1 and table.num_output_tokens.min() >= 1
    assert table.num_prompt_tokens[:2].tolist() == [3772, 2015] and table.num_output_tokens[:2].tolist() == [54, 156]


def test_gsm8k_lengths_with_trained_tokenizer(data_dir):
    start = time.process_time()
    table = load_gsm8k(data_dir / "datasets/gsm8k_train.jsonl")
    elapsed_s = time.process_time() - start
    assert len(table) == 7_473 and table.prompt_texts[0].startswith("Natalia sold clips")
    assert table.num_prompt_tokens.min() >= 1 and table.num_output_tokens.min() >= 1
    assert 30 < table.num_prompt_tokens.mean() < 120 and 50 < table.num_output_tokens.mean() < 200
    assert elapsed_s < 15  # train (~1 s) + tokenise (~1 s) on a shared core


def test_tokenizer_is_deterministic_and_round_trips(tmp_path):
    texts = [f"question {i}: what is {i} plus {i * 3}? answer {i * 4} apples" for i in range(300)]
    a = train_bpe_tokenizer(texts, vocab_size=400)
    b = train_bpe_tokenizer(texts, vocab_size=400)
    assert a.to_str() == b.to_str()
    assert a.decode(a.encode("what is 12 plus 7? ünïcode").ids) == "what is 12 plus 7? ünïcode"
    a.save(str(tmp_path / "tok.json"))
    loaded = load_tokenizer(tmp_path / "tok.json")
    assert np.array_equal(count_tokens(loaded, texts[:5]), count_tokens(a, texts[:5]))
    sub1 = train_bpe_tokenizer(texts, vocab_size=400, max_texts=50, seed=1)
    assert sub1.to_str() == train_bpe_tokenizer(texts, vocab_size=400, max_texts=50, seed=1).to_str()


def test_gsm8k_with_given_tokenizer_and_bad_rows(write_file):
    good = '{"question": "How many apples?", "answer": "Two apples.\\n#### 2"}'
    path = write_file("g.jsonl", good + "\n")
    tokenizer = train_bpe_tokenizer(["How many apples? Two apples. #### 2"] * 3, vocab_size=300)
    table = load_gsm8k(path, tokenizer)
    assert table.num_prompt_tokens.tolist() == [len(tokenizer.encode("How many apples?").ids)]
    bad = write_file("b.jsonl", good + '\n{"question": "", "answer": "x"}\n')
    with pytest.raises(WorkloadError, match=r"b.jsonl:2: question must be a non-empty string"):
        load_gsm8k(bad, tokenizer)


def test_arxiv_bad_row(write_file):
    path = write_file("a.csv", "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
                               "10,2,12,5.0\n10,2.5,12,4.0\n")
    with pytest.raises(WorkloadError, match=r"a.csv:3: num_decode_tokens must be an integer, got '2.5'"):
        load_arxiv_lengths(path)
