"""GPU probe of issue #28 item 5 (not a fix; loaded only where this folder is on PYTHONPATH,
through its dist-info's entry point, as a third party's fix would be): MiMo-V2 multi-layer EAGLE
on triton with CUDA graphs off, sglang 0.5.11, illegal memory access. ITEM5_PROBE picks one:
- ``e1``: after each ``Scheduler.run_batch`` the schedule stream waits for the forward stream
  (0.5.17's write-after-read barrier, #26380/#31687): serves -> the next batch's scheduling
  overwrote what the previous batch's queued draft work still read;
- ``e1b``: the host waits for the device at the end of each multi-layer EAGLE
  ``forward_batch_generation`` (serves while e1 does not -> a host-side race);
- ``e2``: the host waits for the device after the step's multi-step draft and after its target
  verify, and logs ``ITEM5_CHECKPOINT <phase>`` where that wait raises: the first phase whose
  work faulted;
- ``e3``: at each eager draft extend's (DRAFT_EXTEND_V2) metadata on triton, the host waits for
  the device and compares the batch's host lengths (``extend_prefix_lens_cpu``, ``seq_lens_cpu``,
  which size sglang's index buffers) with the device ones the kernels index by, logging
  ``ITEM5_LENS`` where they differ; ``e4``: the same, and the host lengths set from the device
  ones before sglang builds the metadata; ``e5``: inside that metadata build, each launch of
  ``create_flashinfer_kv_indices_triton`` waited for and, where the wait raises, logged
  (``ITEM5_KERNEL``) with its arguments' sizes; ``e6``: before that metadata build, the first
  entries of the backend's ``*indptr`` buffers (which sglang's draft-extend branch never writes)
  set to 0, and logged once where they were not (``ITEM5_INDPTR``); ``a``: around each
  ``_draft_extend_for_prefill`` (the copy into ``req_to_hidden_states_pool``), the first entries
  of the draft-extend backend's ``*indptr`` buffers read before and after, with their distance
  from the pool's end and the batch's largest request slot against the pool's rows, logged
  (``ITEM5_POOL``) where a slot has no row or an entry changed (the row past the pool lands
  there: the writer confirmed); the scenario runs it with ``mle_hidden_pool`` off (row ``a``)
  and on (row ``afix``). Beside item 5, ``nodext``: the EAGLE draft-extend CUDA graph refused
  (``EAGLEDraftExtendCudaGraphRunner.can_run`` False: that step runs eagerly; scenario
  ``tree_accept``)."""

import os

from sglang_swa_plugin.fix import Detection, Fix, around, hookimpl

PROBE = os.environ.get("ITEM5_PROBE", "")
RUN_BATCH = "sglang.srt.managers.scheduler.Scheduler.run_batch"
MLE_MODULE = "sglang.srt.speculative.multi_layer_eagle_worker_v2"
MLE = MLE_MODULE + ".MultiLayerEagleWorkerV2.forward_batch_generation"
DRAFT, VERIFY = MLE_MODULE + ".MultiLayerEagleDraftWorker.draft", MLE_MODULE + ".MultiLayerEagleWorkerV2.verify"


def _fence(original, self, *args, **kwargs):
    out = original(self, *args, **kwargs)
    schedule, forward = getattr(self, "schedule_stream", None), getattr(self, "forward_stream", None)
    if schedule is not None and forward is not None:
        schedule.wait_stream(forward)
    return out


def _wait(line: str) -> None:
    """The host waits for the device; ``line`` is printed where the wait raises (a fault)."""
    import torch

    try:
        torch.cuda.current_stream().synchronize()
    except Exception:
        print(line, flush=True)
        raise


def _sync(original, self, *args, **kwargs):
    out = original(self, *args, **kwargs)
    _wait("ITEM5_CHECKPOINT after a step: the device faulted")
    return out


