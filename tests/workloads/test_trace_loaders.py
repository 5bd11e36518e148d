import time

import numpy as np
import pytest

from servelab.workloads import WorkloadError, describe, load_azure_llm, load_burstgpt, load_mooncake
from servelab.workloads.workload import arrival_times

REAL_TRACES = [
    ("traces/azure_llm_2023_conv.csv", load_azure_llm, 19_366),
    ("traces/azure_llm_2023_code.csv", load_azure_llm, 8_819),
    ("traces/mooncake_conversation.jsonl", load_mooncake, 12_031),
]


def assert_workload_invariants(workload):
    times = arrival_times(workload)
    assert [s.request_id for s in workload] == list(range(len(workload)))
    assert times[0] == 0.0
    assert np.all(np.diff(times) >= 0)
    assert all(s.num_prompt_tokens >= 1 and s.num_output_tokens >= 1 for s in workload)


@pytest.mark.parametrize("relpath, loader, num_rows", REAL_TRACES)
def test_real_traces_load_whole_file(data_dir, relpath, loader, num_rows):
    workload = loader(data_dir / relpath)
    assert len(workload) == num_rows
    assert_workload_invariants(workload)
    assert 3000 < describe(workload).duration_s < 3700  # each trace covers about an hour


def test_azure_conv_matches_published_summary_and_loads_fast(data_dir):
    path = data_dir / "traces/azure_llm_2023_conv.csv"
    load_azure_llm(path)  # warm the file cache
    start = time.process_time()  # CPU time: other processes on a shared machine do not count
    workload = load_azure_llm(path)
    elapsed_s = time.process_time() - start
    stats = describe(workload)
    assert elapsed_s < 2.0  # ~0.07 s measured; the bound only catches a gross regression
    assert round(stats.prompt_mean) == 1155 and round(stats.output_mean) == 211
    # second row is 18:15:50.9951690, first 18:15:46.6805900: 100 ns resolution kept
    assert workload[1].arrival_time_s == pytest.approx(4.314579, abs=1e-7)


