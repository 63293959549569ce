"""Test-side probe for tests/gpu/e2e_server.py (scenario gptoss_exact, TRITON_WINDOW_PROBE=1),
never installed: does triton give the model's tokens once its sliding-window KV buffer keeps
one key more? In every process of a server that has this folder on PYTHONPATH, when sglang's
triton backend module is imported, its two window-buffer builders get ``sliding_window_size
+ 1`` (decode kept ``min(seq_len, sliding_window_size)`` keys; the extend kernel's own mask,
``q - k <= sliding_window_size``, is left as it is and masks the one extra prefix key), and the
CUDA-graph window-index buffer is sized for the extra key per token."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from after_import import patch_after_import, run_next_sitecustomize  # tests/gpu/after_import.py

sys.path.pop(0)

_NAME = "sglang.srt.layers.attention.triton_backend"


def _patch(module):
    for fn_name, pos in (("update_sliding_window_buffer", 2), ("update_sliding_window_buffer_cuda_graph", 3)):
        original = getattr(module, fn_name, None)
        if original is None:
            continue

        def wider(*args, _original=original, _pos=pos, **kwargs):
            if "sliding_window_size" in kwargs:
                kwargs["sliding_window_size"] = kwargs["sliding_window_size"] + 1
            else:
                args = list(args)
                args[_pos] = args[_pos] + 1
            return _original(*args, **kwargs)

        setattr(module, fn_name, wider)
    cls = module.TritonAttnBackend
    init_state = cls.init_cuda_graph_state

    def init_cuda_graph_state(self, *args, **kwargs):
        out = init_state(self, *args, **kwargs)
        buf, sws = getattr(self, "cuda_graph_window_kv_indices", None), getattr(self, "sliding_window_size", None)
        if buf is not None and sws and sws > 0 and buf.numel() % sws == 0:
            self.cuda_graph_window_kv_indices = buf.new_zeros(buf.numel() // sws * (sws + 1))
        return out

    cls.init_cuda_graph_state = init_cuda_graph_state
    print("triton_window_probe: window buffers keep sliding_window_size + 1 keys", file=sys.stderr, flush=True)


patch_after_import({_NAME: _patch})
run_next_sitecustomize(__file__)
