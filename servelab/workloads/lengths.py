"""Length sources: how many prompt and output tokens each request has.

Two layers. A ``LengthDist`` samples one integer length per request (``fixed``,
``uniform``, ``exp``, ``lognormal``); ``str(dist)`` is its spec-string form, so
``parse_length_dist(str(d)) == d``. A ``LengthSource`` samples prompt/output *pairs*
as a ``LengthTable``: independent dists, rows drawn jointly from a dataset or trace
(keeping prompt text where the dataset has it), or a weighted mixture of sources.

Invariants: every sampled length is an int64 in [1, ``MAX_TOKENS``] (a distribution without
its own maximum is clipped there); the same ``rng`` state gives the same table; nothing here
knows about arrival times. Parameters are checked on construction and a bad one is a
``UserError`` (they come from spec strings).

Presets (``PRESETS``), parametrised from the public dataset statistics they imitate:

* ``alpaca``: short chat. Prompt lognormal with mean 83 tokens (sigma 0.6), output
  lognormal with mean 270 (sigma 0.8); both clipped to [1, 2048].
* ``longbench``: long-document tasks truncated to a 4096-token context. Prompt
  lognormal with median 7000 (sigma 0.9: the long tail of LongBench inputs), output
  lognormal with median 64 (sigma 0.8) clipped to [1, 512]; then the prompt is cut so
  prompt + output <= 4096, as LongBench truncates the middle of long inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from servelab.core.errors import UserError
from servelab.core.limits import MAX_TOKENS


@dataclass(frozen=True, slots=True, eq=False)
class LengthTable:
    """Prompt/output length pairs, row-aligned; ``prompt_texts`` when the source has text."""

    num_prompt_tokens: np.ndarray  # int64 [n]
    num_output_tokens: np.ndarray  # int64 [n]
    prompt_texts: tuple[str | None, ...] | None = None
    name: str = ""

    def __post_init__(self) -> None:
        n = len(self.num_prompt_tokens)
        if len(self.num_output_tokens) != n:
            raise ValueError(f"{self.name}: {n} prompt lengths but {len(self.num_output_tokens)} output lengths")
        if self.prompt_texts is not None and len(self.prompt_texts) != n:
            raise ValueError(f"{self.name}: {n} lengths but {len(self.prompt_texts)} prompt texts")
        if n and (np.min(self.num_prompt_tokens) < 1 or np.min(self.num_output_tokens) < 1):
            raise ValueError(f"{self.name}: every length must be >= 1")

    def __len__(self) -> int:
        return len(self.num_prompt_tokens)

    def take(self, indices: np.ndarray) -> LengthTable:
        texts = None if self.prompt_texts is None else tuple(self.prompt_texts[i] for i in indices)
        return LengthTable(self.num_prompt_tokens[indices], self.num_output_tokens[indices], texts, self.name)


class LengthDist(Protocol):
    def sample(self, num_requests: int, rng: np.random.Generator) -> np.ndarray: ...


class LengthSource(Protocol):
    def sample(self, num_requests: int, rng: np.random.Generator) -> LengthTable: ...


def _clip(values: np.ndarray, max_tokens: int | None) -> np.ndarray:
    """Round and clip in float64 first, so a huge draw cannot wrap around in int64."""
    upper = max_tokens if max_tokens is not None else MAX_TOKENS
    return np.clip(np.rint(values), 1, upper).astype(np.int64)


def _check_tokens(what: str, tokens: float, low: float = 1) -> None:
    if not low <= tokens <= MAX_TOKENS:
        raise UserError(f"{what} must be in [{low:g}, {MAX_TOKENS:,}] tokens, got {tokens}")


def _check_max(max_tokens: int | None) -> None:
    if max_tokens is not None:
        _check_tokens("max_tokens", max_tokens)


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@dataclass(frozen=True, slots=True)
class Fixed:
    tokens: int

    def __post_init__(self) -> None:
        _check_tokens("fixed length", self.tokens)

    def sample(self, num_requests: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(num_requests, self.tokens, dtype=np.int64)

    def __str__(self) -> str:
        return f"fixed({self.tokens})"


@dataclass(frozen=True, slots=True)
class Uniform:
    """Integers uniform on [lo, hi], both ends included."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        if not 1 <= self.lo <= self.hi <= MAX_TOKENS:
            raise UserError(f"uniform needs 1 <= lo <= hi <= {MAX_TOKENS:,}, got ({self.lo}, {self.hi})")

    def sample(self, num_requests: int, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(self.lo, self.hi, size=num_requests, endpoint=True, dtype=np.int64)

    def __str__(self) -> str:
        return f"uniform({self.lo},{self.hi})"


@dataclass(frozen=True, slots=True)
class Exponential:
    """Exponential with ``mean`` tokens, rounded and clipped to [1, max_tokens]."""

    mean: float
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.mean <= MAX_TOKENS:
            raise UserError(f"exp mean must be in (0, {MAX_TOKENS:,}], got {self.mean}")
        _check_max(self.max_tokens)

    def sample(self, num_requests: int, rng: np.random.Generator) -> np.ndarray:
        return _clip(rng.exponential(self.mean, size=num_requests), self.max_tokens)

    def __str__(self) -> str:
        tail = "" if self.max_tokens is None else f",{self.max_tokens}"
        return f"exp({_fmt(self.mean)}{tail})"


MAX_SIGMA = 10.0  # exp(10) ~ 22,000: any wider and nearly every draw is clipped to 1 or the maximum


@dataclass(frozen=True, slots=True)
class LogNormal:
    """Lognormal with the given ``median`` (= exp(mu)) and ``sigma``, clipped to [1, max_tokens].

    Parametrised by the median because it is what length histograms show; use
    ``LogNormal.from_mean`` when a paper quotes the mean (mean = median * exp(sigma**2 / 2)).
    """

    median: float
    sigma: float
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if not (0 < self.median <= MAX_TOKENS and 0 <= self.sigma <= MAX_SIGMA):
            raise UserError(f"lognormal needs 0 < median <= {MAX_TOKENS:,} and 0 <= sigma <= {MAX_SIGMA}, "
                            f"got ({self.median}, {self.sigma})")
        _check_max(self.max_tokens)

    @classmethod
    def from_mean(cls, mean: float, sigma: float, max_tokens: int | None = None) -> LogNormal:
        return cls(mean * math.exp(-sigma * sigma / 2), sigma, max_tokens)

    def sample(self, num_requests: int, rng: np.random.Generator) -> np.ndarray:
        return _clip(rng.lognormal(math.log(self.median), self.sigma, size=num_requests), self.max_tokens)

    def __str__(self) -> str:
        tail = "" if self.max_tokens is None else f",{self.max_tokens}"
        return f"lognormal({_fmt(self.median)},{_fmt(self.sigma)}{tail})"


@dataclass(frozen=True, slots=True)
class IndependentLengths:
    """Prompt and output drawn independently; ``max_total_tokens`` truncates the prompt.

    With a context limit the output keeps its length and the prompt is cut to fit, mirroring
    how long-context benchmarks truncate inputs, not answers. An output that leaves no room
    for a one-token prompt is an error naming the request, never a silently shorter output.
    """

    prompt: LengthDist
    output: LengthDist
    max_total_tokens: int | None = None
    name: str = "synthetic"

    def __post_init__(self) -> None:
        if self.max_total_tokens is not None:
            _check_tokens("max_total_tokens", self.max_total_tokens, low=2)

    def sample(self, num_requests: int, rng: np.random.Generator) -> LengthTable:
        prompt = self.prompt.sample(num_requests, rng)
        output = self.output.sample(num_requests, rng)
        if self.max_total_tokens is not None:
            limit = self.max_total_tokens
            over = np.flatnonzero(output >= limit)
            if over.size:
                i = int(over[0])
                raise UserError(f"max_total={limit} truncates prompts only, but request {i} draws an output of "
                                f"{int(output[i])} tokens ({over.size} of {num_requests} reach {limit}), which "
                                f"leaves no room for its prompt: raise max_total or cap output= below it")
            prompt = np.minimum(prompt, limit - output)
        return LengthTable(prompt, output, None, self.name)


@dataclass(frozen=True, slots=True, eq=False)
class EmpiricalLengths:
    """Rows of a dataset or trace drawn jointly, so prompt/output correlation survives.

    ``replace=None`` draws without replacement while the table is large enough (distinct
    prompts, like a benchmark run) and with replacement beyond that.
    """

    table: LengthTable
    replace: bool | None = None

    def __post_init__(self) -> None:
        if len(self.table) == 0:
            raise ValueError(f"{self.table.name}: cannot sample from an empty table")

    def sample(self, num_requests: int, rng: np.random.Generator) -> LengthTable:
        replace = self.replace if self.replace is not None else num_requests > len(self.table)
        if not replace and num_requests > len(self.table):
            raise ValueError(f"{self.table.name} has {len(self.table)} rows, "
                             f"cannot draw {num_requests} without replacement")
        return self.table.take(rng.choice(len(self.table), size=num_requests, replace=replace))


@dataclass(frozen=True, slots=True, eq=False)
class MixtureLengths:
    """Each request picks a component with probability proportional to its weight."""

    components: tuple[LengthSource, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.components or len(self.components) != len(self.weights):
            raise UserError("a mixture needs one weight per component and at least one component")
        if any(not 0 <= w < math.inf for w in self.weights) or not 0 < sum(self.weights) < math.inf:
            raise UserError(f"mixture weights must be finite and >= 0 with a positive sum, got {self.weights}")

    def sample(self, num_requests: int, rng: np.random.Generator) -> LengthTable:
        probs = np.asarray(self.weights, dtype=np.float64) / sum(self.weights)
        choice = rng.choice(len(self.components), size=num_requests, p=probs)
        prompt = np.empty(num_requests, dtype=np.int64)
        output = np.empty(num_requests, dtype=np.int64)
        texts: list[str | None] = [None] * num_requests
        has_text = False
        for k, component in enumerate(self.components):
            rows = np.flatnonzero(choice == k)
            part = component.sample(rows.size, rng)
            prompt[rows] = part.num_prompt_tokens
            output[rows] = part.num_output_tokens
            if part.prompt_texts is not None:
                has_text = True
                for row, text in zip(rows, part.prompt_texts):
                    texts[row] = text
        return LengthTable(prompt, output, tuple(texts) if has_text else None, "mix")


def alpaca_like() -> IndependentLengths:
    return IndependentLengths(LogNormal.from_mean(83, 0.6, 2048), LogNormal.from_mean(270, 0.8, 2048), name="alpaca")


def longbench_like(max_context_tokens: int = 4096) -> IndependentLengths:
    return IndependentLengths(LogNormal(7000, 0.9), LogNormal(64, 0.8, 512), max_context_tokens, name="longbench")


PRESETS: dict[str, Callable[[], LengthSource]] = {"alpaca": alpaca_like, "longbench": longbench_like}

LENGTH_DISTS: dict[str, tuple[type, int, int]] = {
    # name -> (class, min args, max args)
    "fixed": (Fixed, 1, 1),
    "uniform": (Uniform, 2, 2),
    "exp": (Exponential, 1, 2),
    "lognormal": (LogNormal, 2, 3),
}


def make_length_dist(name: str, args: Sequence[float]) -> LengthDist:
    """Build a dist from its spec name and positional numbers (integer fields are checked)."""
    if name not in LENGTH_DISTS:
        raise UserError(f"unknown length distribution {name!r}; valid: {sorted(LENGTH_DISTS)}")
    cls, lo, hi = LENGTH_DISTS[name]
    if not lo <= len(args) <= hi:
        arity = str(lo) if lo == hi else f"{lo}-{hi}"
        raise UserError(f"{name}() takes {arity} numbers, got {len(args)}")
    if not all(math.isfinite(a) for a in args):
        raise UserError(f"{name}() needs finite numbers, got {tuple(args)}")
    if cls in (Fixed, Uniform):
        return cls(*(_as_int(a, name) for a in args))
    fixed_args = list(args)
    if len(args) == hi:
        fixed_args[-1] = _as_int(args[-1], name)
    return cls(*fixed_args)


def _as_int(value: float, name: str) -> int:
    if not float(value).is_integer():
        raise UserError(f"{name}() needs whole token counts, got {value}")
    if abs(value) > MAX_TOKENS:
        raise UserError(f"{name}() token counts must be at most {MAX_TOKENS:,}, got {value:g}")
    return int(value)
