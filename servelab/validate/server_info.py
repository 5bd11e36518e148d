"""What a running OpenAI-compatible server says about its limits, for a simulator of it.

A simulator replaying a workload needs the server's batch limits and KV capacity: the
context limit (``max_model_len``), the KV block size and number of blocks, the most requests
in a batch (``max_num_seqs``) and the most tokens in a step (``max_num_batched_tokens``).
``GET /v1/models`` gives ``max_model_len`` (vLLM and ``servelab serve`` both list it);
``GET /metrics`` gives the block size and block count in vLLM's ``vllm:cache_config_info``
labels (``servelab serve`` writes the same info gauge, and its batch limits in
``servelab:scheduler_config_info``). Whatever the server does not expose comes from the
command's flags; every value keeps where it came from, so a report says which were read and
which were assumed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from servelab.core.errors import UserError

LIMITS = ("max_model_len", "block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens")
# used when neither the server nor a flag gives a value (vLLM's defaults where it has one)
DEFAULTS = {"max_model_len": 4096, "block_size": 16, "num_gpu_blocks": None, "max_num_seqs": 256,
            "max_num_batched_tokens": 2048}


@dataclass
class ServerLimits:
    model: str
    values: dict[str, int | None] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # limit -> "/v1/models" | "/metrics" | "flag" | "default"

    def get(self, name: str) -> int | None:
        return self.values.get(name)

    def describe(self) -> str:
        return ", ".join(f"{k} {self.values.get(k) if self.values.get(k) is not None else 'unknown'} "
                         f"({self.sources.get(k, '-')})" for k in LIMITS)

    def to_json(self) -> dict:
        return {"model": self.model, "values": dict(self.values), "sources": dict(self.sources)}


def _get(url: str, headers: dict, what: str):
    import httpx

    try:
        r = httpx.get(url, headers=headers, timeout=30)
    except httpx.HTTPError as e:
        raise UserError(f"--base-url: cannot reach {url} ({type(e).__name__}: {e})") from None
    if r.status_code != 200:
        if what == "metrics":
            return None
        raise UserError(f"--base-url: GET {url} answered HTTP {r.status_code}")
    return r


def read_models(base_url: str, headers: dict | None = None) -> tuple[str, int | None]:
    """(the first model's id, its max_model_len if listed)."""
    r = _get(base_url.rstrip("/") + "/v1/models", headers or {}, "models")
    try:
        first = r.json()["data"][0]
        return str(first["id"]), (int(first["max_model_len"]) if first.get("max_model_len") else None)
    except (ValueError, KeyError, IndexError, TypeError):
        raise UserError(f"--base-url: GET {base_url}/v1/models did not list a model") from None


def parse_metrics(text: str) -> dict[str, int]:
    """Limits found in a Prometheus text page: the labels of vLLM's ``vllm:cache_config_info``
    and of servelab's ``servelab:scheduler_config_info`` info gauges."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, int] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError):
        return out
    for family in families:
        for sample in family.samples:
            if not sample.name.startswith(("vllm:cache_config_info", "servelab:scheduler_config_info")):
                continue
            for key in ("block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens"):
                value = sample.labels.get(key)
                if value not in (None, "", "None"):
                    try:
                        out[key] = int(float(value))
                    except ValueError:
                        pass
    return out


def read_limits(base_url: str, flags: dict[str, int | None], headers: dict | None = None) -> ServerLimits:
    """The server's limits: a flag given wins, then what the server exposes, then DEFAULTS."""
    for name, value in flags.items():
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    model, max_len = read_models(base_url, headers)
    exposed: dict[str, tuple[int, str]] = {}
    if max_len:
        exposed["max_model_len"] = (max_len, "/v1/models")
    r = _get(base_url.rstrip("/") + "/metrics", headers or {}, "metrics")
    if r is not None:
        for k, v in parse_metrics(r.text).items():
            exposed[k] = (v, "/metrics")
    limits = ServerLimits(model)
    for name in LIMITS:
        if flags.get(name) is not None:
            limits.values[name], limits.sources[name] = flags[name], "flag"
        elif name in exposed:
            limits.values[name], limits.sources[name] = exposed[name]
        else:
            limits.values[name], limits.sources[name] = DEFAULTS[name], "default"
    return limits
