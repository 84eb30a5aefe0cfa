"""What `python -m <module> <arguments>` says when it refuses them, run in this process: a subprocess would
pay an interpreter and torch start-up (seconds) for a check that ends before any work."""

import runpy
import sys
import warnings
from unittest import mock

import pytest


def exit_message(module: str, *argv: str) -> str:
    """The message `module`'s __main__ exits with (sys.exit("...")), given these command-line arguments."""
    with mock.patch.object(sys, "argv", [module, *argv]), pytest.raises(SystemExit) as e, warnings.catch_warnings():
        # runpy notes that the module is imported already (a test imported it): its code runs again as
        # __main__ in a namespace of its own, which is what this wants
        warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
        runpy.run_module(module, run_name="__main__", alter_sys=False)
    return str(e.value.code)
