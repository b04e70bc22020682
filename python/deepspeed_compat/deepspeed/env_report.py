"""`ds_report`: zerostream's environment report (`zerostream report`), headed by this
package's version. DeepSpeed's flags are accepted; zerostream builds no ops at run time, so
there is no operator table to hide."""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional


def parse_arguments(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ds_report", description=__doc__)
    parser.add_argument("--hide_operator_status", action="store_true")
    parser.add_argument("--hide_errors_and_warnings", action="store_true")
    parser.add_argument("--path", help="directory whose O_DIRECT support to probe (nvme_path)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_arguments(argv)
    import deepspeed
    from zerostream import report

    if not args.json:
        here = os.path.dirname(os.path.abspath(deepspeed.__file__))
        print(f"deepspeed {deepspeed.__version__} (zerostream's compatibility package) at {here}")
    return report.run(argparse.Namespace(path=args.path, json=args.json))


def cli_main() -> None:
    sys.exit(main())
