"""The examples in examples/ run end to end (on CPU: through the reference interpreter) and
pass their own checks against torch."""
import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("name", ["gemm", "flash_attention"])
def test_example_main(name, capsys):
    spec = importlib.util.spec_from_file_location(f"tritile_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main()
    assert "max |tritile - torch|" in capsys.readouterr().out