def _checkpoint(phase):
    def hook(original, self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        _wait(f"ITEM5_CHECKPOINT after {phase}: the device faulted")
        return out

    return hook


TRITON_INIT = "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.init_forward_metadata"
SEEN = {"lines": 0}


def _lens(mend):
    def hook(original, self, forward_batch, *args, **kwargs):
        if forward_batch.forward_mode.is_draft_extend_v2():
            _wait("ITEM5_CHECKPOINT before the draft extend's metadata: the device faulted")
            dev_prefix = forward_batch.extend_prefix_lens.tolist()
            dev_seq = forward_batch.seq_lens.tolist()
            seq_cpu = forward_batch.seq_lens_cpu
            host_prefix, host_seq = list(forward_batch.extend_prefix_lens_cpu), (seq_cpu.tolist() if seq_cpu is not None else dev_seq)
            if (dev_prefix != host_prefix or dev_seq != host_seq) and SEEN["lines"] < 8:
                SEEN["lines"] += 1
                print(f"ITEM5_LENS bs={len(dev_seq)} prefix host-device {sum(host_prefix) - sum(dev_prefix)} "
                      f"seq host-device {sum(host_seq) - sum(dev_seq)} host_prefix={host_prefix[:6]} "
                      f"dev_prefix={dev_prefix[:6]} host_seq={host_seq[:6]} dev_seq={dev_seq[:6]}", flush=True)
            if mend:
                forward_batch.extend_prefix_lens_cpu = dev_prefix
                forward_batch.seq_lens_cpu = forward_batch.seq_lens.cpu()
                forward_batch.seq_lens_sum = int(sum(dev_seq))
        return original(self, forward_batch, *args, **kwargs)

    return hook


class _SyncedKernel:
    """A Triton kernel whose launches (``kernel[grid](...)``) are each waited for."""

    def __init__(self, kernel, name):
        self.kernel, self.name = kernel, name

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            import torch

            def desc(a):
                if isinstance(a, torch.Tensor):
                    small = a.numel() <= 8 and a.dtype != torch.bool
                    return f"{tuple(a.shape)}{':' + str(a.tolist()) if small else ''}"
                return repr(a)

            sizes = [desc(a) for a in args]
            out = launch(*args, **kwargs)
            _wait(f"ITEM5_KERNEL {self.name} grid={grid} faulted; args {sizes}")
            return out

        return run


def _synced_kernels(original, self, forward_batch, *args, **kwargs):
    import sys

    mod = sys.modules[type(self).__module__]
    name = "create_flashinfer_kv_indices_triton"
    if not forward_batch.forward_mode.is_draft_extend_v2() or not hasattr(mod, name):
        return original(self, forward_batch, *args, **kwargs)
    kernel = getattr(mod, name)
    setattr(mod, name, _SyncedKernel(kernel, name))
    try:
        return original(self, forward_batch, *args, **kwargs)
    finally:
        setattr(mod, name, kernel)


def _zero_first(original, self, forward_batch, *args, **kwargs):
    if forward_batch.forward_mode.is_draft_extend_v2():
        import torch

        names = [n for n, v in vars(self).items() if n.endswith("indptr") and isinstance(v, torch.Tensor)]
        for name in names:
            buf = getattr(self, name, None)
            if buf is not None and buf.numel():
                if SEEN["lines"] < 8 and int(buf[0]) != 0:
                    SEEN["lines"] += 1
                    print(f"ITEM5_INDPTR {name}[0] = {int(buf[0])} before a draft extend; set to 0", flush=True)
                buf[:1].zero_()
    return original(self, forward_batch, *args, **kwargs)


PREFILL = MLE_MODULE + ".MultiLayerEagleDraftWorker._draft_extend_for_prefill"


def _pool_neighbours(original, self, batch, *args, **kwargs):
    import torch

    pool = self.req_to_hidden_states_pool
    backend = self.draft_runner_list[0].attn_backend
    end = pool.data_ptr() + pool.numel() * pool.element_size()
    bufs = {n: v for n, v in vars(backend).items() if n.endswith("indptr") and isinstance(v, torch.Tensor) and v.numel()}
    top = int(batch.req_pool_indices.max()) if batch.req_pool_indices.numel() else -1
    before = {n: int(v[0]) for n, v in bufs.items()}
    if SEEN["lines"] == 0:
        SEEN["lines"] += 1
        print(f"ITEM5_POOL layout: pool {tuple(pool.shape)} {pool.dtype}, row {pool[0].numel() * pool.element_size()} B; "
              f"buffers' distance from the pool's end (B): {({n: v.data_ptr() - end for n, v in bufs.items()})}", flush=True)
    out = original(self, batch, *args, **kwargs)
    _wait("ITEM5_POOL the copy into the pool faulted")
    after = {n: int(v[0]) for n, v in bufs.items()}
    if (top >= pool.shape[0] or after != before) and SEEN["lines"] < 12:
        SEEN["lines"] += 1
        print(f"ITEM5_POOL largest slot {top} of {pool.shape[0]} rows ({'NO ROW' if top >= pool.shape[0] else 'has a row'}); "
              f"first entries before {before} after {after}", flush=True)
    return out


DRAFT_EXTEND_GRAPH = "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner.EAGLEDraftExtendCudaGraphRunner.can_run"


def _refuse(original, self, *args, **kwargs):
    return False


class Item5Probe(Fix):
    name = "item5_probe"
    summary = "issue #28 item 5 probe (ITEM5_PROBE=e1|e1b|e2|e3|e4|e5|e6|a|nodext)"
    targets = (RUN_BATCH, MLE, DRAFT, VERIFY, TRITON_INIT, PREFILL, DRAFT_EXTEND_GRAPH)

    def detect(self) -> Detection:
        if PROBE == "e1":
            return Detection.needed("probe e1: schedule stream waits for the forward stream", around(RUN_BATCH, _fence))
        if PROBE == "e1b":
            return Detection.needed("probe e1b: host sync after each MLE forward", around(MLE, _sync))
        if PROBE == "e2":
            return Detection.needed("probe e2: host syncs after the draft and the verify",
                                    around(DRAFT, _checkpoint("draft")), around(VERIFY, _checkpoint("verify")))
        if PROBE in ("e3", "e4"):
            return Detection.needed(f"probe {PROBE}: draft-extend host/device lengths", around(TRITON_INIT, _lens(PROBE == "e4")))
        if PROBE == "e6":
            return Detection.needed("probe e6: the indptr buffers start at 0", around(TRITON_INIT, _zero_first))
        if PROBE == "e5":
            return Detection.needed("probe e5: the draft extend metadata's kernels waited for", around(TRITON_INIT, _synced_kernels))
        if PROBE == "a":
            return Detection.needed("probe a: the draft-extend backend's first entries around the pool's copy",
                                    around(PREFILL, _pool_neighbours))
        if PROBE == "nodext":
            return Detection.needed("probe nodext: the EAGLE draft-extend CUDA graph refused", around(DRAFT_EXTEND_GRAPH, _refuse))
        return Detection.not_needed("ITEM5_PROBE unset")


@hookimpl
def sglang_swa_plugin_fixes():
    return [Item5Probe()]
