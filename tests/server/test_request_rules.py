"""A bad request body is answered with the field and the rule it breaks, in one line (issue 22,
item 5: ``prompt: []`` used to get ``prompt.constrained-str: Input should be a valid string (and 3
more problems)``), and options the server cannot honour are refused rather than answered with
a quietly different result (``logprobs: 0`` got ``null``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from servelab.core.errors import UserError
from servelab.server.errors import validation_message
from servelab.server.run import ServerConfig
from servelab.server.schemas import ChatCompletionRequest, CompletionRequest

CHAT = [{"role": "user", "content": "hi"}]
RULES = [  # (model, body, the one line, param)
    (CompletionRequest, {"prompt": []}, "prompt: must not be empty: give text or at least one token id", "prompt"),
    (CompletionRequest, {"prompt": [""]}, "prompt: item 0 must be 1 to 4,194,304 characters of text, got 0",
     "prompt"),
    (CompletionRequest, {"prompt": [-1]}, "prompt: token 0 must be a token id (an integer in [0, 2147483647]), "
                                          "got -1", "prompt"),
    (CompletionRequest, {"prompt": [[3, True]]}, "prompt: item 0 token 1 must be a token id (an integer in "
                                                 "[0, 2147483647]), got True", "prompt"),
    (CompletionRequest, {"prompt": ["a", "b"]}, "prompt: one prompt per request: a list of 2 prompts is not "
                                                "supported", "prompt"),
    (CompletionRequest, {"prompt": 5}, "prompt: must be text, a list of token ids, or a list of one prompt, got 5",
     "prompt"),
    (CompletionRequest, {"prompt": "x", "stop": ["s"] * 17}, "stop: at most 16 stop strings, got 17", "stop"),
    (CompletionRequest, {"prompt": "x", "stop": ["a", ""]}, "stop: item 1 must be 1 to 256 characters long, got 0",
     "stop"),
    (CompletionRequest, {"prompt": "x", "logprobs": 0}, "logprobs: log-probabilities are not supported by this "
                                                        "server yet", "logprobs"),
    (CompletionRequest, {"prompt": "x", "max_tokens": 0}, "max_tokens: input should be greater than or equal to 1, "
                                                          "got 0", "max_tokens"),
    (CompletionRequest, {}, "prompt: required", "prompt"),
    (ChatCompletionRequest, {"messages": CHAT, "logprobs": True}, "logprobs: log-probabilities are not supported",
     "logprobs"),
    (ChatCompletionRequest, {"messages": CHAT, "top_logprobs": 2}, "top_logprobs: log-probabilities are not "
                                                                   "supported", "top_logprobs"),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": 5}]},
     "messages[0].content: none of its accepted forms matches, got an integer", "messages[0].content"),
]


@pytest.mark.parametrize("model, body, line, param", RULES, ids=[str(r[1])[:40] for r in RULES])
def test_each_bad_body_gets_its_rule_in_one_line(model, body, line, param):
    with pytest.raises(ValidationError) as err:
        model.model_validate(body)
    message, got_param = validation_message([{**e, "loc": ("body", *e["loc"])} for e in err.value.errors()])
    assert message.startswith(line) and "\n" not in message and "constrained" not in message, message
    assert got_param == param


def test_other_fields_wrong_too_are_named_after_the_first():
    with pytest.raises(ValidationError) as err:
        CompletionRequest.model_validate({"prompt": "", "max_tokens": -1, "top_p": 7})
    message, _ = validation_message([{**e, "loc": ("body", *e["loc"])} for e in err.value.errors()])
    assert message.endswith("(also wrong: top_p, prompt)"), message


@pytest.mark.parametrize("key", ["KEY ", " KEY", "K\u00c9Y", "K\tY"])
def test_an_api_key_no_client_could_send_is_refused_at_start(key):
    with pytest.raises(UserError, match="--api-key must be printable ASCII with no space at either end"):
        ServerConfig(Path("model"), api_key=key)
    ServerConfig(Path("model"), api_key="KEY")  # the same key without the stray space is fine


def test_a_live_server_answers_with_the_rule(start_server):
    import httpx

    server = start_server(api_key="KEY")
    headers = {"Authorization": "Bearer KEY"}
    for body, line in (({"prompt": []}, "prompt: must not be empty"), ({"prompt": "hi", "logprobs": 0}, "logprobs: "),
                       ({"prompt": "hi", "stop": ["s"] * 17}, "stop: at most 16 stop strings, got 17")):
        response = httpx.post(server.base_url + "/v1/completions", json=body, headers=headers)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["message"].startswith(line)
    with pytest.raises(httpx.LocalProtocolError):  # why 'KEY ' is refused at start: no client can send it
        httpx.post(server.base_url + "/v1/completions", json={"prompt": "hi"}, headers={"Authorization": "Bearer KEY "})
