"""Instruction counts of labelled regions: a bench script runs itself again under callgrind and marks its regions.

The parent calls ``region_totals(module)``; it compiles a six-line C helper against valgrind's
``callgrind.h`` and runs ``python -m MODULE --child LIBRARY`` from the repository root under callgrind
with instrumentation off. The child loads the helper with ``load_helper``, starts instrumentation once, then zeroes the counters
before each region and dumps them after it under the region's label. Written by hand because no
Python library exposes callgrind's client requests.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HELPER = r"""
#include <valgrind/callgrind.h>
void mkv_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void mkv_zero(void) { CALLGRIND_ZERO_STATS; }
void mkv_dump(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
"""
ROOT = Path(__file__).resolve().parent.parent
HEADER = Path("/usr/include/valgrind/callgrind.h")


def load_helper(library: str) -> ctypes.CDLL:
    """The child's handle on the helper: ``mkv_start()``, ``mkv_zero()``, ``mkv_dump(label: bytes)``."""
    helper = ctypes.CDLL(library)
    helper.mkv_dump.argtypes = [ctypes.c_char_p]
    return helper


def region_totals(module: str) -> dict[str, int] | str:
    """Every region the child ``python -m module`` dumped: its label and its instructions; a sentence when callgrind cannot run."""
    compiler = shutil.which("cc")
    if shutil.which("valgrind") is None or compiler is None or not HEADER.exists():
        return "valgrind, its headers and a C compiler are needed for instruction counts"
    with tempfile.TemporaryDirectory(prefix="modelkv-callgrind-") as work:
        library, source = Path(work) / "libregion.so", Path(work) / "region.c"
        source.write_text(HELPER)
        subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(source)], check=True)
        command = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={work}/callgrind.out.%p",
            sys.executable,
            "-m",
            module,
            "--child",
            str(library),
        ]
        child = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
        if child.returncode != 0:
            raise SystemExit(child.stderr[-4000:])
        totals: dict[str, int] = {}
        for path in Path(work).glob("callgrind.out.*"):
            text = path.read_text(errors="replace")
            label = re.search(r"^desc: Trigger: Client Request: (.*)$", text, re.M)
            total = re.search(r"^(?:totals|summary): (\d+)", text, re.M)
            if label and total:
                totals[label.group(1)] = int(total.group(1))
    return totals
