"""``python -m rlm`` runs the CLI."""

from rlm.cli import main

main()
