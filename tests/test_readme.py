"""The README's commands run as printed."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

from conftest import ROOT


def readme_tool_commands() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            if line.startswith("python3 scripts/"):
                cmds.append(shlex.split(line))
    return cmds


def test_readme_shows_the_main_job_and_the_test_command():
    text = (ROOT / "README.md").read_text()
    assert "python3 scripts/plan.py\n" in text
    assert "bash tests/run_all.sh" in text
    assert "bash tests/run_all.sh" in (ROOT / ".ci" / "run").read_text()
    assert len(readme_tool_commands()) >= 4


def test_every_readme_tool_command_exits_0():
    for argv in readme_tool_commands():
        proc = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=300)
        assert proc.returncode == 0, (argv, proc.stdout[-2000:], proc.stderr[-2000:])
        assert proc.stdout.strip(), argv


def test_pip_console_script_runs_the_same_tools():
    """`pip install -e .` (what tests/run_all.sh does) provides `mbridge-recompute`."""
    from pathlib import Path

    exe = Path(sys.executable).parent / "mbridge-recompute"
    assert exe.exists(), "install the package (pip install -e .) into this interpreter's environment"
    proc = subprocess.run([str(exe), "config", "--modules", "moe_act", "--format", "overrides"],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "model.recompute_modules=[moe_act]" in proc.stdout
