"""`TRITILE_HYPOTHESIS_SCALE` (tests/conftest.py) multiplies the examples of every hypothesis test,
including those that pin `max_examples` with `@settings`."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

PROBE = '''
from hypothesis import given, settings, strategies as st
drawn = []

@settings(max_examples=4, deadline=None, database=None)
@given(st.integers())
def test_draws(x):
    drawn.append(x)

def test_count_of_the_previous_test():
    assert len(drawn) == {expected}, len(drawn)
'''


def _run_probe(tmp_path: Path, scale: str, expected: int) -> subprocess.CompletedProcess:
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_probe.py").write_text(PROBE.format(expected=expected))
    env = dict(os.environ, TRITILE_HYPOTHESIS_SCALE=scale)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_scale_multiplies_pinned_examples(tmp_path):
    result = _run_probe(tmp_path, "3", expected=12)
    assert result.returncode == 0, result.stdout + result.stderr


def test_default_scale_keeps_the_count(tmp_path):
    result = _run_probe(tmp_path, "1", expected=4)
    assert result.returncode == 0, result.stdout + result.stderr