def test_mooncake_keeps_prefix_blocks(data_dir):
    workload = load_mooncake(data_dir / "traces/mooncake_conversation.jsonl")
    first = workload[0]
    assert first.prefix_block_ids[:3] == (0, 1, 2)
    assert len(first.prefix_block_ids) == -(-first.num_prompt_tokens // 512)
    shared = sum(1 for s in workload if s.prefix_block_ids and s.prefix_block_ids[0] == 0)
    assert shared > 1  # requests sharing block 0 share a prefix


def test_unsorted_rows_are_sorted_stably_and_rebased(write_file):
    path = write_file("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                               "2023-11-16 18:00:02.0000000,30,3\n"
                               "2023-11-16 18:00:01.5000000,10,1\n"
                               "2023-11-16 18:00:02.0000000,20,2\n")
    workload = load_azure_llm(path)
    assert [s.num_prompt_tokens for s in workload] == [10, 30, 20]
    assert [s.arrival_time_s for s in workload] == [0.0, 0.5, 0.5]


@pytest.mark.parametrize("row, message", [
    ("2023-11-16 18:00:01.0000000,abc,3", "ContextTokens must be an integer"),
    ("2023-11-16 18:00:01.0000000,0,3", r"ContextTokens must be in \[1, "),
    ("2023-11-16 18:00:01.0000000,12,-4", r"GeneratedTokens must be in \[1, "),
    ("yesterday,12,4", "TIMESTAMP must look like"),
    ("NaT,12,4", "TIMESTAMP must look like"),
    ("2023-11-16,12,4", "TIMESTAMP must look like"),
    ("2023-11-16 18:00:01.0000000,12", "expected 3 fields"),
])
def test_azure_bad_row_names_file_and_line(write_file, row, message):
    path = write_file("bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                 "2023-11-16 18:00:00.0000000,5,5\n"
                                 f"{row}\n")
    with pytest.raises(WorkloadError, match=message) as info:
        load_azure_llm(path)
    assert str(info.value).startswith(f"{path}:3:")


def test_azure_missing_column_and_missing_file(write_file, tmp_path):
    path = write_file("hdr.csv", "TIMESTAMP,Context,GeneratedTokens\n2023-11-16 18:00:00.0000000,5,5\n")
    with pytest.raises(WorkloadError, match=r"hdr.csv:1: missing column\(s\) \['ContextTokens'\]"):
        load_azure_llm(path)
    with pytest.raises(WorkloadError, match="no such file"):
        load_azure_llm(tmp_path / "absent.csv")


@pytest.mark.parametrize("line, message", [
    ('{"timestamp": 5, "input_length": 10, "output_length": 2', "invalid JSON"),
    ('{"timestamp": 5, "input_length": 10, "hash_ids": []}', "missing key"),
    ('{"timestamp": 5, "input_length": 1.5, "output_length": 2, "hash_ids": []}', "input_length must be an integer"),
    ('{"timestamp": 5, "input_length": 10, "output_length": 0, "hash_ids": []}', r"output_length must be in \[1, "),
    ('{"timestamp": -1, "input_length": 10, "output_length": 2, "hash_ids": []}', "timestamp must be"),
    ('{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": "x"}', "hash_ids must be a list"),
    ('[1, 2]', "expected a JSON object"),
])
def test_mooncake_bad_line_names_file_and_line(write_file, line, message):
    good = '{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]}'
    path = write_file("bad.jsonl", f"{good}\n\n{line}\n")
    with pytest.raises(WorkloadError, match=message) as info:
        load_mooncake(path)
    assert str(info.value).startswith(f"{path}:3:")


BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
BURST_ROWS = ("5,ChatGPT,100,20,120,Conversation log\n"
              "9,GPT-4,50,0,50,API log\n"
              "12,GPT-4,70,30,100,Conversation log\n"
              "20,ChatGPT,0,10,10,API log\n")


def test_burstgpt_skips_zero_token_rows_with_warning(write_file):
    path = write_file("burst.csv", BURST_HEADER + BURST_ROWS)
    with pytest.warns(UserWarning, match="skipped 2 rows"):
        workload = load_burstgpt(path)
    assert [(s.arrival_time_s, s.num_prompt_tokens, s.num_output_tokens) for s in workload] == [
        (0.0, 100, 20), (7.0, 70, 30)]


def test_burstgpt_clamp_error_and_filters(write_file):
    path = write_file("burst.csv", BURST_HEADER + BURST_ROWS)
    clamped = load_burstgpt(path, zero_tokens="clamp")
    assert [s.num_output_tokens for s in clamped] == [20, 1, 30, 10]
    assert [s.num_prompt_tokens for s in clamped] == [100, 50, 70, 1]
    with pytest.raises(WorkloadError, match=r"burst.csv:3: zero request or response tokens"):
        load_burstgpt(path, zero_tokens="error")
    gpt4 = load_burstgpt(path, model="GPT-4", log_type="Conversation log", zero_tokens="error")
    assert [s.num_prompt_tokens for s in gpt4] == [70]
    with pytest.raises(ValueError, match="zero_tokens must be one of"):
        load_burstgpt(path, zero_tokens="drop")


@pytest.mark.parametrize("field, value", [("timestamp", "350"), ("input_length", "12"), ("output_length", "3")])
def test_a_mooncake_number_written_as_a_string_is_an_error(tmp_path, field, value):
    """A string timestamp used to be read as a number: 11 requests from 10 valid rows."""
    import json

    rows = [{"timestamp": 100 * i, "input_length": 50, "output_length": 10, "hash_ids": [i]} for i in range(10)]
    rows.insert(5, {**rows[4], field: value})
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(WorkloadError, match=f"m.jsonl:6: {field} must be a JSON number, got the string '{value}'"):
        load_mooncake(path)


BURSTGPT_ROWS = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "1,ChatGPT,10,0,10,Conversation log\n2,GPT-4,20,0,20,API log\n3,ChatGPT,5,5,10,API log\n")


@pytest.mark.parametrize("filters, message", [
    ({"model": "GPT-5"}, "model='GPT-5' keeps none of the 3 rows; their Model values: 'ChatGPT', 'GPT-4'"),
    ({"log_type": "Nope"}, "log='Nope' keeps none of the 3 rows; their Log Type values: 'API log', 'Conversation log'"),
    ({"model": "GPT-4", "log_type": "Nope"}, "log='Nope' keeps none of the 1 rows left by model='GPT-4'"),
    ({"model": "GPT-4"}, "all 1 rows the filters kept have 0 request or response tokens, which zero=skip drops"),
])
def test_burstgpt_filters_that_leave_nothing_say_which_one(tmp_path, filters, message):
    path = tmp_path / "b.csv"
    path.write_text(BURSTGPT_ROWS)
    with pytest.raises(WorkloadError, match=message.replace("(", r"\(").replace(")", r"\)")), \
            pytest.warns(UserWarning) if "zero" in message else _nothing():
        load_burstgpt(path, **filters)


def _nothing():
    import contextlib

    return contextlib.nullcontext()
