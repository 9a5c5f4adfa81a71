"""The README's Python snippets are complete programs: each runs as written (on CPU tensors, through
the interpreter) and checks its own result against torch, so a snippet that loses its body or
its model fails here, not in a new user's first five minutes."""
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_has_snippets():
    assert len(SNIPPETS) >= 3, "the README lost its lazy, eager or torch.compile example"


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs(index, tmp_path, monkeypatch):
    # a real file, so the frontend can read the kernel's source and quote its lines
    path = tmp_path / f"readme_snippet_{index}.py"
    path.write_text(SNIPPETS[index])
    monkeypatch.syspath_prepend(str(tmp_path))
    code = compile(SNIPPETS[index], str(path), "exec")
    exec(code, {"__name__": f"readme_snippet_{index}", "__file__": str(path)})
