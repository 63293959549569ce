"""Test-side recorder for tests/gpu/e2e_server.py (scenario trtllm_eagle_accept), never installed.

Put on PYTHONPATH of a server with SWA_E2E_RECORD=<file>: in every process of that server,
when sglang's EAGLE worker module is imported, its ``verify`` is wrapped so that each call
first appends the draft tokens it is about to verify (one list per request) and, per request,
how many of its tokens have an SWA-pool index different from their full-pool index (where
that count is 0, reading the wrong index space changes nothing) to the file, a JSON line.
sglang's classes are not replaced; the call goes on unchanged. Costs one device sync per
verify step, for the test only."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from after_import import patch_after_import, run_next_sitecustomize  # tests/gpu/after_import.py

sys.path.pop(0)

_PATH = os.environ.get("SWA_E2E_RECORD")
# module -> (class, how verify receives the EagleVerifyInput)
_TARGETS = {
    "sglang.srt.speculative.eagle_worker": ("EAGLEWorker", lambda args: args[1]),        # verify(batch, spec_info)
    "sglang.srt.speculative.eagle_worker_v2": ("EAGLEWorkerV2", lambda args: args[0].spec_info),  # verify(batch)
}


def _patch(module, cls_name, spec_info_of):
    cls = getattr(module, cls_name, None)
    if cls is None or not hasattr(cls, "verify"):
        return
    verify = cls.verify

    def recorded_verify(self, *args, **kwargs):
        spec_info = spec_info_of(args)
        tokens = spec_info.draft_token
        if tokens is not None and tokens.numel():
            per_req = tokens.view(-1, int(spec_info.draft_token_num)).tolist()
            with open(_PATH, "a") as f:
                f.write(json.dumps({"tokens": per_req, "swa_index_differs": _spaces_differ(self, args[0])}) + "\n")
        return verify(self, *args, **kwargs)

    cls.verify = recorded_verify


def _spaces_differ(worker, batch):
    try:
        runner = worker.target_worker.model_runner
        mapping = getattr(runner.token_to_kv_pool_allocator, "full_to_swa_index_mapping", None)
        if mapping is None:
            return None
        rows = runner.req_to_token_pool.req_to_token[batch.req_pool_indices.long()]
        return [int((mapping[rows[i, :n].long()] != rows[i, :n]).sum()) for i, n in enumerate(batch.seq_lens.tolist())]
    except Exception as e:  # noqa: BLE001 - a diagnostic only
        return repr(e)


if _PATH:
    patch_after_import({name: (lambda module, _t=target: _patch(module, *_t)) for name, target in _TARGETS.items()})
run_next_sitecustomize(__file__)
