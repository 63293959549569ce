"""Command line: doctor, check and selftest."""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from . import __version__
from .check import check_report  # also used from Python
from .doctor import doctor_report
from .selftest import command as selftest  # its options; what it runs is imported when it runs

DESCRIPTION = (
    "sglang-swa-plugin: fixes for hybrid sliding-window-attention models with speculative "
    "decoding on sglang. 'doctor' tells what the plugin will do in this environment; 'check' "
    "runs each fix's CPU reproduction on the installed sglang without and with the plugin; "
    "'selftest' serves tiny models on this machine's GPU and checks every row's tokens against "
    "the model's."
)
JSON_HELP = "print the report as JSON (for scripts); the exit status is the same"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="sglang-swa-plugin", description=DESCRIPTION)
    ap.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{doctor,check,selftest}")
    d = sub.add_parser("doctor", help="sglang, loading, settings and per-fix status; exit 1 on any problem",
                       description="Show sglang, how the plugin loads, the settings and each fix's status. "
                                   "Exit status 1 when the plugin will not load, a setting is bad, or a "
                                   "selected fix that is needed cannot be installed.")
    d.add_argument("--json", action="store_true", help=JSON_HELP)
    c = sub.add_parser("check", help="each fix's CPU reproduction without and with the plugin",
                       description="For each fix, run its CPU scenario on the installed sglang's real "
                                   "classes without and with the plugin. Exit status 1 when a fix does "
                                   "not correct its scenario.")
    c.add_argument("--json", action="store_true", help=JSON_HELP)
    c.add_argument("--attention-tp", type=selftest._positive(int), default=1, metavar="N",
                   help="run the scenarios as rank 0 of N attention tensor-parallel ranks: each pool, layer and "
                        "backend holds one rank's heads (default 1). Scenarios built on sglang's model layers "
                        "run at 1 only")
    s = sub.add_parser("selftest", help="the GPU matrix: tiny models served per backend and mode, tokens "
                                        "against the model's; exit 1 on any wrong plugin row",
                       description=selftest.DESCRIPTION)
    selftest.add_arguments(s)
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    return ap


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    # On sglang without a plugin framework the start-up hook would apply every fix as soon
    # as a scenario imports sglang's model runner; doctor and check judge stock sglang.
    from . import _autoload

    _autoload.disarm()
    if args.cmd == "selftest":
        return selftest.main(args)
    from .check import print_check
    from .doctor import print_doctor

    if args.cmd == "doctor":
        rep, show = doctor_report(), print_doctor
    else:
        rep, show = check_report(args.attention_tp), print_check
    print(json.dumps(rep, indent=2)) if args.json else show(rep)
    return 0 if rep["ok"] else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
