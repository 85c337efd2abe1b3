"""Where the tools and tests read Megatron-LM and Megatron Bridge source at a tag or commit.

No package carries what they read there: Megatron-LM's megatron/post_training (ModelOpt's
argument group), main's transformer_config.py, every tag's cited lines for a release added
again, and Bridge's scripts/performance (its wheels ship no scripts/). Each is a bare git clone
of the GitHub repository; MLM_MIRROR / BRIDGE_MIRROR name another place. tests/run_all.sh
clones a missing one when GitHub can be reached, and the tests that need one fail naming it.
"""

from __future__ import annotations

import os
from pathlib import Path

MLM_URL = "https://github.com/NVIDIA/Megatron-LM"
BRIDGE_URL = "https://github.com/NVIDIA-NeMo/Megatron-Bridge"
MLM_MIRROR = Path(os.environ.get("MLM_MIRROR", "/work/.mirror/NVIDIA+Megatron-LM/repo"))
BRIDGE_MIRROR = Path(os.environ.get("BRIDGE_MIRROR", "/work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo"))

MIRRORS = {"Megatron-LM": (MLM_MIRROR, MLM_URL, "MLM_MIRROR"),
           "Megatron Bridge": (BRIDGE_MIRROR, BRIDGE_URL, "BRIDGE_MIRROR")}


def missing(name: str, *revs: str):
    """None when the mirror `name` is there and holds every revision in `revs`, else one line
    saying where it was looked for, what it lacks and how to make it."""
    import subprocess

    path, url, var = MIRRORS[name]
    if not ((path / "HEAD").is_file() and (path / "objects").is_dir()):
        return (f"needs the {name} git mirror at {path} (git clone --bare {url} {path}, or point "
                f"{var} at one)")
    for rev in revs:
        found = subprocess.run(["git", "--git-dir", str(path), "cat-file", "-e", f"{rev}^{{commit}}"],
                               capture_output=True)
        if found.returncode:
            return (f"the {name} git mirror at {path} has no {rev} (git --git-dir {path} fetch "
                    f"{url} '+refs/*:refs/*' --tags)")
    return None


if __name__ == "__main__":       # tests/run_all.sh: `python3 tests/tools/mirrors.py` lists them
    for path, url, var in MIRRORS.values():
        print(f"{var}\t{path}\t{url}")
