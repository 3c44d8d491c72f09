"""The README's Python example runs and says what the README says it does."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    scope: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), scope)
    assert scope["eps_high"].tolist() == pytest.approx([0.28] + [0.2] * 7)
    assert scope["logp"].grad is not None


def test_quick_start_is_two_commands_and_ci_runs_the_test_one():
    text = README.read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = [
        ln.split("#")[0].strip()
        for ln in re.findall(r"```bash\n(.*?)```", section, flags=re.S)[0].splitlines()
        if ln.strip()
    ]
    assert commands == ["./run demo", "./run test"]
    ci = (README.parent / ".ci" / "run").read_text()
    assert "exec ./run test" in ci


def test_readme_stays_short_and_points_to_what_is_elsewhere():
    # a newcomer reads the quick start within a screen or two; the reference lives in docs/
    text = README.read_text()
    assert len(text.splitlines()) <= 160, f"README.md has {len(text.splitlines())} lines (at most 160)"
    for doc in ("docs/design.md", "docs/config.md", "docs/run-folders.md", "docs/real-models.md", "CHANGELOG.md"):
        assert f"]({doc})" in text, doc
    assert "src/gapo/rl/config.py" not in text  # the keys: gapo config and docs/config.md, not the source
