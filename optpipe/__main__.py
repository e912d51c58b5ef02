"""``python -m optpipe``: the same command as ``optpipe``, for environments where the
console script is not on ``PATH`` (a venv not activated, ``pip install --user``)."""

import sys

from optpipe.cli import main

sys.exit(main())
