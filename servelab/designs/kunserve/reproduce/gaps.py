"""Two gap tests of the KunServe reproduction, each an experiment that could refute its reason.

- ``merge_rule``: at the 72B LongBench point (compute-bound), a formed group merging again
  (the paper's second drop) against the rule that merges it only while its steps leave compute
  to spare (``merge=spare``, the default), and against pairs only (``max_group_size=2``).
- ``vs_baselines``: at the faithful point, why vLLM-PP and InferCept reach a lower P99 TTFT
  than KunServe. Each candidate reason is switched off in one variant: the drop's cost (the KV
  exchange: a 10x faster link), restore (off), the trigger's timing (at 90% of the KV, or
  not charging the head the scheduler's watermark, the trigger before issue 24's fix), and
  where the dispatcher sends work after a drop (``dispatch=kv``: the lowest KV load instead of Llumnix's remaining steps, the default;
  ``dispatch=kv+compute``: while a group exists, units whose steps fill their budget only when
  no unit with compute and KV to spare is left). Each run also records when the first group formed, when
  the worst 1% of requests (by TTFT) arrived, and the token budget used by groups' and single
  instances' steps from the first drop to the last arrival.
  Three more variants test what the baselines do differently: KunServe pipelined from t=0
  (vLLM-PP's configuration with KunServe's former: is the gap the reactive drop or the
  pipelined steady state?) with KunServe's lookahead former, with vLLM-PP's token chunking and
  with whole rows (the former's share of it), the reactive KunServe with either former, vLLM-PP
  with a prompt never cut between microbatches (vLLM's
  virtual engines), and InferCept under the queue-first rule (``swapped_first=false``: new
  requests take the memory swapping freed; the default is vLLM v0's swapped-first rule). Every
  run's worst 1% are placed by the phase KunServe was in at their arrival (``waits``).
"""

from __future__ import annotations

import dataclasses
import functools

from servelab.designs.kunserve.reproduce import experiments as ex
from servelab.designs.kunserve.reproduce import setting as st
from servelab.designs.kunserve.reproduce import waits

# KunServe pairing every instance within seconds of the start (a trigger at 1% of the KV, pairs
# only, no restore): vLLM-PP's configuration with KunServe's former, so KunServe's pipelined
# steady state is compared with vLLM-PP's apart from the reactive drop
PIPELINED_T0 = "kunserve pipelined from t=0"
_T0 = "kunserve:trigger_share=0.01,max_group_size=2,restore=false"
# the same with vLLM-PP's microbatch former (token chunking) and with whole rows: if the steady
# state then matches vLLM-PP's (and vLLM-PP's with rows), the former alone separates them
T0_TOKENS = "kunserve pipelined from t=0, token chunking"
T0_ROWS = "kunserve pipelined from t=0, whole rows"
# vLLM-PP whose microbatches take whole rows: a prompt chunk never cut between two microbatches
# of one step, as in vLLM's virtual engines (a request belongs to one engine, one chunk a pass)
PP_ROWS = "vllm-pp, prompt not cut"
# InferCept under the queue-first rule (``swapped_first=false``, the stand-in's default before issue
# 24): new requests take the memory swapping freed, the swapped requests wait in host memory; the
# default is vLLM v0's rule (InferCept's base): no new request while swapped ones are away
IC_QUEUE = "infercept, queue first"
MERGE_SYSTEMS = {"vllm": "kunserve:drop=false", "kunserve (merge=spare)": "kunserve",
                 "merge=always": "kunserve:merge=always", "pairs only": "kunserve:max_group_size=2"}
GAP_SYSTEMS = {"vllm-pp": "vllm-pp", "infercept": "infercept", "kunserve": "kunserve",
               "restore off": "kunserve:restore=false", "trigger at 90% KV": "kunserve:trigger_share=0.9",
               "trigger without watermark": "kunserve:trigger_watermark=false",
               "dispatch kv": "kunserve:dispatch=kv", "dispatch kv+compute": "kunserve:dispatch=kv+compute",
               "former: token chunking": "kunserve:former=tokens", "former: whole rows": "kunserve:former=rows",
               PIPELINED_T0: _T0, T0_TOKENS: _T0 + ",former=tokens", T0_ROWS: _T0 + ",former=rows",
               PP_ROWS: "vllm-pp:former=rows", IC_QUEUE: "infercept:swapped_first=false"}
FAST_LINK = "10x link (exchange ~free)"


def merge_rule(over_seeds, rate: float, hw: st.Hardware, sizes: ex.Sizes) -> dict:
    out = over_seeds(MERGE_SYSTEMS, "longbench", rate, hw, sizes, sizes.duration_s, sizes.bursts)
    return {"rate": rate, "workload": "longbench", **out}


def vs_baselines(over_seeds, rate: float, hw: st.Hardware, sizes: ex.Sizes) -> dict:
    hook = functools.partial(waits.attach, ref="kunserve", bursts=sizes.bursts, horizon_s=sizes.duration_s)
    out = over_seeds(GAP_SYSTEMS, "decode-heavy", rate, hw, sizes, sizes.duration_s, sizes.bursts, hook=hook)
    fast = dataclasses.replace(hw, inter_gbps=10 * hw.inter_gbps)
    linked = over_seeds({FAST_LINK: "kunserve"}, "decode-heavy", rate, fast, sizes, sizes.duration_s, sizes.bursts)
    for s, extra in zip(out["seeds"], linked["seeds"]):
        s["runs"].update(extra["runs"])
    return {"rate": rate, "workload": "decode-heavy", "seeds": out["seeds"]}
