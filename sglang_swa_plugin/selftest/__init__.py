"""``sglang-swa-plugin selftest``: the check side's GPU conformance matrix, for an operator to
run on their own GPU before deploying. It builds tiny targets whose sliding-window (or chunked)
layers decide their greedy tokens (``targets``), serves them with real sglang servers, one per
backend and speculative mode (``rows``, ``server``), and judges every row against
transformers' float32 output of the same weights (``judging``); ``command`` prints the matrix.

Like ``sglang_swa_plugin.check``, nothing here is ever imported by a server: ``register()``
and the fixes' hooks import none of it (tests/test_runtime_split.py)."""
