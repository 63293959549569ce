"""Test-side probe for tests/gpu/e2e_server.py (the small-pool rows of gptoss_exact), never
installed: which requests a server retracts, how their recomputation starts, and (with
RETRACT_PROBE_CHECK=1) whether any request's window reads an SWA slot it does not own.

Put on PYTHONPATH of a server: in its scheduler process, when sglang's schedule_batch module is
imported, ``ScheduleBatch.retract_decode`` / ``prepare_for_extend`` / ``prepare_for_decode`` are
wrapped; sglang's classes stay sglang's and every call goes on unchanged. Log lines (stderr, the
server's log), one per event, prefixed ``RETRACT_PROBE``:
  retract rid=.. out=N iter=I            a request retracted after N output tokens
  reprefill rid=.. out=N prefix=P fill=F a retracted request prefilled again, P tokens matched
  violation kind=untracked_cut rid=..    a request whose prefill this batch cuts short while the
                                         batch's chunked_req (the one the scheduler goes on
                                         prefilling) is another: the rest of it is never prefilled
  violation kind=.. rid=.. pos=.. ...    (CHECK) a window key whose full index has no SWA slot
                                         (mapping 0), or an SWA slot mapped from two live full
                                         indices, or a mapped SWA slot on the allocator's free list
The checks copy the index mapping to the host (a device sync per batch): for the test only."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from after_import import patch_after_import, run_next_sitecustomize  # tests/gpu/after_import.py

sys.path.pop(0)

_CHECK = os.environ.get("RETRACT_PROBE_CHECK") == "1"
_MAX_VIOLATIONS = 200  # lines per process; the first ones tell


def _log(msg: str) -> None:
    print(f"RETRACT_PROBE {msg}", file=sys.stderr, flush=True)


def _check(batch, phase: str) -> None:
    try:
        _check_batch(batch, phase)
    except Exception as e:  # noqa: BLE001 - the probe never stops the server it watches
        _check.count += 1
        _log(f"probe_error phase={phase} {type(e).__name__}: {e}")


def _check_batch(batch, phase: str) -> None:
    """Window keys of every request of ``batch`` (after its allocation) map to SWA slots, and
    no SWA slot is owned twice or also free."""
    import torch

    alloc = batch.token_to_kv_pool_allocator
    mapping = getattr(alloc, "full_to_swa_index_mapping", None)
    window = getattr(batch.tree_cache, "sliding_window_size", None)
    if mapping is None or not window or _check.count >= _MAX_VIOLATIONS:
        return
    m = mapping[:-1].cpu()
    live = m[m > 0]
    uniq, counts = torch.unique(live, return_counts=True)
    shared = uniq[counts > 1]
    swa = alloc.swa_attn_allocator
    free = torch.cat([swa.free_pages.cpu(), swa.release_pages.cpu()])
    on_free = uniq[torch.isin(uniq, free)]
    if shared.numel() or on_free.numel():
        _check.count += 1
        _log(f"violation kind=pool phase={phase} shared={shared[:8].tolist()} on_free={on_free[:8].tolist()}")
    seq = batch.seq_lens_cpu.tolist()
    table = batch.req_to_token_pool.req_to_token
    for i, req in enumerate(batch.reqs):
        # keys the next forward reads on a sliding layer (sglang's window: the query and the
        # ``window`` keys before it). decode: positions end-1-window .. end-1, the fed token
        # last; extend: the prefix's last ``window`` keys
        end = seq[i] if phase == "decode" else len(req.prefix_indices)
        lo = max(0, end - 1 - window if phase == "decode" else end - window)
        if end <= lo:
            continue
        full = table[req.req_pool_idx, lo:end].cpu().long()
        missing = (m[full] == 0).nonzero().flatten()
        if missing.numel():
            _check.count += 1
            _log(f"violation kind=unmapped phase={phase} rid={req.rid} out={len(req.output_ids)} "
                 f"pos={[lo + int(j) for j in missing[:8]]} end={end} retractions={req.retraction_count}")


_check.count = 0


def _patch(module):
    cls = module.ScheduleBatch
    retract, extend, decode = cls.retract_decode, cls.prepare_for_extend, cls.prepare_for_decode

    retracted = set()  # rids of this process's retracted requests (releases without retraction_count)

    def retract_decode(self, *args, **kwargs):
        out = retract(self, *args, **kwargs)
        for req in out[0]:
            retracted.add(req.rid)
            _log(f"retract rid={req.rid} out={len(req.output_ids)} iter={getattr(self, 'forward_iter', None)}")
        return out

    def prepare_for_extend(self, *args, **kwargs):
        out = extend(self, *args, **kwargs)
        for req in self.reqs:
            fill = getattr(req, "get_fill_ids", None)
            end, full = len(fill() if fill else req.fill_ids), len(req.origin_input_ids) + len(req.output_ids)
            if req.rid in retracted:
                _log(f"reprefill rid={req.rid} out={len(req.output_ids)} prefix={len(req.prefix_indices)} fill={end}")
            if end < full and req is not getattr(self, "chunked_req", None):
                _log(f"violation kind=untracked_cut rid={req.rid} out={len(req.output_ids)} end={end} full={full}")
        if _CHECK:
            _check(self, "extend")
        return out

    def prepare_for_decode(self, *args, **kwargs):
        out = decode(self, *args, **kwargs)
        if _CHECK:
            _check(self, "decode")
        return out

    cls.retract_decode, cls.prepare_for_extend, cls.prepare_for_decode = retract_decode, prepare_for_extend, prepare_for_decode
    _log(f"installed check={int(_CHECK)}")


patch_after_import({"sglang.srt.managers.schedule_batch": _patch})
run_next_sitecustomize(__file__)
