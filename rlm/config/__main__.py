"""``python -m rlm.config --reference``: print the configuration reference (Markdown)."""

import sys

from rlm.config.reference import main

raise SystemExit(main(sys.argv[1:]))
