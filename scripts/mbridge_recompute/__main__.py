"""`python -m mbridge_recompute`: the tools, with nothing imported from the current directory.

`python -m` puts the current directory first on sys.path (as '' or its path), so a `yaml.py`, a
`megatron/` or a `torch/` there would be imported in place of the real one. This package is
already imported when this module runs, so the entry is dropped before anything else is.
"""

import os
import sys

if sys.path and os.path.abspath(sys.path[0] or os.curdir) == os.path.abspath(os.curdir):
    del sys.path[0]

from mbridge_recompute.cli import main  # noqa: E402

main()
