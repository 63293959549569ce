"""A selftest run cut short (a device call's time limit) judged again from what its servers left:
each served row's outputs (``<row>.outputs.json``) against the target's float32 reference, and
its accept length (``runs.jsonl``) against the expected figure, with the selftest's own functions
(``command.reference``, ``acceptance.expected_accept``, ``judging.judge`` / ``accept_floor``).
On the CPU, any machine with the plugin and the release's sglang installed:

    python tests/gpu/rejudge.py LOGS_DIR TARGETS [SEEDS]    (e.g. ... gptoss,llama4 91,92,93)

One line per row: identical requests per seed, accept length, expected, the selftest's verdict."""

from __future__ import annotations

import glob
import json
import os
import sys
import tempfile

from sglang_swa_plugin.selftest import acceptance, command, judging, rows, targets


def _mode(target: str, key: str) -> str:
    """The row's mode from its log name ``<target>_<backend>_<mode>[_eager]..._<plugin|stock>``."""
    parts = key[len(target) + 1:].split("_")
    return next((m for m in sorted(rows.MODES, key=len, reverse=True) if f"_{m}_" in f"_{'_'.join(parts[1:])}_"), "plain")


def main(logs: str, names: str, seeds: str = "91,92,93") -> int:
    seeds_ = [int(s) for s in seeds.split(",")]
    runs = {r["name"]: r for r in map(json.loads, open(os.path.join(logs, "runs.jsonl")))}
    reqs, work, bad = command._requests(seeds_, command.PROTOCOL), tempfile.mkdtemp(), 0
    for name in names.split(","):
        t = targets.load(name)
        saved, model = t.save(os.path.join(work, name)), t.hf_model()
        ref = command.reference(t, seeds_, command.PROTOCOL, model)
        for f in sorted(glob.glob(os.path.join(logs, f"{name}_*.outputs.json"))):
            key = os.path.basename(f)[:-len(".outputs.json")]
            spec, accept = rows.MODES.get(_mode(name, key)), runs.get(key, {}).get("accept_length")
            judged = judging.judge({"state": judging.SERVED, "outputs": json.load(open(f)), "accept_length": accept},
                                   ref, command.PROTOCOL.requests)
            expected = spec and command._expectation(acceptance.expected_accept, t, spec, reqs, command.PROTOCOL.new_tokens,
                                                     ref, model=model, saved=tuple(saved[:2]))
            text, failed = judging.verdict(judged, key.endswith("_plugin"), row=runs.get(key),
                                           speculative=spec is not None, expected=expected)
            bad += bool(failed)
            seen = " ".join(f"{s['identical']}/{s['of']}" for s in judged["per_seed"])
            print(f"{key}: {seen}, accept {accept} expected {expected}: {text}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
