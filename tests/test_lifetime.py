"""The command line and the API service leave what they loaded to the process's end (no garbage collection walks it),
and hand it back to the collector at exit where Triton is loaded, whose bindings would report every object still
alive then as a leak."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Each reports at exit, after the entry point's own exit handlers, whether the collector was frozen; the service also
# once it is set up: it serves with the collector frozen whatever is loaded (a full collection would hold every
# request for ~0.2 s).
COMMAND = "from lm_tuner.tuner.cli.app import main\nsys.argv = ['tuner', '--version']\nmain()\n"
SERVICE = (
    "from lm_tuner.api.app import create_app\n"
    "from lm_tuner.tuner.settings import Settings\n"
    "create_app(Settings.from_options(sys.argv[1], sys.argv[2]))\n"
    "print('serving frozen', gc.get_freeze_count() > 0)\n"
)


@pytest.mark.parametrize("triton_loaded", [False, True])
@pytest.mark.parametrize("entry", [COMMAND, SERVICE], ids=["command", "service"])
def test_loaded_objects_are_frozen_and_given_back_at_exit_where_triton_is_loaded(tmp_path, entry, triton_loaded):
    # In a process of its own: this test's process may have loaded Triton already.
    if triton_loaded:
        pytest.importorskip("triton")
    program = (
        "import atexit, gc, sys\n"
        + ("import triton\n" if triton_loaded else "")
        + "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"
        + entry
    )
    result = subprocess.run([sys.executable, "-c", program, f"sqlite:///{tmp_path / 'tuner.db'}",
                             str(tmp_path / "artifacts")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("serving frozen True\n" if entry is SERVICE else "lm-tuner ")
    assert result.stdout.splitlines()[-1] == f"frozen {not triton_loaded}"  # given back at exit where Triton is
    assert "leaked" not in result.stderr
