"""ops.LazyModule: a model module's kernel module, imported at its first use, and waited for while
another thread (the load's helper) is still executing it."""
import sys
import threading
import time

from ostinato.ops import LazyModule


def test_imported_at_the_first_lookup_and_waited_for_across_threads(tmp_path, monkeypatch):
    (tmp_path / "slow_kernels.py").write_text("import time\nFIRST = 1\ntime.sleep(0.6)\nLAST = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_kernels", raising=False)
    lazy = LazyModule("slow_kernels")
    assert "slow_kernels" not in sys.modules  # nothing imported yet
    helper = threading.Thread(target=__import__, args=("slow_kernels",))
    helper.start()
    deadline = time.monotonic() + 5
    while "slow_kernels" not in sys.modules and time.monotonic() < deadline:
        time.sleep(0.01)
    # the helper is mid-way through the module (FIRST defined, LAST not yet): the lookup waits for it
    assert lazy.LAST == 2 and lazy.FIRST == 1
    helper.join()
    monkeypatch.setattr(sys.modules["slow_kernels"], "LAST", 3)
    assert lazy.LAST == 3  # looked up in the module each time
