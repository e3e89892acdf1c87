"""``make demo``'s torch (scripts/install_torch.py): the test pin, a torch already there kept, the CPU index probed."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from modelkv_testbed import ROOT
from modelkv_testbed.processes import free_port
from scripts.install_torch import index_answers


def test_the_demo_installs_the_torch_the_tests_run() -> None:
    makefile = re.search(r"^TORCH_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    pin = re.search(r"^torch==(\S+)$", (ROOT / "requirements" / "test.txt").read_text(), re.M)
    assert makefile and pin and makefile[1] == pin[1]


def test_a_torch_already_installed_is_kept() -> None:
    """This environment has torch: nothing is asked of pip or of any index (an address nothing answers is given)."""
    unanswered = f"http://127.0.0.1:{free_port()}/whl/cpu"
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "install_torch.py"), "0.0.1", unanswered],
        capture_output=True,
        text=True,
        timeout=60,
    )
    import torch

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"make demo: keeping the torch already installed here ({torch.__version__})\n"


@contextmanager
def index(status: int) -> Iterator[str]:
    """A package index on 127.0.0.1 whose every page answers ``status``."""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.end_headers()
            self.wfile.write(b"<a href='torch-2.13.0+cpu.whl'>torch</a>")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    finally:
        server.shutdown()
        server.server_close()


def test_the_cpu_index_is_used_only_when_its_torch_page_answers() -> None:
    with index(200) as answering:
        assert index_answers(answering) is None
    with index(404) as missing:
        assert "Not Found" in str(index_answers(missing))
    assert "refused" in str(index_answers(f"http://127.0.0.1:{free_port()}/whl/cpu")).lower()
