"""The multi-step draft decode of ``test_triton_swa_draft_steps`` where sglang builds the draft
steps' window rail itself (0.5.23+: its Triton kernels, no CPU twin), under Triton's interpreter
(run with ``TRITON_INTERPRET=1``; harness: tests/interpreted.py), with the fixes a server
installs: per phase (eager, capture, replay) one JSON line, the wrong things seen ([] where each
step reads the target's window and writes its own slot)."""

from __future__ import annotations

import json

import test_triton_swa_draft_steps as steps


def main() -> None:
    with steps.served() as installed:
        for phase in steps.PHASES:
            env, got, prefixes, keys_of = steps._run(phase)
            wrong = steps._judge(env, got, prefixes, keys_of, writes=phase != "capture")
            print(json.dumps({"phase": phase, "installed": [f.name for f in installed], "wrong": wrong}))


if __name__ == "__main__":
    main()
