"""scripts/engine_profile.py sorts py-spy stacks of the engine process into what a step spends."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "engine_profile.py"
spec = importlib.util.spec_from_file_location("engine_profile", SCRIPT)
engine_profile = importlib.util.module_from_spec(spec)
spec.loader.exec_module(engine_profile)

DRIVER = ("Thread.run (threading.py:982);ClusterDriver.serve (servelab/cluster/driver.py:185);"
          "Executor.execute (servelab/engine/executor.py:139);")
FORWARD = DRIVER + "ModelRunner.compute_logits (servelab/engine/runner.py:232);Model.forward (servelab/engine/model.py:197);"


def test_stacks_are_sorted_by_the_innermost_thing_they_do(tmp_path):
    raw = tmp_path / "engine.spy"
    raw.write_text("\n".join([
        FORWARD + "Attention.forward (servelab/engine/model.py:126);Linear.forward (servelab/engine/model.py:83) 7",
        FORWARD + "RaggedMetadata.attend (servelab/engine/attention.py:254);"
                  "split_kv_decode (servelab/engine/attention.py:200) 3",
        FORWARD + "RaggedMetadata.attend (servelab/engine/attention.py:254);"
                  "decode (servelab/engine/paged_decode.py:86) 5",  # the C kernel reading the cache in place
        FORWARD + "RMSNorm.forward (servelab/engine/model.py:99) 2",
        DRIVER + "ModelRunner._sample (servelab/engine/runner.py:270);Sampler.sample (servelab/engine/sampling.py:90) 1",
        DRIVER + "build_ragged (servelab/engine/runner.py:110) 1",
        "Thread.run (threading.py:982);_ChildService._serve (servelab/server/engine_process.py:102);"
        "Connection._recv (multiprocessing/connection.py:395) 4",
        "garbage line without a count",
    ]))
    counts = engine_profile.read_samples(raw)
    assert counts == {"model: projections": 7, "model: decode attention": 8,
                      "model: the rest (norms, RoPE, MLP activation, embedding, logits)": 2, "sampling": 1,
                      "batch building (input tensors, attention metadata)": 1,
                      "messages to and from the front end": 4}
    assert engine_profile.classify("main (x.py:1)") == "other"
