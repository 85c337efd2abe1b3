"""Installing the skill with the real npm `skills` CLI, as a user would, offline.

Source: a `file://` git clone of the committed HEAD (so only committed files count,
as from a real git URL). Target: a temporary HOME and project. The CLI is taken from
$MBR_SKILLS_CLI, else `.tools/node_modules/.bin/skills` (tests/run_all.sh installs
it), else `npx --yes skills@1.5.18` (the last release that runs on Node 20). The only
reason to skip is a machine without node/npm.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SCRIPT_OF

NAME = "mbridge-activation-recompute"


def skills_cli() -> list[str]:
    if os.environ.get("MBR_SKILLS_CLI"):
        return shlex.split(os.environ["MBR_SKILLS_CLI"])
    local = ROOT / ".tools" / "node_modules" / ".bin" / "skills"
    if local.exists():
        return [str(local)]
    if shutil.which("npx"):
        return ["npx", "--yes", "skills@1.5.18"]
    return []


CLI = skills_cli()


@pytest.fixture(scope="module", autouse=True)
def _the_real_cli():
    """The install is tested with the real `skills` CLI: missing node or the CLI is a failure
    (tests/run_all.sh installs both), unless MBR_NO_NODE=1 says this machine has no Node."""
    if CLI and shutil.which("node"):
        return
    if os.environ.get("MBR_NO_NODE") == "1":
        pytest.skip("MBR_NO_NODE=1: no Node on this machine")
    pytest.fail("the skills CLI or node is missing: run `bash tests/run_all.sh`, which installs "
                "skills@1.5.18 into .tools/ (it needs npm), or set MBR_NO_NODE=1")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    work = tmp_path_factory.mktemp("install")
    source = work / "source"
    subprocess.run(["git", "clone", "-q", f"file://{ROOT}", str(source)], check=True,
                   capture_output=True)
    home, tmp, project = work / "home", work / "tmp", work / "project"
    for d in (home, tmp, project):
        d.mkdir()
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(tmp), "DISABLE_TELEMETRY": "1",
           "DO_NOT_TRACK": "1"}
    # keep npx's package cache where it was, so a cached CLI works without network
    env.setdefault("npm_config_cache", str(Path(os.environ.get("HOME", "~")).expanduser() / ".npm"))

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*CLI, *args], cwd=project, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=300)

    listing = cli("add", f"file://{source}", "--list")
    added = cli("add", f"file://{source}", "--skill", NAME, "-a", "claude-code", "-y")
    return {"project": project, "listing": listing, "added": added, "cli": cli, "source": source}


def test_the_cli_lists_the_skill_from_a_file_url(installed):
    r = installed["listing"]
    assert r.returncode == 0, r.stdout + r.stderr
    assert NAME in r.stdout + r.stderr


def test_the_cli_installs_the_skill_for_claude_code(installed):
    r = installed["added"]
    assert r.returncode == 0, r.stdout + r.stderr
    skill = installed["project"] / ".claude" / "skills" / NAME
    assert (skill / "SKILL.md").is_file()
    assert (skill / "SKILL.md").read_text() == (installed["source"] / "SKILL.md").read_text()
    assert (skill / "card.yaml").is_file() and (skill / "references" / "cli-reference.md").is_file()


def test_installed_scripts_keep_their_exec_bit(installed):
    scripts = installed["project"] / ".claude" / "skills" / NAME / "scripts"
    for name in SCRIPT_OF.values():
        assert os.access(scripts / name, os.X_OK), name


def test_installed_copy_runs_without_pip_install(installed):
    skill = installed["project"] / ".claude" / "skills" / NAME
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    helped = subprocess.run([sys.executable, "scripts/check_config.py", "--help"], cwd=skill, env=env,
                            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert helped.returncode == 0 and helped.stdout.startswith("usage:")
    checked = subprocess.run([sys.executable, "scripts/check_config.py", "--validator", "builtin"],
                             cwd=skill, env=env, capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, timeout=120)
    assert checked.returncode == 0, checked.stderr
    # the package it imported is the installed copy's, not this checkout's
    where = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, 'scripts'); "
                            "import mbridge_recompute; print(mbridge_recompute.__file__)"],
                           cwd=skill, env=env, capture_output=True, text=True, timeout=60)
    assert Path(where.stdout.strip()).resolve().is_relative_to(skill.resolve())


def test_only_committed_files_are_installed(installed):
    skill = installed["project"] / ".claude" / "skills" / NAME
    assert not (skill / ".venv").exists() and not (skill / ".tools").exists()
    assert not (skill / ".git").exists()
