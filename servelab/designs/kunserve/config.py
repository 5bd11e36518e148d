"""KunServe's configuration: what the router and its preset accept, validated on construction.

One place for every knob of the design (drop, trigger, dispatch, microbatches, exchange,
restore, escalation) with the reason for each default beside it; ``router`` reads it, the
``kunserve`` preset validates user parameters against its fields.
"""

from __future__ import annotations

from dataclasses import dataclass

FORMERS = ("lookahead", "tokens", "rows")


@dataclass(frozen=True)
class KunServeConfig:
    drop: bool = True  # False: the dispatcher alone (the ablation's baseline)
    num_microbatches: int = 0  # 0: as many as the group has stages (vLLM's virtual engines)
    former: str = "lookahead"  # lookahead | tokens (token-count chunking) | rows (whole rows dealt)
    lookahead_scope: str = "queue"  # queue: a step takes its share of the whole queue's cost | step: the budget
    # the lookahead's MIN, tokens (Fig. 11: a part of at most MIN tokens is not cut; the paper gives no value)
    lookahead_min_tokens: int = 32
    # a step of at least as many rows as stages is cut into one microbatch per stage whatever MIN says: the
    # paper's MIN applies to the whole queued batch, and a step its lookahead does not cover (a decode step)
    # runs as its vLLM pipeline does, one microbatch per virtual engine. The default since the gap_min
    # step (M1 holds: at LongBench lengths pipelined from t=0 lookahead's bubble 30.3% -> 5.8%). False:
    # MIN per step, the rule before it, kept as the named variant gap_min compares against (a decode
    # step of <= MIN rows runs as one microbatch, on one stage at a time)
    stage_floor: bool = True
    coordinated: bool = True  # KV exchange and restores in stage-time chunks (False: one bulk job)
    restore: bool = True
    restore_threshold: float = 0.5  # of the members' KV without the drop
    restore_poll_s: float = 0.05  # a group idle while its restore copy runs checks for the landing this often
    headroom: float = 1.0  # the need R is multiplied by this
    # throttled: head-of-line demand over this share of the KV (1.0: the head cannot be admitted;
    # lower: an earlier trigger, a gap test of the trigger's timing)
    trigger_share: float = 1.0
    # the head is charged the watermark vLLM's scheduler keeps free when admitting (True: the trigger
    # reads "the head cannot be admitted"; False: it fires only once the head exceeds the whole KV, up
    # to 1 s later per unit at the faithful point, while the head already waits for memory)
    trigger_watermark: bool = True
    # freeness: the most remaining steps (Llumnix's dispatch metric, the paper's dispatcher) | kv: the
    # least KV-loaded unit | kv+compute: a gap test, while a group exists, units whose steps fill their
    # budget only when no unit with compute and KV to spare is left
    dispatch: str = "freeness"
    # a unit planned into a group is left out of further plans for this long (its form waits for the
    # members' steps); a plan that formed nothing holds further attempts off as long. Not global: a
    # global hold-off kept units throttled after the first drop waiting up to 1 s for theirs
    cooldown_s: float = 1.0
    max_group_size: int = 0  # 0: up to the model's layers
    # when a formed group merges again (the second drop): spare = only while its steps leave
    # compute to spare (step tokens under merge_utilization of its budget), always = whenever throttled
    merge: str = "spare"
    merge_utilization: float = 0.9
    autoscale_after_s: float = 30.0
    sample_s: float = 0.5  # memory timeline resolution
    token_budget: int = 512  # the instances' step budget (sizes the exchange chunks)
    overlap: bool = True  # a group's consecutive steps overlap (False: each fills and drains the pipeline)

    def __post_init__(self) -> None:
        if self.former not in FORMERS:
            raise ValueError(f"former must be one of {FORMERS}, got {self.former!r}")
        if self.merge not in ("spare", "always") or not 0 < self.merge_utilization <= 1:
            raise ValueError(f"merge must be spare or always and merge_utilization in (0, 1], got {self.merge!r}, "
                             f"{self.merge_utilization}")
        if self.dispatch not in ("freeness", "kv", "kv+compute"):
            raise ValueError(f"dispatch must be freeness, kv or kv+compute, got {self.dispatch!r}")
        if self.lookahead_scope not in ("queue", "step"):
            raise ValueError(f"lookahead_scope must be queue or step, got {self.lookahead_scope!r}")
        if self.num_microbatches < 0 or self.token_budget < 1 or self.max_group_size < 0 \
                or self.lookahead_min_tokens < 1:
            raise ValueError("num_microbatches must be >= 0, token_budget >= 1, max_group_size >= 0, "
                             "lookahead_min_tokens >= 1")
        if not 0 < self.trigger_share <= 1:
            raise ValueError(f"trigger_share must be in (0, 1], got {self.trigger_share}")
        if not 0 < self.restore_threshold <= 1 or self.headroom <= 0 or self.cooldown_s < 0 \
                or min(self.sample_s, self.restore_poll_s) <= 0:
            raise ValueError("restore_threshold in (0, 1], headroom > 0, cooldown_s >= 0, sample_s and restore_poll_s > 0")
